"""Tree decoding (the adaptive tree, default settings) against the same forward in one process, in balanced order.

Run from the repository root with `PYTHONPATH=.`:

    python benchmarks/smollm2-135m-instruct/controller-ab/balanced.py BATCH TEMPERATURE ORDER

ORDER is a string of `s` (the same forward) and `t` (tree decoding), e.g. `tsst tsst tsst` (spaces ignored): each
method runs as often first as second, so a machine whose speed drifts during the run weighs on both alike. Prints
each run's seconds and steps per shape, then the same forward's total time over tree decoding's (above 1: tree
decoding is faster). Batches up to 8 take mt_bench_8's first questions, larger ones mt_bench_16's.
"""

import sys
import time

import torch

sys.path.insert(0, "benchmarks/smollm2-135m-instruct/controller-ab")
from pair_and_batch import pair_and_batch

from eagle3_hub.generation.tree import generate
from eagle3_hub.generation.tree.same_forward import same_forward_generate

torch.set_num_threads(2)
batch, temperature, order = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].replace(" ", "")
suite = "modes-and-batches/mt_bench_8.jsonl" if batch <= 8 else "adaptive-batches/mt_bench_16.jsonl"
target, draft, enc = pair_and_batch(f"benchmarks/smollm2-135m-instruct/{suite}", batch)
kw = dict(max_new_tokens=256, do_sample=temperature > 0, temperature=temperature or 1.0,
          top_p=0.9 if temperature else 1.0, eos_token_id=[])


def same_forward():
    same_forward_generate(target, enc.input_ids, attention_mask=enc.attention_mask, **kw)
    return ""


def tree():
    return generate(target, draft, enc.input_ids, enc.attention_mask, adaptive=True, **kw).stats.tree_steps


methods = {"s": same_forward, "t": tree}
same_forward(), tree()  # warm-up
total = {"s": 0.0, "t": 0.0}
for c in order:
    start = time.perf_counter()
    steps = methods[c]()
    seconds = time.perf_counter() - start
    total[c] += seconds
    print(f"{methods[c].__name__}: {seconds:.2f} s {steps}", flush=True)
print(f"batch {batch} T={temperature}: same forward / tree decoding {total['s'] / total['t']:.3f}")
