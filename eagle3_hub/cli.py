"""`eagle3-hub` console script. Each subcommand lives in the module that does the work; that module
exposes `add_arguments(parser)` and `run(args)` and is imported only when its subcommand runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "generate": ("eagle3_hub.generation.cli", "generate text with EAGLE-3 tree decoding (default: embedded target + reference draft)"),
    "train": ("eagle3_hub.training.train", "train an EAGLE-3 draft for a target (YAML recipe, every key a flag)"),
    "bench": ("eagle3_hub.benchmark.bench", "benchmark plain / prompt-lookup / assisted / tree decoding on question suites"),
    "card": ("eagle3_hub.card", "write a draft's model card (README.md) from its config and bench results"),
    "push": ("eagle3_hub.hub", "upload a draft folder to the Hugging Face Hub"),
    "convert": ("eagle3_hub.formats", "convert a draft between layouts (EAGLE, SpecForge, speculators, vLLM, SGLang, ours)"),
    "demo": ("eagle3_hub.demo", "run the Gradio side-by-side speed demo"),
}


def top_level_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-hub", description="EAGLE-3 speculative decoding for the Hugging Face stack")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def command_parser(name: str):
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"eagle3-hub {name}", description=help_text)
    module.add_arguments(parser)
    return module, parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        parser = top_level_parser()
        if not argv or argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        parser.error(f"unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})")
    module, parser = command_parser(argv[0])
    args, extra = parser.parse_known_args(argv[1:])
    if getattr(args, "accepts_overrides", False):
        args.overrides = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return module.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
