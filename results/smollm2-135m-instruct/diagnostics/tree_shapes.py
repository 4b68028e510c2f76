"""Tree decoding with the shipped draft on the two sweep questions (first turns, 96 new tokens) for the tree
shapes given as depth/top_k/total_tokens; prints tokens/s, acceptance and the per-step time split. Session 5,
stage-3 draft, training paused, one run: 3/4/8 11.4, 3/4/7 12.2, 3/4/4 12.8, 2/4/4 12.1, 3/4/5 11.7,
3/4/11 12.4, 3/4/15 10.8 tok/s (within the run-to-run noise here).

    python results/smollm2-135m-instruct/diagnostics/tree_shapes.py 3/4/8 3/4/7 3/4/4
"""

import json
import sys
import time

import torch

from eagle3_hub import generate
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.targets import load_target

torch.set_num_threads(2)
target, tok = load_target(None, dtype=torch.float32)
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target).float()
questions = [json.loads(line) for line in open("results/smollm2-135m-instruct/sweep_questions.jsonl")]
prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                       tokenize=False), return_tensors="pt", add_special_tokens=False).input_ids
           for q in questions]
for shape in sys.argv[1:] or ["3/4/8"]:
    depth, top_k, total = map(int, shape.split("/"))
    new = steps = 0
    elapsed = draft_s = verify_s = other_s = 0.0
    accept = []
    for ids in prompts:
        generate(target, draft, ids, max_new_tokens=8, do_sample=False, depth=depth, tree_top_k=top_k, total_tokens=total)
        t0 = time.perf_counter()
        out = generate(target, draft, ids, max_new_tokens=96, do_sample=False, depth=depth, tree_top_k=top_k, total_tokens=total)
        elapsed += time.perf_counter() - t0
        st = out.stats
        new, steps = new + st.new_tokens, steps + st.steps
        draft_s, verify_s, other_s = draft_s + st.draft_time_s, verify_s + st.verify_time_s, other_s + st.overhead_time_s
        accept.append(st.mean_acceptance_length)
    print(f"{shape}: {new / elapsed:.1f} tok/s, acceptance {sum(accept) / len(accept):.2f}, per step ms: draft "
          f"{1e3 * draft_s / steps:.0f}, verify {1e3 * verify_s / steps:.0f}, other {1e3 * other_s / steps:.0f}", flush=True)
