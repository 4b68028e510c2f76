"""A recipe of several stages (``stages:``): each trains on its own data, continuing the draft the stage before wrote."""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoints import FINISHED, finished_run
from .recipe import check_stage_number, load_recipe, load_stages
from .train import check_recipe, train


def train_recipe(
    config: str | None,
    overrides: dict | None = None,
    resume: bool = False,
    overwrite: bool = False,
    from_stage: int = 1,
    data_only: bool = False,
    after_stage=None,
):
    """Train every stage of a recipe file in turn (``--resume`` skips the stages that finished in their work_dir).
    ``from_stage`` N starts at stage N, continuing the draft that stage N - 1 wrote (a shipped draft, say);
    ``data_only`` prepares each stage's data and trains nothing. ``after_stage(recipe, output_dir)`` runs after
    each stage that trained (``eagle3-hub train`` writes the card and pushes there: training knows neither).

    Raises ``ValueError`` / ``DataError`` / ``OSError`` for bad input, and what ``after_stage`` raises."""
    overrides = overrides or {}
    chain = load_stages(load_recipe(config, overrides), overrides)
    for stage in chain:
        check_recipe(stage)
    check_stage_number(chain, from_stage)  # 0, or past the last stage, would train nothing (--data-only too)
    if from_stage > 1 and not data_only:
        check_stage_start(chain, from_stage)
    names = [config] + [st if isinstance(st, str) else f"{config} stage {i}" for i, st in enumerate(chain[0]["stages"], start=2)]
    for i, (name, recipe) in enumerate(zip(names, chain), start=1):
        if i < from_stage:
            continue
        if len(chain) > 1:
            print(f"[stages] stage {i}/{len(chain)}: {name}", flush=True)
        if data_only:
            train(recipe, data_only=True)
            continue
        if resume and finished_run(recipe):
            print(
                f"[resume] {name} finished earlier ({Path(recipe['work_dir']) / FINISHED}): skipped; "
                "run with --overwrite instead of --resume to train it again",
                flush=True,
            )
            continue
        out = train(recipe, resume=resume, overwrite=overwrite)
        if after_stage is not None:
            after_stage(recipe, out)


def check_stage_start(chain: list[dict], from_stage: int) -> None:
    """Stage ``from_stage`` can start only from a draft that stage ``from_stage - 1`` wrote: the draft in its
    ``init_from`` must record, in its ``training_metrics.json``, that many stages of training on that stage's data
    sources (another draft there would be trained on silently)."""
    if not 1 <= from_stage <= len(chain):
        raise ValueError(f"--from-stage {from_stage}: the recipe has stages 1 to {len(chain)}")
    before, init = chain[from_stage - 2], chain[from_stage - 1]["draft"]["init_from"]
    metrics = Path(init) / "training_metrics.json"
    if not (Path(init) / "config.json").is_file():
        raise ValueError(
            f"--from-stage {from_stage} continues the draft of stage {from_stage - 1} in {init}, which "
            f"holds no draft: train the earlier stages first, or drop --from-stage"
        )
    try:
        prev = json.loads(metrics.read_text())
    except (OSError, ValueError):
        prev = {}
    paths = lambda srcs: [src if isinstance(src, str) else src.get("path") for src in srcs or []]  # noqa: E731
    depth = len(prev.get("earlier_stages") or []) + 1 if prev else 0
    sources = paths(((prev.get("recipe") or {}).get("data") or {}).get("sources"))
    if depth != from_stage - 1 or sources != paths(before["data"]["sources"]):
        raise ValueError(
            f"--from-stage {from_stage}: the draft in {init} is not the one stage {from_stage - 1} "
            f"writes ({metrics} records {depth} stage(s) of training, the last on {len(sources)} "
            f"source(s); stage {from_stage - 1} is stage {from_stage - 1} on "
            f"{len(before['data']['sources'])}): train from an earlier stage"
        )
