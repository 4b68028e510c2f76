"""Tree decoding with its controller forced to choose no tree at every step, against the same forward, in turn in
one process: the same target work, so the spread of each method's times is this machine's run-to-run spread.

Run from the repository root with `PYTHONPATH=.`:

    python benchmarks/smollm2-135m-instruct/controller-ab/forced_none.py BATCH TEMPERATURE ORDER

ORDER as in balanced.py (`s`: the same forward, `t`: tree decoding forced to no tree). Prints each run's seconds,
then each method's fastest and slowest run.
"""

import sys
import time

import torch

sys.path.insert(0, "benchmarks/smollm2-135m-instruct/controller-ab")
from pair_and_batch import pair_and_batch

from eagle3_hub.generation.tree import controller, generate
from eagle3_hub.generation.tree.same_forward import same_forward_generate

torch.set_num_threads(2)
batch, temperature, order = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].replace(" ", "")
target, draft, enc = pair_and_batch("benchmarks/smollm2-135m-instruct/modes-and-batches/mt_bench_8.jsonl", batch)
kw = dict(max_new_tokens=256, do_sample=temperature > 0, temperature=temperature or 1.0,
          top_p=0.9 if temperature else 1.0, eos_token_id=[])
controller.TreeController.choose = lambda self, rows, *args, **kwargs: self.shape(0)
controller.TreeController.observe = lambda self, *args, **kwargs: None


def same_forward():
    same_forward_generate(target, enc.input_ids, attention_mask=enc.attention_mask, **kw)


def tree():
    generate(target, draft, enc.input_ids, enc.attention_mask, adaptive=True, **kw)


methods = {"s": same_forward, "t": tree}
same_forward(), tree()  # warm-up
times = {"s": [], "t": []}
for c in order:
    start = time.perf_counter()
    methods[c]()
    times[c].append(time.perf_counter() - start)
    print(f"{methods[c].__name__}: {times[c][-1]:.2f} s", flush=True)
for c, ts in times.items():
    print(f"batch {batch} T={temperature} {methods[c].__name__}: {min(ts):.2f}-{max(ts):.2f} s over {len(ts)} runs")
