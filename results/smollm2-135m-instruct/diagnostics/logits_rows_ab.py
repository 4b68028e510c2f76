"""A/B of LOGITS_ROWS_MULTIPLE (1 = the logits of exactly the slots with children, 4 = rounded up to a multiple of
4 rows) in tree decoding with the shipped draft: MT-bench questions 4-6, first turns, 96 new tokens, two rounds
interleaved; prints the verification time per step and checks the tokens are the same. Session 5, stage-3 draft
(training paused): 121.3 / 120.3 ms per step with 1, 112.0 / 106.5 with 4; rerun with the stage-4 draft: 107.6 /
108.8 with 1, 104.4 / 112.8 with 4 (no difference). Same tokens in both.

    python results/smollm2-135m-instruct/diagnostics/logits_rows_ab.py [MT_BENCH_FILE]
"""

import json
import sys

import torch

import eagle3_hub.generation.tree_decoding as tree_decoding
from eagle3_hub import generate
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.targets import load_target

torch.set_num_threads(2)
target, tok = load_target(None, dtype=torch.float32)
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target).float()
path = sys.argv[1] if len(sys.argv) > 1 else "../shared/benchmarks/mt_bench.jsonl"
questions = [json.loads(line) for line in open(path)][3:6]
prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                       tokenize=False), return_tensors="pt", add_special_tokens=False).input_ids
           for q in questions]
generate(target, draft, prompts[0], max_new_tokens=8, do_sample=False)  # warm-up
outputs = {}
for rnd in range(2):
    for multiple in (1, 4):
        tree_decoding.LOGITS_ROWS_MULTIPLE = multiple
        steps = verify = 0
        outputs[multiple] = []
        for ids in prompts:
            out = generate(target, draft, ids, max_new_tokens=96, do_sample=False)
            steps += out.stats.steps
            verify += out.stats.verify_time_s
            outputs[multiple].append(out.sequences)
        print(f"round {rnd}, rows multiple {multiple}: verify {1e3 * verify / steps:.1f} ms/step", flush=True)
print("same tokens:", all(torch.equal(a, b) for a, b in zip(outputs[1], outputs[4])))
