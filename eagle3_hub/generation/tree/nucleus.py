"""The processed next-token distribution on its support only, for temperature / top-k / top-p sampling.

transformers' ``TopPLogitsWarper`` sorts the whole vocabulary for every row it processes; with a 262k-token
vocabulary that sort, and the softmax and draw over all of it, cost more than a small target's forward on a CPU, and
the sampling walk processes one row per visited tree level. Here the same distribution comes from the ``width``
largest scores (``topk``, a partial selection), widened until it provably holds the whole support, row by row (in
a sampled batch a few rows are flat at any step; widening them all would read 8x more for every row):

- top-k keeps every token scoring at least the k-th largest score (ties included, as ``TopKLogitsWarper``);
- top-p keeps a token when the mass of the tokens ranked above it is below ``top_p`` (``TopPLogitsWarper`` removes
  a token when the mass at or below it, ascending, is at most ``1 - top_p``: the same set), the first token always;
- the probabilities are the softmax of the scaled scores over the kept tokens.

Equal to the warpers' distribution up to float rounding of the cumulative sums (a token at the exact boundary) and,
where several tokens tie at the top-p boundary (a bf16 head has many ties), which of them are kept: as many, chosen
in ``topk``'s order (the warpers' choice is their unstable sort's).
"""

from __future__ import annotations

import torch
from transformers.generation import logits_process as _lp

FIRST_WIDTH = 64  # tokens read first; a row whose support reaches past them reads 8x more, alone, up to the vocabulary
SPARSE_LIMIT = 4096  # beyond this support the walk scatters the distribution back over the vocabulary


class Nucleus:
    """The distribution ``temperature`` / ``top_k`` / ``top_p`` (transformers' warpers, in that order) leave."""

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_tokens_to_keep: int = 1):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.min_tokens_to_keep = max(1, min_tokens_to_keep)

    @classmethod
    def of(cls, processors) -> Nucleus | None:
        """The nucleus of a processor list made of temperature, top-k and top-p warpers in that order (what sampling
        settings give), with a top-k or top-p to cut the support; None for any other list."""
        kinds = [type(p) for p in processors]
        order = [_lp.TemperatureLogitsWarper, _lp.TopKLogitsWarper, _lp.TopPLogitsWarper]
        if (
            not kinds
            or any(k not in order for k in kinds)
            or kinds != sorted(kinds, key=order.index)
            or len(set(kinds)) != len(kinds)
            or kinds == [_lp.TemperatureLogitsWarper]
        ):
            return None
        args, keep = {}, 1
        for p in processors:
            if isinstance(p, _lp.TemperatureLogitsWarper):
                args["temperature"] = float(p.temperature)
            elif isinstance(p, _lp.TopKLogitsWarper):
                if p.filter_value != -float("inf"):
                    return None
                args["top_k"] = int(p.top_k)  # the warper already holds max(top_k, min_tokens_to_keep)
            else:
                if p.filter_value != -float("inf"):
                    return None
                args["top_p"], keep = float(p.top_p), int(p.min_tokens_to_keep)
        if not args.get("top_k") and args.get("top_p", 1.0) >= 1.0:
            return None  # nothing cuts the support: the whole vocabulary
        return cls(**args, min_tokens_to_keep=keep)

    def __call__(self, scores: torch.Tensor, width: int = FIRST_WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
        """scores (n, V) -> (tokens (n, K), probabilities (n, K)): the support of each row's processed distribution,
        largest first; a row with a smaller support is padded with probability 0 (its tokens there repeat its first)."""
        x = scores.float() if self.temperature == 1.0 else scores.to(torch.float32, copy=True).div_(self.temperature)
        V = x.shape[-1]
        k = min(V, max(width, self.top_k + 1 if self.top_k else 0))
        cut = bool(self.top_k) and self.top_k < V
        lse = None if cut else torch.logsumexp(x, dim=-1, keepdim=True)  # top-p alone: mass over the vocabulary
        idx, p, short = self._support(x, k, lse)
        rows = short.nonzero().squeeze(1)  # rows whose support may reach past the k read: they alone read more
        while rows.numel() and k < V:
            k = min(V, k * 8)
            wide_idx, wide_p, short = self._support(x[rows], k, None if lse is None else lse[rows])
            idx = torch.cat([idx, idx[:, :1].expand(-1, k - idx.shape[1])], dim=1)
            p = torch.cat([p, p.new_zeros(p.shape[0], k - p.shape[1])], dim=1)
            idx[rows], p[rows] = wide_idx, wide_p
            rows = rows[short]
        return idx, p

    def _support(self, x: torch.Tensor, k: int, lse: torch.Tensor | None):
        """The ``k`` largest scaled scores of each row -> (tokens (n, k), probabilities (n, k) of those kept,
        normalised, whether the row's support may reach past them (n,))."""
        vals, idx = x.topk(k, dim=-1)  # sorted, largest first
        if lse is None:  # top-k: every token scoring at least the k-th, ties included
            kth = vals[:, self.top_k - 1 : self.top_k]
            keep = vals >= kth
            short = vals[:, -1] >= kth[:, 0]  # a tie of the k-th score may be left outside
            p = torch.exp(vals - torch.logsumexp(vals.masked_fill(~keep, -float("inf")), dim=-1, keepdim=True))
            p = p.masked_fill(~keep, 0.0)
        else:
            keep, short, p = None, None, torch.exp(vals - lse)
        if self.top_p < 1.0:
            nucleus = p.cumsum(dim=-1) - p < self.top_p
            nucleus[:, : self.min_tokens_to_keep] = True
            keep = nucleus if keep is None else keep & nucleus
            short = keep[:, -1] if short is None else short | keep[:, -1]  # the nucleus did not end inside the k read
        if keep is not None:
            p = p.masked_fill(~keep, 0.0)
        if short is None:
            short = torch.zeros(vals.shape[0], dtype=torch.bool, device=vals.device)
        return idx, p / p.sum(dim=-1, keepdim=True), short

    def dense(self, scores: torch.Tensor) -> torch.Tensor:
        """(n, V) probabilities of the processed distribution."""
        return scattered(*self(scores), scores)


def scattered(idx: torch.Tensor, p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A support (n, K) and its probabilities (n, K) spread over the vocabulary of ``like`` (n, V) (added: a padded
    row repeats a token with probability 0)."""
    return torch.zeros_like(like, dtype=p.dtype).scatter_add_(1, idx, p)


def draw(idx: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from a support (n, K) and its probabilities (n, K)."""
    return idx.gather(1, torch.multinomial(p, 1, generator=generator)).squeeze(1)
