"""Tree decoding on a randomly initialised Llama target (library: ``eagle3_hub.benchmark.random_target``): a lossless
check and a timing run for a device where no trained target/draft pair can be downloaded.

    python -m eagle3_hub.commands.random_target --size 1b --device cuda --out random-target
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser):
    from ..benchmark.random_target import PHASES, SIZES

    parser.add_argument("--size", choices=sorted(SIZES), default="1b")
    parser.add_argument("--device", default="auto", help="auto (CUDA, else Apple MPS, else CPU), cpu, cuda, ...")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--out", default="random-target", help="folder for random_target.json and random_target.md")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset to run")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per timing measurement")


def run(args) -> int:
    from ..benchmark.random_target import run_random_target

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    run_random_target(args.size, args.device, args.new_tokens, args.out, phases, args.prompts)
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..cli import module_main

    return module_main(
        "python -m eagle3_hub.commands.random_target",
        "tree decoding on a random Llama target: lossless check and timings",
        add_arguments,
        run,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
