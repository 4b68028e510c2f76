"""Two versions of the adaptive tree's controller against the same forward, interleaved in one process.

Each repetition runs the same forward (`same_forward_generate`), the controller of another checkout (`--baseline`:
its eagle3_hub/generation/tree/controller.py, or the checkout's folder for its whole tree decoding; left out: this
checkout's alone; a checkout's folder also runs its same forward, `baseline_same_forward`) and this checkout's, in
rotating order,
on one batch of MT-bench first turns, every row to 256 new tokens; it prints each run's seconds and the steps per
shape each controller chose, then the same forward's time over each controller's (per repetition, in total, and
their mean and standard deviation). `--no-tree` adds a controller that never drafts: tree decoding's own steps
without a tree against the same forward. Run from the checkout under test:

    PYTHONPATH=. python benchmarks/smollm2-135m-instruct/controller-ab/ab_controller.py \
        --baseline ../main/eagle3_hub/generation/tree/controller.py \
        --suite benchmarks/smollm2-135m-instruct/modes-and-batches/mt_bench_8.jsonl --batch-size 4 --temperature 1,0.7
"""

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path

import torch
from pair_and_batch import pair_and_batch

import eagle3_hub.generation.tree.decode as decode
from eagle3_hub.generation.tree import generate
from eagle3_hub.generation.tree.same_forward import same_forward_generate

p = argparse.ArgumentParser()
p.add_argument("--baseline", help="controller.py of the checkout to compare with, or the checkout's folder (its "
               "eagle3_hub/generation/tree whole); default: none")
p.add_argument("--suite", required=True)
p.add_argument("--batch-size", type=int, required=True)
p.add_argument("--temperature", default="1", help="comma-separated; 0 is greedy (sampling: top-p 0.9)")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--no-tree", action="store_true", help="also run a controller that chooses no tree at every step")
args = p.parse_args()

torch.set_num_threads(2)
controllers = {"this": decode.TreeController}
decoders = {}  # a method with tree decoding of its own (a baseline checkout's package)
same_forwards = {"same_forward": same_forward_generate}  # plain decoding through a checkout's verifier


class NoTree(decode.TreeController):
    def choose(self, rows, *args, **kwargs):
        self.chosen["none"] = self.chosen.get("none", 0) + 1
        return self.shape(0)


if args.no_tree:
    controllers["no_tree"] = NoTree


def load_module(name, path, **kwargs):
    """The module at ``path`` under ``name`` (a sibling of this checkout's, so its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location(name, path, **kwargs)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if args.baseline and Path(args.baseline).is_dir():
    package = Path(args.baseline) / "eagle3_hub" / "generation" / "tree"
    baseline = load_module("eagle3_hub.generation.tree_baseline", package / "__init__.py",
                           submodule_search_locations=[str(package)])
    controllers["baseline"] = sys.modules["eagle3_hub.generation.tree_baseline.decode"].TreeController
    decoders["baseline"] = baseline.generate
    # the checkout's own same forward too: what its sampling and verification cost without speculation
    same_forwards["baseline_same_forward"] = importlib.import_module(
        "eagle3_hub.generation.tree_baseline.same_forward").same_forward_generate
elif args.baseline:
    controllers["baseline"] = load_module("eagle3_hub.generation.tree.controller_baseline", args.baseline).TreeController

target, draft, enc = pair_and_batch(args.suite, args.batch_size)


def run(method, temperature):
    kw = dict(max_new_tokens=256, do_sample=temperature > 0, temperature=temperature or 1.0,
              top_p=0.9 if temperature else 1.0, eos_token_id=[])
    t = time.perf_counter()
    if method in same_forwards:
        same_forwards[method](target, enc.input_ids, attention_mask=enc.attention_mask, **kw)
        return time.perf_counter() - t, None
    if method not in decoders:
        decode.TreeController = controllers[method]
    out = decoders.get(method, generate)(target, draft, enc.input_ids, enc.attention_mask, adaptive=True, **kw)
    return time.perf_counter() - t, out.stats.tree_steps


for temperature in [float(t) for t in args.temperature.split(",")]:
    run("same_forward", temperature), run("this", temperature)  # warm-up
    order, times = ["same_forward", *controllers, *list(same_forwards)[1:]], {}
    for rep in range(args.reps):
        for method in order[rep % len(order) :] + order[: rep % len(order)]:
            seconds, steps = run(method, temperature)
            times.setdefault(method, []).append(seconds)
            print(f"T={temperature} rep {rep} {method}: {seconds:.2f} s {steps or ''}", flush=True)
    for method in order[1:]:
        ratios = torch.tensor([s / x for s, x in zip(times["same_forward"], times[method])])
        print(f"T={temperature} batch {args.batch_size} {method}: vs same forward {[round(r, 3) for r in ratios.tolist()]}, "
              f"in total {sum(times['same_forward']) / sum(times[method]):.3f}, mean {ratios.mean():.3f} "
              f"sd {ratios.std():.3f}", flush=True)
