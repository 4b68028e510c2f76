"""The draft vocabulary: the ``draft_vocab_size`` most frequent target tokens among loss tokens (``vocab.json`` in
work_dir), or the vocabulary of the draft that training continues."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..atomic import atomic_write_json


def token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) counts of each target token among loss-masked (assistant) tokens."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in dataset:
        ids = torch.tensor(ex["input_ids"], dtype=torch.long)
        mask = torch.tensor(ex["loss_mask"], dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def select_draft_vocab(
    counts: torch.Tensor, draft_vocab_size: int, always_include: list[int] | None = None, prefer: torch.Tensor | None = None
) -> tuple[torch.Tensor, float]:
    """The ``draft_vocab_size`` most frequent ids (sorted ascending, as d2t offsets expect) and the share of
    loss tokens they cover. ``always_include`` (e.g. EOS) is kept even when rare; ``prefer`` (e.g. the vocabulary
    of the draft being continued) wins ties of equal counts, so no token is swapped for one no more frequent."""
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in 1..{vocab_size} (the target vocabulary)")
    score = counts.double().clone()
    for i in always_include or []:
        if 0 <= i < vocab_size:
            score[i] = float("inf")
    if prefer is not None:
        score[torch.as_tensor(prefer, dtype=torch.long)] += 0.5
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


@torch.no_grad()
def remap_draft_vocab(draft, target_ids: torch.Tensor, target_head: torch.Tensor) -> dict[str, int]:
    """Give a trained draft another vocabulary, ``target_ids`` (n,) sorted target ids, in place.

    The ``lm_head`` rows of tokens the draft already had are carried over unchanged. A new token's row is the
    target's output row of that token (``target_head``, (V, Ht)) mapped into the draft's output space by the
    least-squares linear map (Ht, Hd) that carries the target's rows of the shared tokens onto the draft's: the
    new tokens start where the draft would put them, not at random."""
    old_ids = draft.draft_to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device)).cpu()
    new_ids = torch.as_tensor(target_ids, dtype=torch.long).cpu()
    old_head = draft.lm_head.weight.detach().float().cpu()  # (n_old, Hd)
    slot = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
    slot[old_ids] = torch.arange(old_ids.numel())
    old_slot = slot[new_ids]  # (n,) the row each new token had, -1 if none
    shared = old_slot >= 0
    head_t = target_head.detach().float().cpu()
    rows = torch.zeros(new_ids.numel(), old_head.shape[1])
    rows[shared] = old_head[old_slot[shared]]
    if (~shared).any() and shared.any():
        fit = torch.linalg.lstsq(head_t[new_ids[shared]], old_head[old_slot[shared]]).solution  # (Ht, Hd)
        rows[~shared] = head_t[new_ids[~shared]] @ fit
    head = torch.nn.Linear(old_head.shape[1], new_ids.numel(), bias=False)
    head.weight.copy_(rows)
    draft.lm_head = head.to(device=draft.lm_head.weight.device, dtype=draft.lm_head.weight.dtype)
    draft.config.draft_vocab_size = new_ids.numel()
    draft.d2t = torch.zeros(new_ids.numel(), dtype=torch.long, device=draft.d2t.device)  # a buffer: resized, then set
    draft.set_vocab_mapping(new_ids)
    return {"carried_over": int(shared.sum()), "new": int((~shared).sum()), "dropped": int(old_ids.numel() - shared.sum())}


def prepare_vocab(
    recipe: dict,
    train_ds,
    tokenizer,
    vocab_size: int,
    draft_ids: torch.Tensor | None = None,
    reselect: bool = False,
    write: bool = True,
) -> tuple[torch.Tensor, dict]:
    """The draft vocabulary (``vocab.json`` in work_dir): the most frequent loss tokens, or ``draft_ids`` (the
    target ids of an existing draft's vocabulary, ``draft.init_from``), with the coverage either achieves.
    ``reselect``: choose anew from this data although there is a draft (``draft.reselect_vocab``); its tokens win
    ties, and its size is the default."""
    path = Path(recipe["work_dir"]) / "vocab.json"
    keep = draft_ids is not None and not reselect
    size = recipe["draft"]["draft_vocab_size"] or vocab_size
    if draft_ids is not None and (keep or recipe["draft"]["draft_vocab_size"] is None):
        size = len(draft_ids)
    data = getattr(train_ds, "_fingerprint", None)
    if path.exists() and not keep:
        saved = json.loads(path.read_text())
        if saved["draft_vocab_size"] == size and saved.get("data", data) == data and not saved.get("from_draft"):
            return torch.tensor(saved["target_ids"]), saved
    counts = token_counts(train_ds, vocab_size)
    old = torch.as_tensor(draft_ids).cpu() if draft_ids is not None else None
    old_coverage = counts[old].sum().item() / max(1, counts.sum().item()) if old is not None else None
    if keep:
        ids, coverage = old, old_coverage
    else:
        ids, coverage = select_draft_vocab(counts, size, always_include=[tokenizer.eos_token_id], prefer=old)
    info = {
        "draft_vocab_size": size,
        "coverage": coverage,
        "coverage_by_size": coverage_table(counts),
        "loss_tokens": int(counts.sum()),
        "from_draft": keep,
        "data": data,
        "target_ids": ids.tolist(),
    }
    if reselect and old is not None:
        info["init_from_coverage"] = old_coverage
    if write:  # every process computes the same selection; one writes it
        atomic_write_json(path, info)
        print(f"[vocab] {size} tokens cover {coverage:.2%} of {int(counts.sum())} loss tokens")
    return ids, info
