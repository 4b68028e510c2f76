"""``eagle3-hub card``: write a draft's model card (README.md) from its config and bench results
(library: ``eagle3_hub.card.write_model_card``; ``eagle3_hub.publish.write_card`` reads the training metrics)."""

from __future__ import annotations


def add_arguments(parser):
    parser.add_argument("draft", help="folder of a saved draft; README.md is written there")
    parser.add_argument("--bench", default=None, help="bench.json of `eagle3-hub bench` (default: DRAFT/bench.json)")
    parser.add_argument(
        "--training-info",
        default=None,
        help="JSON of the training run (default: DRAFT/training_info.json, then DRAFT/training_metrics.json)",
    )
    parser.add_argument("--base-model", default=None, help="the target: Hub id, folder or smollm2-135m-instruct")
    parser.add_argument("--repo-id", default=None, help="the Hub repository the draft goes to (for the usage snippets)")
    parser.add_argument("--license", default=None, help="default: the target's license")
    parser.add_argument("--dataset", action="append", default=None, help="training dataset Hub id (repeatable)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a README.md that eagle3-hub did not write (without it, such a file is refused)",
    )


def run(args) -> int:
    from ..publish import write_card

    path = write_card(
        args.draft,
        args.training_info,
        bench_json=args.bench,
        base_model=args.base_model,
        repo_id=args.repo_id,
        license=args.license,
        datasets=args.dataset,
        force=args.force,
    )
    print(f"Wrote {path}")
    return 0
