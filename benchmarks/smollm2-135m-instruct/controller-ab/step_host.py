"""Where a step of tree decoding goes, measured inside the run: the adaptive tree (default settings) at one batch
size and temperature, with timers around the target forward, the sampling, and the controller's choice and update.

Run from the repository root with `PYTHONPATH=.` (or `PYTHONPATH=<another checkout>` to time that one):

    python benchmarks/smollm2-135m-instruct/controller-ab/step_host.py BATCH TEMPERATURE [REPS]

Prints milliseconds per step of each timed part and of the whole run, over REPS runs (default 3) after a warm-up.
Inside a run the host's Python work costs several times what it costs timed alone (`choose_cost.py`): the target's
forward leaves the caches cold and its OpenMP threads spinning.
"""

import collections
import functools
import sys
import time

import torch

sys.path.insert(0, "benchmarks/smollm2-135m-instruct/controller-ab")
from pair_and_batch import pair_and_batch

from eagle3_hub.generation.tree import acceptance, controller, generate, verification

torch.set_num_threads(2)
batch, temperature = int(sys.argv[1]), float(sys.argv[2])
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
suite = "modes-and-batches/mt_bench_8.jsonl" if batch <= 8 else "adaptive-batches/mt_bench_16.jsonl"
target, draft, enc = pair_and_batch(f"benchmarks/smollm2-135m-instruct/{suite}", batch)
kw = dict(max_new_tokens=256, do_sample=temperature > 0, temperature=temperature or 1.0,
          top_p=0.9 if temperature else 1.0, eos_token_id=[])
spent = collections.Counter()


def timed(cls, name):
    f = getattr(cls, name)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = f(*args, **kwargs)
        spent[f"{cls.__name__}.{name}"] += time.perf_counter() - start
        return out

    setattr(cls, name, wrapper)


for cls, name in [(verification.Verifier, "verify"), (acceptance.Processing, "next_token"),
                  (controller.TreeController, "choose"), (controller.TreeController, "observe")]:
    timed(cls, name)
generate(target, draft, enc.input_ids, enc.attention_mask, adaptive=True, **kw)  # warm-up
spent.clear()
steps, start = 0, time.perf_counter()
for _ in range(reps):
    out = generate(target, draft, enc.input_ids, enc.attention_mask, adaptive=True, **kw)
    steps += out.stats.steps
total = time.perf_counter() - start
print(f"batch {batch} T={temperature}, {reps} runs, shapes of the last {out.stats.tree_steps}")
for part, seconds in spent.most_common():
    print(f"{part:30s} {seconds / steps * 1e3:7.3f} ms a step")
print(f"{'whole run':30s} {total / steps * 1e3:7.3f} ms a step")
choice = spent["TreeController.choose"] + spent["TreeController.observe"]
print(f"choice and update: {choice / total:.1%} of the run")
