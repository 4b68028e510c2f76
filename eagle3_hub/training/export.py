"""The draft folder a run writes: bf16 weights without the target's embedding (or the LoRA adapter) and
``training_metrics.json``, what the run learnt from and how well it does."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..atomic import atomic_dir, atomic_write_json


def training_metrics(
    recipe: dict,
    vocab_info: dict,
    steps: int,
    history: list[dict],
    wall: float,
    earlier: list[dict],
    throughput: dict | None = None,
) -> dict:
    """``training_metrics.json``: the recipe, vocabulary, data report, the last held-out metrics and their history."""
    final = history[-1] if history else {}
    return {
        "recipe": recipe,
        "vocab": {k: v for k, v in vocab_info.items() if k != "target_ids"},
        "data": json.loads((Path(recipe["work_dir"]) / "data" / "data_report.json").read_text()),
        "steps": steps,
        # the held-out split at the last step: accuracy of draft step k vs the target's argmax, and the
        # expected number of tokens per target forward when a chain of ttt_steps drafts is verified
        "acceptance": {
            k: final.get(k)
            for k in (
                "step",
                "loss",
                "step_accuracy",
                "chain_acceptance",
                "expected_acceptance_length",
                "step_expected_acceptance",
                "expected_acceptance_length_sampled",
                "expected_acceptance_length_at",
                "masked_share",
            )
        },
        "eval_history": history,
        "wall_time_s": round(wall, 1),
        # real tokens a second in the training steps since the run (re)started, and the share of the matmul peak
        # (training/throughput.py)
        "throughput": throughput,
        "earlier_stages": earlier,  # the training of draft.init_from, oldest first
    }


def export_draft(model, out_dir: Path, metrics: dict | None = None, state_dict: dict | None = None) -> None:
    """bf16 weights without the target's embedding (+ ``training_metrics.json``), written to a temporary folder
    and renamed into place. A LoRA draft is saved as its adapter (a ``PeftModel`` of the draft), in fp32.
    ``state_dict``: the full weights when ``model`` is sharded (``accelerator.get_state_dict``)."""
    with atomic_dir(out_dir) as tmp:
        if hasattr(model, "peft_config"):
            model.save_pretrained(tmp, state_dict=state_dict)
        else:
            model = model.to(torch.bfloat16)  # (config.json says bfloat16)
            state_dict = model.state_dict() if state_dict is None else state_dict
            state_dict = {
                k: (v.to(torch.bfloat16) if v.is_floating_point() else v).cpu().contiguous()
                for k, v in state_dict.items()
                if k != "embed_tokens.weight"
            }
            model.save_pretrained(tmp, state_dict=state_dict)
        if metrics is not None:
            atomic_write_json(tmp / "training_metrics.json", metrics)
