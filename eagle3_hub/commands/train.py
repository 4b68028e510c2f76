"""`eagle3-hub train`: target + data -> a trained EAGLE-3 draft folder.

eagle3-hub train --config recipes/smollm2-135m-instruct.yaml [--train.lr 3e-4 ...] [--resume | --overwrite]
                 [--from-stage N] [--data-only]
eagle3-hub train --show-recipe-schema     # every recipe key: its type, default and meaning
accelerate launch --config_file recipes/accelerate/ddp.yaml -m eagle3_hub.commands.train --config ...
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML recipe (see recipes/); any key can also be given as --section.key VALUE")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from this recipe's latest checkpoint in work_dir; skip the stages that finished",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start again in a work_dir that holds checkpoints: the run there moves to <work_dir>/previous-<time>",
    )
    parser.add_argument(
        "--from-stage",
        type=int,
        default=1,
        metavar="N",
        help="start at stage N of the recipe, continuing the draft its stage N - 1 wrote to output_dir "
        "(e.g. the shipped draft of a recipe that gained a stage)",
    )
    parser.add_argument(
        "--data-only",
        action="store_true",
        help="prepare the data (the target's answers, tokenised, with generation_report.json) in "
        "work_dir/data and stop: train later, or elsewhere, from the same work_dir",
    )
    parser.add_argument(
        "--show-recipe-schema",
        action="store_true",
        help="print every recipe key (its type, default and meaning) as a recipe of the defaults, and stop",
    )
    parser.set_defaults(accepts_overrides=True, overrides=[])  # --section.key VALUE pairs, e.g. --train.lr 3e-4


def run(args) -> int:
    """Bad input raises (``eagle3_hub.cli`` prints it as one line, exit 2); a failed upload after training exits 1.
    After each stage that trained: its model card, and the upload when the recipe names ``push_to_hub``."""
    if args.show_recipe_schema:  # reads the schema only: no torch, no model
        from ..training.recipe_docs import schema_text

        print(schema_text(), end="")
        return 0
    from ..hub import HubPushError
    from ..publish import after_training
    from ..training.recipe import parse_overrides
    from ..training.stages import train_recipe

    overrides = parse_overrides([a for a in (args.overrides or []) if a != "--"])
    try:
        train_recipe(
            args.config,
            overrides,
            resume=args.resume,
            overwrite=args.overwrite,
            from_stage=args.from_stage,
            data_only=args.data_only,
            after_stage=after_training,
        )
    except KeyError as e:  # a recipe key that is missing: bad input like any other
        raise ValueError(e.args[0] if e.args else str(e)) from None
    except HubPushError as e:
        if isinstance(e, ValueError):  # not a draft folder: bad input
            raise
        out = getattr(e, "output_dir", "the output folder")
        print(
            f"eagle3-hub train: the draft is saved in {out} but the upload failed: {e}\n"
            f"Retry with: eagle3-hub push {out} {getattr(e, 'repo_id', None) or 'REPO_ID'}",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m eagle3_hub.commands.train`` (what ``accelerate launch -m`` runs on every process)."""
    from ..cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
