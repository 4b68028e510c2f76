"""Speed-up and acceptance per turn from a ``bench.json`` of ``eagle3-hub bench`` (MT-bench has two turns).

    python results/smollm2-135m-instruct/diagnostics/per_turn.py results/smollm2-135m-instruct/bench_mt_both_turns/bench.json

Session 6, stage-5 draft, 10 MT-bench questions, tree 3/4/8 + lookup 10: turn 1 1.44x plain (acceptance 2.87),
turn 2 2.88x (7.26); all 1.93x (4.10).
"""

import collections
import json
import sys


def main(path: str) -> None:
    bench = json.load(open(path))
    total = collections.defaultdict(lambda: [0, 0.0, 0])  # (method, turn) -> new tokens, seconds, target forwards
    for r in bench["records"]:
        t = total[(r["method"], r["turn"])]
        t[0], t[1], t[2] = t[0] + r["new_tokens"], t[1] + r["time_s"], t[2] + r["target_forwards"]
    methods = sorted({m for m, _ in total} - {"plain"})
    for turn in sorted({turn for _, turn in total}):
        plain = total[("plain", turn)]
        base = plain[0] / plain[1]
        for m in methods:
            n, s, forwards = total[(m, turn)]
            print(f"turn {turn}: {m} {n / s:.1f} tok/s, plain {base:.1f} tok/s, {n / s / base:.2f}x, "
                  f"acceptance {n / max(forwards, 1):.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
