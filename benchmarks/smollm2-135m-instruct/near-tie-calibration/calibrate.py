"""The bf16 greedy check (``eagle3_hub.benchmark.near_ties``) on a bf16 run of ``eagle3-hub bench``: false banners,
what each rule would have flagged, and wrong tokens injected into tree decoding's outputs, caught or not.

    python calibrate.py OUT [bench arguments]      e.g. --num-questions 10 --methods plain,tree --dtype bfloat16

runs ``eagle3-hub bench --out OUT ...``, keeps the greedy records it checked (prompts included), and writes
``OUT/calibration.json``: per method the tokens over the float32 tolerance, how many of them the old rule (the
target teacher-forced) and the new one (plain decoding's own step on that prefix) flag, and for every tree turn three
injected tokens at a seeded position (the float32 worst, a random one, the float32 second best) and whether the
check flags each.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

from eagle3_hub.benchmark import bench, near_ties
from eagle3_hub.cli import main

out = Path(sys.argv[1])
captured = {}
original = bench.near_tie_check


def capture(records, target, dtype, *args, **kwargs):
    captured.update(records=records, target=target, dtype=dtype)
    return original(records, target, dtype, *args, **kwargs)


bench.near_tie_check = capture
code = main(["bench", "--out", str(out), *sys.argv[2:]])
records, target, dtype = captured["records"], captured["target"], captured["dtype"]
report = json.loads((out / "bench.json").read_text())["lossless"]
reference = near_ties.float32_reference(target)
rng = random.Random(0)
summary: dict = {"bench_exit": code, "banners": {m: not e["lossless"] for m, e in report.items()}, "methods": {}}
injected = {"worst": [0, 0], "random": [0, 0], "second": [0, 0]}  # [caught, tried]
for r in records:
    if r.mode != "greedy" or not r.output_ids:
        continue
    gaps, best = near_ties.argmax_gaps(reference, r.prompt_ids, r.output_ids)
    over32 = gaps > near_ties.tolerance(best, dtype)
    e = summary["methods"].setdefault(r.method, {"turns": 0, "tokens": 0, "over_float32": 0, "old_flags": 0,
                                                 "new_flags": 0, "plain_would_choose": 0, "over": []})
    e["turns"] += 1
    e["tokens"] += len(gaps)
    if over32.any():
        tf_gaps, tf_best = near_ties.argmax_gaps(target, r.prompt_ids, r.output_ids)
        step_gaps, step_best = near_ties.plain_step_gaps(target, r.prompt_ids, r.output_ids)
        old = near_ties.near_tie_flags(gaps, best, tf_gaps, tf_best, dtype)[3]
        new = near_ties.near_tie_flags(gaps, best, step_gaps, step_best, dtype)[3]
        for i in over32.nonzero().flatten().tolist():
            e["over_float32"] += 1
            e["old_flags"] += int(old[i])
            e["new_flags"] += int(new[i])
            e["plain_would_choose"] += int(step_gaps[i] == 0)
            e["over"].append({"question_id": r.question_id, "turn": r.turn, "token": i, "float32_gap": float(gaps[i]),
                              "tolerance": float(near_ties.tolerance(best[i:i + 1], dtype)[0]),
                              "teacher_forced_gap": float(tf_gaps[i]), "plain_step_gap": float(step_gaps[i])})
    if r.method != "tree":
        continue
    i = rng.randrange(len(r.output_ids))
    with torch.inference_mode():
        logits = reference(input_ids=torch.tensor([r.prompt_ids + r.output_ids[:i]])).logits[0, -1].float()
    ranked = logits.argsort(descending=True).tolist()
    for kind, token in (("worst", ranked[-1]), ("random", rng.randrange(logits.numel())), ("second", ranked[1])):
        wrong = r.output_ids[:i] + [token]
        g, b = near_ties.argmax_gaps(reference, r.prompt_ids, wrong)
        sg, sb = near_ties.plain_step_gaps(target, r.prompt_ids, wrong)
        injected[kind][0] += int(near_ties.near_tie_flags(g, b, sg, sb, dtype)[3][i])
        injected[kind][1] += 1
summary["injected_caught_of_tried"] = injected
(out / "calibration.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: v for k, v in summary.items() if k != "methods"}))
for m, e in summary["methods"].items():
    print(m, {k: v for k, v in e.items() if k != "over"})
