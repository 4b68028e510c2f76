"""`eagle3-hub` console script. Each subcommand lives in the module that does the work; that module
exposes `add_arguments(parser)` and `run(args)`."""

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-hub", description="EAGLE-3 speculative decoding for the Hugging Face stack")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    return importlib.import_module(args._module).run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
