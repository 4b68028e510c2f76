"""The processed next-token distribution on its support only, for temperature / top-k / top-p sampling.

transformers' ``TopPLogitsWarper`` sorts the whole vocabulary for every row it processes; with a 262k-token
vocabulary that sort, and the softmax and draw over all of it, cost more than a small target's forward on a CPU, and
the sampling walk processes one row per visited tree level. Here the same distribution comes from the ``width``
largest scores (``topk``, a partial selection), widened until it provably holds the whole support:

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

FIRST_WIDTH = 256  # tokens read first; a flat distribution widens it 8x at a time up to the vocabulary
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
        if not kinds or any(k not in order for k in kinds) or kinds != sorted(kinds, key=order.index) \
                or len(set(kinds)) != len(kinds) or kinds == [_lp.TemperatureLogitsWarper]:
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
        """scores (n, V) -> (tokens (n, K), probabilities (n, K)): the support of each row's processed distribution
        (zeros pad rows with a smaller one), largest first."""
        x = scores.float()
        if self.temperature != 1.0:
            x = x / self.temperature
        V = x.shape[-1]
        k = min(V, max(width, self.top_k + 1 if self.top_k else 0))
        while True:
            vals, idx = x.topk(k, dim=-1)  # sorted, largest first
            whole = True  # whether the k read hold every token each row keeps
            keep = torch.ones_like(vals, dtype=torch.bool)
            if self.top_k and self.top_k < V:
                kth = vals[:, self.top_k - 1 : self.top_k]
                keep = vals >= kth
                whole = bool((vals[:, -1:] < kth).all())  # no tie of the k-th score left outside
                lse = torch.logsumexp(vals.masked_fill(~keep, -float("inf")), dim=-1, keepdim=True)
            else:
                lse = torch.logsumexp(x, dim=-1, keepdim=True)
            p = torch.exp(vals - lse).masked_fill(~keep, 0.0)
            if self.top_p < 1.0:
                above = p.cumsum(dim=-1) - p
                keep &= above < self.top_p
                keep[:, : self.min_tokens_to_keep] = True
                whole = whole and not bool(keep[:, -1].any())  # every row's nucleus ended inside the k read
            if whole or k == V:
                break
            k = min(V, k * 8)
        p = p.masked_fill(~keep, 0.0)
        return idx, p / p.sum(dim=-1, keepdim=True)

    def dense(self, scores: torch.Tensor) -> torch.Tensor:
        """(n, V) probabilities of the processed distribution."""
        return scattered(*self(scores), scores)


def scattered(idx: torch.Tensor, p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A support (n, K) and its probabilities (n, K) spread over the vocabulary of ``like`` (n, V)."""
    return torch.zeros_like(like, dtype=p.dtype).scatter_(1, idx, p)


def draw(idx: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from a support (n, K) and its probabilities (n, K)."""
    return idx.gather(1, torch.multinomial(p, 1, generator=generator)).squeeze(1)
