"""Speed and acceptance per MT-bench category from a bench.json of ``eagle3-hub bench`` (plain and tree runs).

    python results/smollm2-135m-instruct/diagnostics/per_category.py results/smollm2-135m-instruct/bench_mt_first_turns_80/bench.json [METHOD]

METHOD: the tree method's label in bench.json (default ``tree``; e.g. ``tree[min_node_prob=0.0]`` for one of several
settings).
"""

import collections
import json
import sys


def main(path: str, tree: str = "tree"):
    bench = json.load(open(path))
    agg = collections.defaultdict(lambda: [0, 0.0, 0])  # (category, method) -> new tokens, seconds, target forwards
    for rec in bench["records"]:
        a = agg[(rec["category"], rec["method"])]
        a[0], a[1], a[2] = a[0] + rec["new_tokens"], a[1] + rec["time_s"], a[2] + rec["target_forwards"]
    print("| category | plain tok/s | tree tok/s | speed-up | acceptance |\n|---|---|---|---|---|")
    for cat in sorted({c for c, _ in agg}):
        (pn, ps, _), (tn, ts, tf) = agg[(cat, "plain")], agg[(cat, tree)]
        print(f"| {cat} | {pn / ps:.1f} | {tn / ts:.1f} | {(tn / ts) / (pn / ps):.2f}x | {tn / tf:.2f} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
