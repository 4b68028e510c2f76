"""Answering throughput of the target by ``gen_batch_size`` (the data stage's batched greedy ``generate``): the first
96 stage-4 prompts, 128 new tokens, float32, 2 threads. Session 6: 48 -> 102 tok/s, 96 -> 119 tok/s (rerun of 96: 115).

    python results/smollm2-135m-instruct/diagnostics/gen_batch_size.py 48 96
"""

import json
import sys
import time
from pathlib import Path

import torch

from eagle3_hub.targets import load_target
from eagle3_hub.training.data import _generate_batch

DATA = Path(__file__).resolve().parents[1] / "data" / "regenerated_steered_seed3.jsonl"

torch.set_num_threads(2)
target, tok = load_target(None, dtype=torch.float32)
convs = [[json.loads(line)["messages"][0]] for line in open(DATA)][:96]
for batch in [int(b) for b in sys.argv[1:] or ["48", "96"]]:
    t0 = time.perf_counter()
    answers = []
    for s in range(0, len(convs), batch):
        answers += _generate_batch(target, tok, convs[s : s + batch], 128, 0.0)
    seconds = time.perf_counter() - t0
    tokens = sum(len(tok(a).input_ids) for a in answers)
    print(f"gen_batch_size {batch}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.1f} tok/s", flush=True)
