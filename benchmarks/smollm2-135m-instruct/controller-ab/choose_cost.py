"""The adaptive tree's per-step host cost: ``TreeController.choose`` and ``observe`` timed alone, 255 steps per batch
size, with the machine's cost table for SmolLM2 and its draft in bf16 (the sampling tree of each batch size) and a
batch whose rows never accept (so every step chooses no tree, as in the cells below 1.0x). Run from the repository
root with ``PYTHONPATH=.``: ``python benchmarks/smollm2-135m-instruct/controller-ab/choose_cost.py``."""

import sys
import time

import torch

sys.path.insert(0, "benchmarks/smollm2-135m-instruct/controller-ab")
from pair_and_batch import pair_and_batch

from eagle3_hub.generation.tree.config import TreeConfig
from eagle3_hub.generation.tree.controller import TreeController
from eagle3_hub.generation.tree.costs import step_costs

torch.set_num_threads(2)
target, draft, _ = pair_and_batch("benchmarks/smollm2-135m-instruct/adaptive-batches/mt_bench_16.jsonl", 16)
for b in (4, 8, 16):
    config = TreeConfig().resolve(torch.device("cpu"), torch.bfloat16, True, draft.config.draft_vocab_size, b)
    costs = step_costs(target, draft, config, b, config.total_tokens + config.lookup_tokens + 1)
    controller = TreeController(config, costs, b)
    rows, left, steps, chose, behind = list(range(b)), [200] * b, 255, 0.0, False
    start = time.perf_counter()
    for i in range(steps):  # as the decoder calls them: `behind` after a step without a tree
        t = time.perf_counter()
        shape = controller.choose(rows, 0, remaining=left, context=100 + i, behind=behind)
        chose += time.perf_counter() - t
        controller.observe(rows, shape, [0] * b, 0.02, behind=behind, context=100 + i)
        behind = shape.depth == 0
    total = (time.perf_counter() - start) / steps
    print(f"batch {b}: choose {chose / steps * 1e3:.3f} ms, choose + observe {total * 1e3:.3f} ms a step, "
          f"shapes {controller.chosen}")
