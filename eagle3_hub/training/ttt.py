"""The EAGLE-3 training objective: training-time test (TTT).

The draft is unrolled ``ttt_steps`` times. Step k at sequence position t reads token t+1+k and, as its
feature, the fused target feature (k = 0) or its own step k-1 output; it predicts token t+2+k. Its query sits
at position id t+k (as at inference, where the k-th drafted token follows k-1 drafted ones); it attends to the
step-0 keys of positions <= t (causal) and to the keys of steps 1..k at position t (the diagonal). The loss of a
step compares the draft's distribution with the target's next-token distribution over the draft vocabulary (soft
cross-entropy by default, or the acceptance-rate losses of ``losses.py``), weighted 0.8^k; positions whose target
argmax lies outside the draft vocabulary are masked.

Sliding-window draft layers (``config.layer_types``) see the step-0 keys whose positions are inside the window of
the query's position t+k, as at inference; the diagonal keys sit at t+1..t+k, inside any window wider than k.

A packed row (``document_ids``, ``position_ids``: several samples concatenated) is trained as its samples would be
alone: attention stays within a sample, position ids restart at each, and step k at position t is scored only
where token t+2+k belongs to the same sample as t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..modeling_eagle3 import in_window
from .losses import parse_loss, position_loss


@dataclass
class TTTOutput:
    loss: torch.Tensor  # scalar, weighted sum over steps
    step_losses: torch.Tensor  # (K,) detached
    step_correct: torch.Tensor  # (K,) number of positions where the draft's argmax equals the target's
    step_count: torch.Tensor  # (K,) positions scored at each step (a target token outside the draft vocabulary: a miss)
    step_trained: torch.Tensor  # (K,) of those, positions the loss trains on (the target's token is in the draft vocabulary)
    chain_correct: torch.Tensor  # (K,) positions whose steps 0..k were all correct (for acceptance length)
    chain_count: torch.Tensor  # () positions scored at step 0
    # (K,) sums of sum_v min(p, q), the chance that sampling accepts the draft's token at step k (a masked position: 0),
    # and of its product over steps 0..k (the chance that the chain is accepted that far)
    step_alpha: torch.Tensor | None = None
    chain_alpha: torch.Tensor | None = None
    # (len(temperatures), K): chain_alpha with the target and the draft both sampled at each of ``temperatures``
    chain_alpha_at: torch.Tensor | None = None


def _shift(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, n:] padded at the end to the same length: row t holds x[t + n]."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], n) + tuple(x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)


def target_logit_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """(b, s) bool: the positions whose target logits the loss reads (the one before each scored token)."""
    return _shift(loss_mask.bool(), 1, False)


def causal_mask(seq_len: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, s, s) additive causal mask."""
    mask = torch.full((seq_len, seq_len), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return mask[None, None]


def document_mask(document_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(b, 1, s, s) additive mask: causal, and within the document of each position (``document_ids`` (b, s))."""
    s = document_ids.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=document_ids.device).tril()
    allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & causal
    return torch.zeros(allowed.shape, dtype=dtype, device=document_ids.device).masked_fill(~allowed, torch.finfo(dtype).min)[
        :, None
    ]


def step_masks(config, base: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask of TTT step ``step`` over the step-0 keys: ``base`` (causal, or a packed row's document
    mask), and for a draft with sliding-window layers transformers' ``{layer type: mask}`` dict whose sliding mask also
    hides the keys outside the window of the query's position t + step (``positions`` (b, s): restarting per document)."""
    if "sliding_attention" not in config.layer_types:
        return base
    kept = in_window(positions[:, :, None] + step, positions[:, None, :], config.sliding_window)[:, None]
    sliding = base.masked_fill(~kept, torch.finfo(base.dtype).min)
    return {"full_attention": base, "sliding_attention": sliding}


def draft_core(draft):
    """The draft under a data-parallel wrapper (``DistributedDataParallel.module``); a PEFT model forwards
    attribute access itself."""
    while not hasattr(draft, "t2d") and hasattr(draft, "module"):
        draft = draft.module
    return draft


@dataclass
class TargetScores:
    """The target's logits as the loss reads them: over the draft vocabulary (b, s, Vd), and of the full vocabulary
    only the argmax (b, s, target ids) and the log-sum-exp (b, s). A 262k-token target's full logits of one batch
    would take gigabytes; these are a few megabytes."""

    draft: torch.Tensor
    argmax: torch.Tensor
    lse: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor, draft_ids: torch.Tensor, rows: torch.Tensor | None = None) -> TargetScores:
        """From full logits (n..., V); the log-sum-exp only at ``rows`` (bool, the leading shape) when given."""
        lse = logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
        if rows is None:
            lse = logits.float().logsumexp(-1)
        else:
            lse[rows] = logits[rows].float().logsumexp(-1)
        return cls(logits.index_select(-1, draft_ids).float(), logits.argmax(-1), lse)


def draft_token_ids(draft) -> torch.Tensor:
    """(Vd,) the target ids of the draft's vocabulary."""
    core = draft_core(draft)
    return torch.arange(core.config.draft_vocab_size, device=core.d2t.device) + core.d2t


def ttt_loss(
    draft,
    aux_hidden_states: torch.Tensor,  # (b, s, 3*Ht) target features at the aux layers
    input_ids: torch.LongTensor,  # (b, s), right-padded
    target_logits: torch.Tensor | TargetScores,  # (b, s, V) logits or their TargetScores; read at target_logit_positions
    loss_mask: torch.Tensor,  # (b, s) 1 on assistant tokens (tokens to predict)
    attention_mask: torch.Tensor | None = None,  # (b, s) 1 on real tokens
    ttt_steps: int = 7,
    step_weight: float = 0.8,
    loss: str | dict = "kl",  # train.loss: a name of losses.LOSSES or {name: weight}
    lk_eta: float = 3.0,  # lk_hybrid's eta
    temperatures: tuple[float, ...] = (),  # also measure chain acceptance with both sampled at these (evaluation)
    position_ids: torch.LongTensor | None = None,  # (b, s) of a packed batch: restarting at each document
    document_ids: torch.LongTensor | None = None,  # (b, s) of a packed batch: the document of each position
) -> TTTOutput:
    loss_weights = parse_loss(loss)
    b, s = input_ids.shape
    device = input_ids.device
    core = draft_core(draft)  # `draft` may be wrapped (DDP); its forward is called, the vocabulary maps read here
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    loss_mask = loss_mask.bool() & attention_mask.bool()
    with torch.no_grad():
        rows = target_logit_positions(loss_mask)
        scores = target_logits
        if not isinstance(scores, TargetScores):
            scores = TargetScores.from_logits(target_logits, draft_token_ids(core), rows)
        in_vocab = core.t2d[scores.argmax]  # (b, s): the target's choice is reachable by the draft
        sel = scores.draft  # (b, s, Vd)
        lse_draft = sel.logsumexp(-1)
        target_p = (sel - lse_draft.unsqueeze(-1)).exp()  # (b, s, Vd) renormalised over the draft vocabulary
        # at another temperature, over the draft vocabulary; its mass outside that vocabulary is taken as at T=1
        # (the full vocabulary's log-sum-exp is kept at T=1 only)
        target_p_at = [(sel / t).softmax(-1) for t in temperatures]
        del sel
        target_argmax_draft = target_p.argmax(-1)  # (b, s) in draft ids
        # the target's probability mass on the draft vocabulary, at the rows the loss reads (mass outside it is
        # never accepted, so the acceptance losses see p as it is: target_p * mass)
        draft_mass = torch.ones(b, s, device=device)
        draft_mass[rows] = (lse_draft[rows] - scores.lse[rows]).exp()

    if document_ids is None:
        base = causal_mask(s, torch.float32, device)
        positions = torch.arange(s, device=device).unsqueeze(0).expand(b, -1)
    else:
        base, positions = document_mask(document_ids, torch.float32), position_ids
    ttt_cache: list = []
    hidden = None
    losses, correct, counts, trained, chain_correct, alphas, chain_alphas = [], [], [], [], [], [], []
    chain = chain_a = None
    chain_t = [None] * len(temperatures)
    chain_alphas_t: list[list[torch.Tensor]] = [[] for _ in temperatures]
    for k in range(ttt_steps):
        ids_k = _shift(input_ids, 1 + k)  # token t+1+k
        scored = _shift(loss_mask, 2 + k, False)  # (b, s) positions the metrics count
        if document_ids is not None:  # ...whose token t+2+k is of the same document
            scored = scored & (_shift(document_ids, 2 + k, -1) == document_ids)
        valid = scored & _shift(in_vocab, 1 + k, False)  # (b, s) ...and the loss trains: the target's token is reachable
        p_k = _shift(target_p, 1 + k)[valid]  # (n, Vd) target distribution of token t+2+k
        mass_k = _shift(draft_mass, 1 + k, 1.0)[valid]  # (n,)
        want_k = _shift(target_argmax_draft, 1 + k)[valid]  # (n,)
        mask = step_masks(core.config, base, positions, k)
        # logits only where the loss scores them: the draft's lm_head is most of a step's cost
        if hidden is None:
            out = draft(
                input_ids=ids_k,
                target_hidden_states=aux_hidden_states,
                position_ids=positions,
                attention_mask=mask,
                ttt_cache=ttt_cache,
                logits_to_keep=valid,
            )
        else:
            out = draft(
                input_ids=ids_k,
                hidden_states=hidden,
                position_ids=positions + k,
                attention_mask=mask,
                ttt_cache=ttt_cache,
                logits_to_keep=valid,
            )
        hidden = out.hidden_states
        logp = F.log_softmax(out.logits.float(), dim=-1)  # (n, Vd)
        n = valid.sum()
        step_loss, alpha = position_loss(loss_weights, logp, p_k, p_k * mass_k.unsqueeze(-1), lk_eta=lk_eta)
        losses.append(step_loss)
        with torch.no_grad():
            hit = torch.zeros_like(valid)  # a token outside the draft vocabulary is a miss, as at inference
            hit[valid] = logp.argmax(-1) == want_k
            chain = hit if chain is None else chain & hit
            a = torch.zeros(b, s, device=device)
            a[valid] = alpha.float()
            chain_a = a if chain_a is None else chain_a * a
            for j, t in enumerate(temperatures):
                a_t = torch.zeros(b, s, device=device)
                p_t = _shift(target_p_at[j], 1 + k)[valid] * mass_k.unsqueeze(-1)
                a_t[valid] = torch.minimum(p_t, (out.logits.float() / t).softmax(-1)).sum(-1)
                chain_t[j] = a_t if chain_t[j] is None else chain_t[j] * a_t
                chain_alphas_t[j].append(chain_t[j].sum())
            alphas.append(a.sum())
            chain_alphas.append(chain_a.sum())
            correct.append(hit.sum())
            counts.append(scored.sum())
            trained.append(n)
            chain_correct.append(chain.sum())
            if k == 0:
                chain_count = scored.sum()
    weights = torch.tensor([step_weight**k for k in range(ttt_steps)], device=device)
    step_losses = torch.stack(losses)
    return TTTOutput(
        loss=(step_losses * weights).sum(),
        step_losses=step_losses.detach(),
        step_correct=torch.stack(correct),
        step_count=torch.stack(counts),
        step_trained=torch.stack(trained),
        chain_correct=torch.stack(chain_correct),
        chain_count=chain_count,
        step_alpha=torch.stack(alphas),
        chain_alpha=torch.stack(chain_alphas),
        chain_alpha_at=torch.stack([torch.stack(c) for c in chain_alphas_t]) if temperatures else None,
    )


def objective(draft, aux, batch, logits, t: dict, temperatures: tuple[float, ...] = ()) -> TTTOutput:
    """The TTT loss of a collated batch with the recipe's ``train`` settings ``t``."""
    return ttt_loss(
        draft,
        aux,
        batch["input_ids"],
        logits,
        batch["loss_mask"],
        batch["attention_mask"],
        ttt_steps=t["ttt_steps"],
        step_weight=t["step_weight"],
        loss=t["loss"],
        lk_eta=t["lk_eta"],
        temperatures=temperatures,
        position_ids=batch.get("position_ids"),
        document_ids=batch.get("document_ids"),
    )


def acceptance_metrics(
    step_correct,
    step_count,
    chain_correct,
    chain_count,
    step_alpha=None,
    chain_alpha=None,
    chain_alpha_at=None,
    temperatures: tuple[float, ...] = (),
) -> dict:
    """Per-position accuracy vs the target's argmax and the expected acceptance length of a chain
    (1 bonus token + the expected number of leading correct draft tokens): greedy decoding. With ``step_alpha`` and
    ``chain_alpha`` (sums of ``TTTOutput``), the same for speculative sampling at temperature 1: the chance that
    step k's token is accepted (``step_expected_acceptance``) and the expected chain length."""
    acc = [c / max(n, 1) for c, n in zip(step_correct.tolist(), step_count.tolist())]
    chain = [c / max(chain_count.item(), 1) for c in chain_correct.tolist()]
    out = {"step_accuracy": acc, "chain_acceptance": chain, "expected_acceptance_length": 1.0 + sum(chain)}
    if step_alpha is not None:
        out["step_expected_acceptance"] = [a / max(n, 1) for a, n in zip(step_alpha.tolist(), step_count.tolist())]
        sampled = [c / max(chain_count.item(), 1) for c in chain_alpha.tolist()]
        out["chain_expected_acceptance"] = sampled
        out["expected_acceptance_length_sampled"] = 1.0 + sum(sampled)
    if chain_alpha_at is not None:  # {"0.7": length}: the same, both sampled at each temperature
        out["expected_acceptance_length_at"] = {
            f"{t:g}": 1.0 + sum(c / max(chain_count.item(), 1) for c in row.tolist())
            for t, row in zip(temperatures, chain_alpha_at)
        }
    return out
