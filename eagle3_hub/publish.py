"""A trained draft's model card and upload: the step after training (``eagle3-hub train``, ``card`` and ``push``).

Training writes the draft folder with its ``training_metrics.json`` and knows nothing of cards or the Hub; the card
knows nothing of training's metrics. This module, above both, reads the metrics as the card's training information
(``training.card_info``) and hands that to ``card.write_model_card`` and ``hub.push_draft``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .card import write_model_card
from .extras import missing_extra
from .hub import HubPushError, push_draft
from .training.card_info import training_info_from_metrics


def training_info(source) -> dict | None:
    """The card's training information: from ``source`` (a dict or JSON file: ``training_info.json``, or the
    ``training_metrics.json`` of ``eagle3-hub train``), or a draft folder's own file, ``training_info.json`` first;
    None when there is none."""
    if source is not None and not isinstance(source, dict) and Path(source).is_dir():
        folder, source = Path(source), None
        for name in ("training_info.json", "training_metrics.json"):
            if (folder / name).is_file():
                source = folder / name
                break
    if source is None:
        return None
    if not isinstance(source, dict):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist: pass a JSON file (training_info.json, or the "
                "training_metrics.json of `eagle3-hub train`)"
            )
        try:
            source = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON ({e}); write it again or pass another file.") from None
    return training_info_from_metrics(source) if "recipe" in source else source


def write_card(folder, training=None, **kwargs) -> Path:
    """``card.write_model_card`` with the training information of ``training`` (see ``training_info``; default:
    the folder's own file)."""
    return write_model_card(folder, training_info=training_info(folder if training is None else training), **kwargs)


def push(folder, repo_id: str, **kwargs) -> str:
    """``hub.push_draft``, its card written with the folder's training information."""
    return push_draft(folder, repo_id, training_info=training_info(folder), **kwargs)


def after_training(recipe: dict, output_dir) -> None:
    """What ``eagle3-hub train`` does after each stage, on the main process: the card (not for a LoRA adapter), then
    the upload when the recipe names ``push_to_hub``. A failed upload raises ``HubPushError`` naming the saved folder
    and the repo, so the command can say how to retry."""
    try:
        from accelerate import PartialState
    except ModuleNotFoundError as e:
        raise missing_extra("train", e) from None

    if not PartialState().is_main_process:
        return
    if not recipe["lora"]["enabled"]:
        try:
            write_card(output_dir)
        except Exception as e:  # the draft is complete without its card; `eagle3-hub card` writes it later
            print(f"[card] could not write the model card ({type(e).__name__}: {e}); run `eagle3-hub card {output_dir}`")
    if recipe["push_to_hub"]:
        try:
            url = push(output_dir, recipe["push_to_hub"], private=recipe["private"])
        except HubPushError as e:
            e.output_dir = recipe["output_dir"]
            e.repo_id = recipe.get("push_to_hub")
            raise
        print(f"[push] {url}")
