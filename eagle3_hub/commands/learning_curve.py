"""The learning curve of a training run or chain of stages (library: ``eagle3_hub.training.curve``): held-out step-1
accuracy and expected acceptance length (greedy, T=0.7, T=1) against training tokens, log axis.

    python -m eagle3_hub.commands.learning_curve runs/draft [runs/draft-stage2 ...] --out curve.png
    python -m eagle3_hub.commands.learning_curve runs/scratch --chain eagle3_hub/reference_draft/NAME --fit 2e7
    python -m eagle3_hub.commands.learning_curve runs/scratch --label plain --arm "two layers=runs/two-layers"
"""

from __future__ import annotations

import argparse
import json
import math
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
    parser.add_argument(
        "--chain",
        action="append",
        default=[],
        metavar="DRAFT_DIR",
        help="a draft folder written by `eagle3-hub train`: the chain of stages that made it (its training_metrics.json), "
        "dashed beside the runs, placed with --tokens-per-step (default: the first run's tokens per step)",
    )
    parser.add_argument(
        "--fit",
        type=float,
        default=None,
        metavar="TOKENS",
        help="fit each acceptance of the runs' last 4 evaluations to a + b * log10(tokens) and extrapolate it to TOKENS",
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="LABEL=RUN",
        help="another training run to compare with the runs (a training choice, an A/B arm): drawn in its own colour, "
        "tabled at the steps all were evaluated at",
    )
    parser.add_argument("--label", default="", help="the runs' name in the legend (with --chain or --arm)")
    parser.add_argument("--title", default="")


def run(args) -> int:
    from ..training.curve import arms_table, chain_points, curve_points, curve_table, log_fit, plot_arms, plot_curve

    points = curve_points(args.runs, args.tokens_per_step)
    if args.arm:
        if args.chain or args.fit:
            raise ValueError("--arm draws runs side by side: leave --chain and --fit to a plot of one run")
        bad = [a for a in args.arm if "=" not in a]
        if bad:
            raise ValueError(f"--arm {bad[0]!r}: write LABEL=RUN, e.g. --arm 'two layers=runs/arm-two-layers'")
        arms = {args.label or "baseline": points}
        arms.update({label: curve_points([run], args.tokens_per_step) for label, run in (a.split("=", 1) for a in args.arm)})
        out = plot_arms(arms, args.out, args.title)
        print(arms_table(arms))
        Path(out).with_suffix(".json").write_text(json.dumps({"arms": arms}, indent=1) + "\n")
        print(f"[curve] {out}")
        return 0
    per_step = args.tokens_per_step
    if args.chain and per_step is None:
        first = [p for p in points if p["run"] == str(args.runs[0]) and p["step"] > 0]
        if not first:
            raise ValueError(
                f"{args.runs[0]} has no evaluation after step 0 to take tokens per step from: pass --tokens-per-step"
            )
        per_step = first[-1]["tokens"] / first[-1]["step"]
    chains = {Path(c).name: chain_points(c, per_step) for c in args.chain}
    out = plot_curve(points, args.out, args.title, others=chains, label=args.label or ("runs" if chains else ""))
    result: dict = {"points": points, "chains": chains, "chain_tokens_per_step": per_step if chains else None}
    print(curve_table(points))
    for name, chain in chains.items():
        print(f"\n{name} (tokens: steps x {per_step:.0f})\n" + curve_table(chain))
    if args.fit:
        fits = {}
        for key in ("step1_accuracy", "greedy", "T=0.7", "T=1"):
            if sum(p[key] is not None for p in points) >= 2:
                a, b = log_fit(points, key)
                fits[key] = {"a": a, "per_tenfold": b, "at": args.fit, "value": a + b * math.log10(args.fit)}
                print(f"[fit] {key}: {b:+.3f} per tenfold of tokens; at {args.fit:.3g} tokens {fits[key]['value']:.3f}")
        result["fit"] = fits
    Path(out).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
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
