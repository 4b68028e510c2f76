"""Each step of one adaptive tree-decoding run beside the controller's price for it: the shape chosen, the rows still
decoding, the tokens committed, the measured seconds and the seconds the controller expected (the cost table at the
step's context times the kind's factor), and what it expected of no tree and of a one-level tree. Prints them per
(shape, rows) and the batch's tail (the steps after its first row finished) against the full batch's pace without a
tree. The same forward runs first, once for warm-up and once timed. Run from the checkout under test:

    PYTHONPATH=. python benchmarks/smollm2-135m-instruct/controller-ab/step_times.py \
        --suite benchmarks/smollm2-135m-instruct/adaptive-batches/mt_bench_16.jsonl --batch-size 16 --temperature 0.7
"""

import argparse
import json
import time
from collections import defaultdict

import torch
from pair_and_batch import pair_and_batch

import eagle3_hub.generation.tree.decode as decode
from eagle3_hub.generation.tree import generate
from eagle3_hub.generation.tree.same_forward import same_forward_generate

p = argparse.ArgumentParser()
p.add_argument("--suite", required=True)
p.add_argument("--batch-size", type=int, required=True)
p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy (sampling: top-p 0.9)")
p.add_argument("--log", help="also write every step as JSON lines here")
args = p.parse_args()

torch.set_num_threads(2)
target, draft, enc = pair_and_batch(args.suite, args.batch_size)
steps = []


class Logged(decode.TreeController):
    def expected(self, rows, depth, lookup, behind, context):
        """The controller's price of a step: a factor on the table at the step's context, or (a checkout before
        either) the table at its own context plus an added residual."""
        if hasattr(self, "factor_of"):
            return self.step_seconds(rows, depth, lookup, context) * self.factor_of(depth, lookup, behind)
        return self.step_seconds(rows, depth, lookup) + self.residual_of(depth, lookup, behind)

    def choose(self, rows, lookup=0, max_depth=None, proposed=None, behind=False, **kwargs):
        shape = super().choose(rows, lookup, max_depth, proposed, behind, **kwargs)
        context = kwargs.get("context")
        self._step = dict(rows=len(rows), shape=shape.label, behind=behind, context=context,
                          expected=self.expected(len(rows), shape.depth, shape.lookup, behind, context),
                          expected_none=self.expected(len(rows), 0, 0, behind, context),
                          expected_one_level=self.expected(len(rows), 1, 0, behind, context),
                          start=time.perf_counter())
        return shape

    def observe(self, rows, shape, accepted, *args, **kwargs):
        step = self._step
        step["seconds"] = time.perf_counter() - step.pop("start")
        step["tokens"] = len(rows) + sum(accepted)
        steps.append(step)
        return super().observe(rows, shape, accepted, *args, **kwargs)


decode.TreeController = Logged
t = args.temperature
kw = dict(max_new_tokens=256, do_sample=t > 0, temperature=t or 1.0, top_p=0.9 if t else 1.0, eos_token_id=[])
same_forward_generate(target, enc.input_ids, attention_mask=enc.attention_mask, **kw)  # warm-up
t0 = time.perf_counter()
same_forward_generate(target, enc.input_ids, attention_mask=enc.attention_mask, **kw)
plain = time.perf_counter() - t0
t0 = time.perf_counter()
out = generate(target, draft, enc.input_ids, enc.attention_mask, adaptive=True, **kw)
tree = time.perf_counter() - t0
print(f"T={t} batch {args.batch_size}: same forward {plain:.2f} s, adaptive tree {tree:.2f} s "
      f"({plain / tree:.3f}x), steps {out.stats.tree_steps}")

groups = defaultdict(list)
for s in steps:
    groups[(s["rows"], s["shape"])].append(s)
print("| rows | shape | steps | tokens per step | ms measured | ms expected | ms expected without a tree "
      "| ms expected with one level |")
print("|---|---|---|---|---|---|---|---|")
for (rows, shape), group in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
    n = len(group)
    print(f"| {rows} | {shape} | {n} | {sum(s['tokens'] for s in group) / n:.2f} "
          f"| {1e3 * sum(s['seconds'] for s in group) / n:.1f} | {1e3 * sum(s['expected'] for s in group) / n:.1f} "
          f"| {1e3 * sum(s['expected_none'] for s in group) / n:.1f} "
          f"| {1e3 * sum(s['expected_one_level'] for s in group) / n:.1f} |")
full = [s for s in steps if s["rows"] == args.batch_size and s["shape"] == "none"]
pace = sum(s["seconds"] for s in full) / max(sum(s["tokens"] for s in full), 1)  # seconds per token, full batch
for name, part in (("full batch", [s for s in steps if s["rows"] == args.batch_size]),
                   ("tail", [s for s in steps if s["rows"] < args.batch_size])):
    sec, tokens = sum(s["seconds"] for s in part), sum(s["tokens"] for s in part)
    print(f"{name}: {len(part)} steps, {sec:.2f} s for {tokens} tokens; at the full batch's pace without a tree "
          f"{tokens * pace:.2f} s")
if args.log:
    with open(args.log, "w") as f:
        for s in steps:
            f.write(json.dumps(s) + "\n")
