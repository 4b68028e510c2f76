"""The models a bench run measures: the target, the EAGLE-3 draft(s) bound to it, an optional classic assistant."""

from __future__ import annotations

import re

import torch

from ..generation.tree import load_draft
from ..targets import default_draft
from .options import DRAFT_METHODS


def resolve_draft(draft: str | None, target: str | None, methods: list[str]) -> str | None:
    """The draft to load, checked before any model is: ``draft``, or the reference draft of the embedded
    target. ``None`` when no method needs one."""
    if not any(m in DRAFT_METHODS for m in methods):
        return None
    if draft is not None:
        return draft
    needs = "Methods " + ", ".join(m for m in methods if m in DRAFT_METHODS)
    try:
        return default_draft(target, needs)
    except ValueError as e:
        raise ValueError(f"{e} Or run only --methods plain,lookup.") from None


def load_models(
    target: str | None,
    draft_path: str | None,
    device: torch.device,
    dtype: torch.dtype,
    assistant_model: str | None = None,
    assistant_tokens: int | None = None,
    allow_pickle: bool = False,
):
    """(target, tokenizer, draft or None, assistant or None, assistant_tokenizer or None), on ``device``/``dtype``.

    ``allow_pickle``: also load target / assistant checkpoints stored as pickles (``.bin``); drafts never."""
    from ..targets import check_no_pickles, load_target

    if assistant_model and not allow_pickle:  # before the target loads: a refusal should not take minutes
        check_no_pickles(assistant_model, "Assistant model")
    target_model, tokenizer = load_target(target, dtype=dtype, device=device, allow_pickle=allow_pickle)
    draft = None
    if draft_path is not None:
        draft = load_draft(draft_path, target_model, assist=True)  # bound with the hooks the `assisted` method reads
        if assistant_tokens:
            draft.generation_config.num_assistant_tokens = assistant_tokens
    assistant = assistant_tok = None
    if assistant_model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        safe = {} if allow_pickle else {"use_safetensors": True}
        assistant = AutoModelForCausalLM.from_pretrained(assistant_model, dtype=dtype, **safe).to(device).eval()
        if assistant.config.get_text_config().vocab_size != target_model.config.get_text_config().vocab_size:
            assistant_tok = AutoTokenizer.from_pretrained(assistant_model)
        if assistant_tokens:
            assistant.generation_config.num_assistant_tokens = assistant_tokens
    return target_model, tokenizer, draft, assistant, assistant_tok


def compare_draft_names(paths: list[str]) -> dict[str, str]:
    """{label: path} for ``--compare-draft`` paths: the folder or repo name, numbered where two share one."""
    names: dict[str, str] = {}
    for path in paths:
        base = re.sub(r"[^\w.-]", "_", str(path).rstrip("/").split("/")[-1]) or "draft"
        name, i = base, 2
        while name in names:
            name, i = f"{base}-{i}", i + 1
        names[name] = path
    return names
