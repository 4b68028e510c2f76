"""Conversations -> token ids through the target's chat template, with a loss mask on the assistant's tokens only,
truncated to ``data.max_length``."""

from __future__ import annotations

import inspect

from ..extras import missing_extra

try:
    from datasets import Dataset
    from datasets.fingerprint import Hasher
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from .sources import DataError


def user_prefix(tokenizer) -> str:
    """The text a chat template writes before a user message's content (incl. a default system prompt)."""
    if not tokenizer.chat_template:
        raise DataError("The tokenizer has no chat template: set `chat_template` in the recipe or use a chat model.")
    marker = "\x00USER\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return text[: text.index(marker)]


def render_with_mask(tokenizer, messages: list[dict], max_length: int) -> dict:
    """Chat template + loss mask on assistant tokens only. Works for templates without generation markers:
    assistant spans are found by rendering growing prefixes of the conversation. Samples longer than
    ``max_length`` tokens are truncated (``truncated`` says so, for the data report)."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (full.startswith(before) and full.startswith(upto)):
            raise DataError(
                "The chat template does not render conversations prefix by prefix (e.g. it rewrites earlier turns), "
                "so the assistant tokens cannot be located: use single-turn conversations (regeneration with data.max_turns: 1 "
                "writes them) or another chat template."
            )
        spans.append((len(before), len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    n = len(enc["input_ids"])
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"][:max_length]]
    return {"input_ids": enc["input_ids"][:max_length], "loss_mask": mask, "truncated": n > max_length}


SPLIT_COLUMNS = ("eval_ok", "prompt")  # what the held-out split reads (splits.held_out_split), then drops


def tokenize_dataset(
    ds: Dataset, tokenizer, max_length: int, num_proc: int | None = None, min_loss_tokens: int = 1
) -> tuple[Dataset, dict]:
    """Tokenise with loss masks. Long samples are truncated to ``max_length`` (no packing), samples without loss
    tokens dropped; both are counted in the returned report."""
    if not tokenizer.chat_template:
        raise DataError("The tokenizer has no chat template: set `chat_template` in the recipe or use a chat model.")
    # datasets hashes module functions by name: name the code, the tokenizer and the length in the cache key
    fingerprint = Hasher.hash((ds._fingerprint, inspect.getsource(render_with_mask), tokenizer, max_length))
    out = ds.map(
        lambda ex: render_with_mask(tokenizer, ex["messages"], max_length),
        remove_columns=[c for c in ds.column_names if c not in SPLIT_COLUMNS],
        num_proc=num_proc,
        desc="tokenise",
        new_fingerprint=fingerprint,
    )
    n_trunc = sum(out["truncated"])
    kept = out.filter(lambda ex: sum(ex["loss_mask"]) >= min_loss_tokens, desc="drop samples without loss tokens")
    report = {"samples": len(out), "truncated": n_trunc, "dropped_no_loss_tokens": len(out) - len(kept), "kept": len(kept)}
    if len(kept) == 0:
        raise DataError(f"No sample has assistant tokens to learn from ({report}). Regenerate responses or check the data.")
    return kept.remove_columns("truncated"), report
