"""Training objectives of a draft position: the target's next-token distribution ``p`` against the draft's ``q``.

Speculative sampling accepts a drafted token with probability ``alpha = sum_v min(p(v), q(v))`` (one minus the
total variation distance). ``kl`` (the default) trains ``q`` towards ``p`` by soft cross-entropy, a proxy with the
same optimum; the LK losses (Samarin et al., "LK Losses: Direct Acceptance Rate Optimization for Speculative
Decoding", arXiv 2602.23881) train on ``alpha`` itself:

- ``lk``: ``1 - alpha`` (the total variation distance);
- ``lk_log``: ``-log alpha`` (the paper's LK^alpha: the gradient of ``1 - alpha`` scaled by ``1 / alpha``, strong
  while the draft is poor);
- ``lk_hybrid``: ``lam * KL(p || q) + (1 - lam) * (1 - alpha)`` with ``lam = exp(-eta * sg[mean alpha])`` over the
  positions of a draft step (the paper's LK^lambda, eta = 3 by default): KL while the draft is far from the
  target, the acceptance itself as it gets close.

``train.loss`` names one of them, or mixes several with weights (``{kl: 0.5, lk_log: 0.5}``).

The draft predicts over its own vocabulary (``d2t``): ``p`` there is the target's probability of those tokens, not
renormalised, since the target's mass outside the draft vocabulary can never be accepted (``alpha <= that mass``).
``kl`` keeps today's objective: ``p`` renormalised over the draft vocabulary.
"""

from __future__ import annotations

import torch

from .recipe_schema import LOSSES, loss_weights, rule_broken

_ALPHA_FLOOR = 1e-6  # -log alpha stays finite where the two distributions do not overlap


def parse_loss(spec) -> dict[str, float]:
    """``train.loss`` -> {name: weight}: a name, or a mapping of names to non-negative weights (not all zero); the
    rule is the recipe schema's."""
    try:
        return loss_weights(spec)
    except ValueError as e:
        raise ValueError(rule_broken("train.loss", e)) from None


def acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(n,) ``sum_v min(p(v), q(v))`` over the draft vocabulary: the chance that speculative sampling accepts a token
    drafted from ``q`` (n, Vd) when the target's distribution is ``p`` (n, Vd; its mass outside the draft
    vocabulary left out, so a row sums to at most 1)."""
    return torch.minimum(p, q).sum(-1)


def position_loss(
    weights: dict[str, float], logq: torch.Tensor, p_draft: torch.Tensor, p: torch.Tensor, lk_eta: float = 3.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss averaged over the n positions, alpha (n,) detached) for one draft step.

    logq: (n, Vd) the draft's log-probabilities; p_draft: (n, Vd) the target's distribution renormalised over the draft
    vocabulary (``kl``); p: (n, Vd) the target's probabilities of the draft vocabulary as they are (the LK losses)."""
    n = max(logq.shape[0], 1)
    need_alpha = any(name != "kl" for name in weights)
    alpha = acceptance(p, logq.exp()) if need_alpha else acceptance(p, logq.detach().exp())
    total = logq.new_zeros(())
    for name, w in weights.items():
        if not w:
            continue
        if name == "kl":  # soft cross-entropy: KL(p || q) up to the target's entropy, the same gradient
            term = -(p_draft * logq).sum() / n
        elif name == "lk":
            term = (1 - alpha).sum() / n
        elif name == "lk_log":
            term = -alpha.clamp_min(_ALPHA_FLOOR).log().sum() / n
        else:  # lk_hybrid
            lam = torch.exp(-lk_eta * alpha.detach().mean()) if alpha.numel() else logq.new_ones(())
            kl = (torch.xlogy(p_draft, p_draft) - p_draft * logq).sum() / n
            term = lam * kl + (1 - lam) * (1 - alpha).sum() / n
        total = total + w * term
    return total, alpha.detach()


__all__ = ["LOSSES", "acceptance", "parse_loss", "position_loss"]
