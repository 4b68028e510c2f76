"""The sampling call (`Nucleus`) of this checkout against another's, on recorded logits.

Records SmolLM2's raw next-token scores over 96 steps of the same forward at batch 16 (bf16, top-p 0.9) at T=1
and T=0.7, then times both versions' calls on the first 1, 2, 4, 8 and 16 rows of every recorded step (two
passes, the faster kept), in milliseconds per call. Run from the checkout under test:

    PYTHONPATH=. python benchmarks/smollm2-135m-instruct/controller-ab/nucleus_calls.py --baseline ../base
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

from eagle3_hub.generation.tree import acceptance
from eagle3_hub.generation.tree.nucleus import Nucleus
from eagle3_hub.generation.tree.same_forward import same_forward_generate
from eagle3_hub.targets import load_target

p = argparse.ArgumentParser()
p.add_argument("--baseline", required=True, help="the other checkout's folder")
args = p.parse_args()
spec = importlib.util.spec_from_file_location(
    "nucleus_baseline", Path(args.baseline) / "eagle3_hub" / "generation" / "tree" / "nucleus.py")
baseline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(baseline)

torch.set_num_threads(2)
target, tok = load_target(None, dtype="bfloat16")
suite = Path(__file__).parents[1] / "adaptive-batches" / "mt_bench_16.jsonl"
texts = [tok.apply_chat_template([{"role": "user", "content": json.loads(line)["turns"][0]}], tokenize=False,
                                 add_generation_prompt=True) for line in open(suite)]
tok.padding_side = "left"
enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
recorded = []
next_token = acceptance.Processing.next_token


def recording(self, raw, prefixes):
    recorded.append(raw.clone())
    return next_token(self, raw, prefixes)


acceptance.Processing.next_token = recording
for temperature in (1.0, 0.7):
    recorded.clear()
    same_forward_generate(target, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=96,
                          do_sample=True, temperature=temperature, top_p=0.9, eos_token_id=[])
    versions = {"baseline": baseline.Nucleus(temperature, 0, 0.9), "this": Nucleus(temperature, 0, 0.9)}
    for b in (1, 2, 4, 8, 16):
        ms = {}
        for _ in range(2):
            for name, nucleus in versions.items():
                t = time.perf_counter()
                for scores in recorded:
                    nucleus(scores[:b])
                ms[name] = min(ms.get(name, float("inf")), 1000 * (time.perf_counter() - t) / len(recorded))
        print(f"T={temperature} batch {b}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
