"""The draft vocabulary: the ``draft_vocab_size`` most frequent target tokens among loss tokens."""

from __future__ import annotations

import torch


def token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) counts of each target token among loss-masked (assistant) tokens."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in dataset:
        ids = torch.tensor(ex["input_ids"], dtype=torch.long)
        mask = torch.tensor(ex["loss_mask"], dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def select_draft_vocab(counts: torch.Tensor, draft_vocab_size: int, always_include: list[int] | None = None) -> tuple[torch.Tensor, float]:
    """The ``draft_vocab_size`` most frequent ids (sorted ascending, as d2t offsets expect) and the share of
    loss tokens they cover. ``always_include`` (e.g. EOS) is kept even when rare."""
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in 1..{vocab_size} (the target vocabulary)")
    score = counts.double().clone()
    for i in always_include or []:
        if 0 <= i < vocab_size:
            score[i] = float("inf")
    # ties (e.g. never-seen tokens) broken by id, so the selection is deterministic
    order = torch.argsort(score - torch.arange(vocab_size, dtype=torch.double) * 1e-9, descending=True, stable=True)
    ids = order[:draft_vocab_size].sort().values
    total = counts.sum().item()
    coverage = counts[ids].sum().item() / total if total else 0.0
    return ids, coverage


def coverage_table(counts: torch.Tensor, sizes=(1024, 2048, 4096, 8192, 16384, 32000)) -> dict[int, float]:
    """Share of loss tokens covered by the top-N tokens, for choosing ``draft_vocab_size``."""
    total = counts.sum().item() or 1
    top = counts.sort(descending=True).values.cumsum(0)
    return {n: top[min(n, counts.numel()) - 1].item() / total for n in sizes if n <= counts.numel()}
