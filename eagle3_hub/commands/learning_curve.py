"""The learning curve of a training run or chain of stages (library: ``eagle3_hub.training.curve``): held-out step-1
accuracy and expected acceptance length (greedy, T=0.7, T=1) against training tokens, log axis.

    python -m eagle3_hub.commands.learning_curve runs/draft [runs/draft-stage2 ...] --out curve.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("runs", nargs="+", help="work_dirs (or their eval_metrics.json) in training order")
    parser.add_argument("--out", default="learning_curve.png", help="the plot (PNG); the points go next to it as .json")
    parser.add_argument(
        "--tokens-per-step",
        type=float,
        default=None,
        help="for runs whose evaluations do not record their tokens: tokens per optimizer step",
    )
    parser.add_argument("--title", default="")


def run(args) -> int:
    from ..training.curve import curve_points, curve_table, plot_curve

    points = curve_points(args.runs, args.tokens_per_step)
    out = plot_curve(points, args.out, args.title)
    Path(out).with_suffix(".json").write_text(json.dumps(points, indent=1) + "\n")
    print(curve_table(points))
    print(f"[curve] {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..cli import module_main

    return module_main(
        "python -m eagle3_hub.commands.learning_curve",
        "held-out accuracy and acceptance against training tokens",
        add_arguments,
        run,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
