"""python -m eagle3_hub.training.ab: train each arm from the same init on the same data, seed by seed, and write the
comparison (ab.json, ab.md) and the `eagle3-hub bench` commands for each trained draft. See the package docstring."""

from __future__ import annotations

import argparse
import subprocess
import sys

from ..recipe import parse_overrides
from . import base_recipe, bench_commands, parse_arm, plan_runs, run_all, summarize, write_report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3_hub.training.ab", description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True, help="the recipe whose data, schedule and draft the arms share")
    ap.add_argument("--stage", type=int, default=None, help="which stage of the recipe (1-based; default: the last)")
    ap.add_argument(
        "--arm",
        action="append",
        required=True,
        help="a loss name (kl, lk, lk_log, lk_hybrid) or NAME=YAML recipe changes; repeat for each arm, "
        "the first is the baseline",
    )
    ap.add_argument("--seeds", default="0,1", help="comma-separated train.seed values (default 0,1)")
    ap.add_argument("--steps", type=int, required=True, help="training steps of every run")
    ap.add_argument("--out", required=True, help="folder for the runs, ab.json and ab.md")
    ap.add_argument(
        "--init",
        default=None,
        help="the draft every arm starts from (default: the recipe stage's "
        "output_dir, the shipped draft for the reference recipe; scratch: new)",
    )
    ap.add_argument("--eval-every", type=int, default=None, help="held-out evaluations during training (default: at the end)")
    ap.add_argument("--max-samples", type=int, default=None, help="at most N samples of each data source (a quick check)")
    ap.add_argument("--bench", action="store_true", help="also run the eagle3-hub bench commands (slow)")
    ap.add_argument("--bench-questions", type=int, default=None, help="first N questions of each bench suite")
    args, extra = ap.parse_known_args(argv)
    try:
        overrides = parse_overrides([a for a in extra if a != "--"])  # --section.key VALUE, applied to the recipe
        arms = [parse_arm(a) for a in args.arm]
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        base = base_recipe(args.recipe, args.stage, overrides)
        runs = plan_runs(
            base, arms, seeds, args.steps, args.out, init=args.init, max_samples=args.max_samples, eval_every=args.eval_every
        )
        results = run_all(runs, args.out)
    except (ValueError, KeyError, OSError) as e:
        print(f"eagle3_hub.training.ab: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
    summary = summarize(results)
    commands = bench_commands(results, args.out, args.bench_questions)
    json_path, md_path = write_report(summary, results, args.out, commands)
    print(md_path.read_text())
    print(f"[ab] {json_path}, {md_path}")
    if args.bench:
        for cmd in commands:
            print(f"[ab] {cmd}", flush=True)
            subprocess.run(cmd, shell=True, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
