"""`eagle3-hub` console script: a thin layer over the library.

Each subcommand is a module of ``eagle3_hub.commands`` with ``add_arguments(parser)`` and ``run(args)``, imported
only when its subcommand runs (so ``eagle3-hub --help`` does not import torch). Bad input, a missing file or a
file that does not parse ends the command with ONE line on stderr, ``eagle3-hub <cmd>: error: <message>``, and exit
code 2; ``--debug`` (before the command) or ``EAGLE3_HUB_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "generate": (
        "eagle3_hub.commands.generate",
        "generate text with EAGLE-3 tree decoding (default: embedded target + reference draft)",
    ),
    "train": ("eagle3_hub.commands.train", "train an EAGLE-3 draft for a target (YAML recipe, every key a flag)"),
    "bench": ("eagle3_hub.commands.bench", "benchmark plain / prompt-lookup / assisted / tree decoding on question suites"),
    "card": ("eagle3_hub.commands.card", "write a draft's model card (README.md) from its config and bench results"),
    "push": ("eagle3_hub.commands.push", "upload a draft folder to the Hugging Face Hub"),
    "convert": (
        "eagle3_hub.commands.convert",
        "convert a draft between layouts (EAGLE, SpecForge, speculators, vLLM, SGLang, ours)",
    ),
    "demo": ("eagle3_hub.commands.demo", "run the Gradio side-by-side speed demo, or export it as a Space folder"),
}

DEBUG_ENV = "EAGLE3_HUB_DEBUG"


class CommandParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``eagle3-hub bench: error: argument --max-new-tokens: invalid int value: 'x'``
    (the usage is one ``--help`` away, and a screen of it hides the line that matters)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _module_name(name: str) -> str:
    return COMMANDS[name][0]


def top_level_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="eagle3-hub",
        description="EAGLE-3 speculative decoding for the Hugging Face stack",
        epilog=f"--debug (before COMMAND) or {DEBUG_ENV}=1: show tracebacks instead of one-line errors",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def command_parser(name: str):
    _, help_text = COMMANDS[name]
    module = importlib.import_module(_module_name(name))
    parser = CommandParser(prog=f"eagle3-hub {name}", description=help_text)
    module.add_arguments(parser)
    return module, parser


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input (a value, a path, a file that does not parse), not a bug: one line, exit 2."""
    from .extras import MissingExtra

    # FileNotFoundError, json's JSONDecodeError included; a missing extra says what to install
    errors: list[type[BaseException]] = [ValueError, OSError, MissingExtra]
    try:
        import yaml

        errors.append(yaml.YAMLError)
    except ImportError:
        pass
    return tuple(errors)


def one_line(error: BaseException) -> str:
    """The message of ``error`` on one line (YAML and Hub errors span several)."""
    text = " ".join(str(error).split())
    return text or type(error).__name__


def module_main(prog: str, description: str, add_arguments, run, argv: list[str] | None = None) -> int:
    """``python -m eagle3_hub.commands.X`` for a command off ``eagle3-hub``'s list: the same one-line errors, exit 2."""
    parser = CommandParser(prog=prog, description=description)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv)) or 0
    except user_errors() as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get(DEBUG_ENV))
    if argv and argv[0] == "--debug":
        debug, argv = True, argv[1:]
    if not argv or argv[0] not in COMMANDS:
        parser = top_level_parser()
        if not argv or argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        parser.error(f"unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})")
    name = argv[0]
    module, parser = command_parser(name)
    args, extra = parser.parse_known_args(argv[1:])
    if getattr(args, "accepts_overrides", False):
        args.overrides = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return module.run(args) or 0
    except user_errors() as e:
        if debug:
            raise
        print(f"eagle3-hub {name}: error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
