"""What a finished row costs the target's cache: SmolLM2-135M's key/value buffer (30 layers, 3 key/value heads of
64, bfloat16) for a batch of ``rows`` after 460 of its capacity's 500 slots, one row finishing, taken out either by
a copy of the whole buffer (``index_select``: tree decoding before) or by ``TreeKVCache.select_rows`` (the last row
moves into the finished row's place within the buffer). Prints the median and the fastest of ``--reps`` timings of
each, interleaved. Run from the repository root:

    PYTHONPATH=. python benchmarks/smollm2-135m-instruct/row-drops/row_drops.py --rows 2,4,8,16
"""

import argparse
import statistics
import time

import torch

from eagle3_hub.generation.tree import TreeKVCache

p = argparse.ArgumentParser()
p.add_argument("--rows", default="2,4,8,16", help="comma-separated batch sizes")
p.add_argument("--reps", type=int, default=15)
p.add_argument("--finished", type=int, default=0, help="the row that finishes (its index in the batch)")
args = p.parse_args()
torch.set_num_threads(2)

LAYERS, HEADS, DIM, CAPACITY, WRITTEN = 30, 3, 64, 500, 460


def full_cache(rows: int) -> TreeKVCache:
    cache = TreeKVCache(LAYERS, CAPACITY)
    kv = torch.randn(rows, HEADS, WRITTEN, DIM, dtype=torch.bfloat16)
    cache.load([(kv, kv)] * LAYERS)
    return cache


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


print("| rows | copy of the buffer, ms (median / fastest) | rows moved within it, ms (median / fastest) |")
print("|---|---|---|")
for rows in [int(r) for r in args.rows.split(",")]:
    keep = [r for r in range(rows) if r != args.finished]
    moved = list(range(rows - 1))  # the last row takes the finished row's place
    if args.finished < rows - 1:
        moved[args.finished] = rows - 1
    copy, move = [], []
    for _ in range(args.reps):
        cache = full_cache(rows)
        copy.append(timed(lambda: setattr(cache, "buffer", cache.buffer.index_select(2, torch.tensor(keep)))))
        cache = full_cache(rows)
        move.append(timed(lambda: cache.select_rows(torch.tensor(moved))))
    ms = [1000 * x for x in copy], [1000 * x for x in move]
    print(f"| {rows} | {statistics.median(ms[0]):.1f} / {min(ms[0]):.1f} | {statistics.median(ms[1]):.1f} / {min(ms[1]):.1f} |")
