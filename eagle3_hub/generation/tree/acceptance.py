"""Acceptance: which tree path a row keeps, and the target's token after it (the bonus token).

Greedy: the longest path whose every token equals the target's argmax at its parent, plus the argmax at its end.

Sampling, lossless with a fixed candidate set: at a node let ``p`` be the target's processed distribution
(temperature, top-k, top-p, ... applied) and ``c_1, ..., c_m`` the node's children (distinct tokens) in a fixed
order. Treat each child as a one-hot proposal ``q = delta_c``: speculative sampling accepts ``c`` with probability
``min(1, p(c) / q(c)) = p(c)`` and otherwise samples from the residual ``norm(max(0, p - q))``, which is ``p`` with
``p(c)`` set to 0 and renormalised. The output is distributed as ``p``: ``P(c) = p(c)`` and, for ``y != c``,
``P(y) = (1 - p(c)) * p(y) / (1 - p(c)) = p(y)``. The same step on the residual with the next child, and so on,
keeps it so by induction; when every child is rejected the token is drawn from the final residual. Child ``c_j``
is thus accepted (given ``c_1..c_{j-1}`` were rejected) with probability ``p(c_j) / (1 - sum_{i<j} p(c_i))``,
evaluated here for all children at once. An accepted child continues the walk there, under the target's
distribution given the longer prefix, so every emitted token follows the target's processed next-token
distribution given everything before it.

Sampling with children drawn from the draft (``draft_sampling``): the children ``c_1, ..., c_m`` of a node are the
first m draws without replacement from the draft's distribution ``q`` there (``drafting``). Recursive rejection
sampling: accept ``c_j`` with probability ``min(1, p_j(c_j) / q_j(c_j))``, where ``q_j`` is ``q`` without
``c_1..c_{j-1}``, renormalised (the law ``c_j`` was drawn from), and ``p_1 = p``; on a rejection
``p_{j+1} = norm(max(0, p_j - q_j))``. Then ``P(y) = min(p_j, q_j)(y) + (1 - sum min(p_j, q_j)) p_{j+1}(y) = p_j(y)``
at each j, so the emitted token follows ``p``; after m rejections it is drawn from ``p_{m+1}`` (Jeon et al. 2024,
recursive speculative decoding). A child the draft gave probability 0 is no proposal (skipped).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as _lp

from .fast_paths import argmax
from .nucleus import SPARSE_LIMIT, Nucleus, draw, scattered
from .verification import Proposal, Tree

# logits processors that look at the scores only (not at the tokens so far): applied to all tree nodes at once
HISTORY_FREE_PROCESSORS = tuple(
    getattr(_lp, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "InfNanRemoveLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "LogitNormalization",
    )
    if hasattr(_lp, name)
)


def sampling_warpers(do_sample: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> LogitsProcessorList:
    """transformers' warpers for ``temperature`` / ``top_k`` / ``top_p`` (none when greedy; 0 and 1.0 disable)."""
    processors = LogitsProcessorList()
    if do_sample:
        if temperature != 1.0:
            processors.append(_lp.TemperatureLogitsWarper(temperature))
        if top_k > 0:
            processors.append(_lp.TopKLogitsWarper(top_k))
        if top_p < 1.0:
            processors.append(_lp.TopPLogitsWarper(top_p))
    return processors


class Processing:
    """The logits processors and the choice of a token (argmax, or a sample with ``generator``)."""

    def __init__(self, processors: LogitsProcessorList, do_sample: bool, generator: torch.Generator | None):
        self.processors, self.do_sample, self.generator = processors, do_sample, generator
        self.history_free = all(isinstance(p, HISTORY_FREE_PROCESSORS) for p in processors)
        # temperature / top-k / top-p sampling: the distribution from its support, without sorting the vocabulary
        self.nucleus = Nucleus.of(processors) if do_sample else None
        self.dummy_ids = None

    def reserve(self, rows: int, device: torch.device):
        """Placeholder histories for the history-free processors, for up to ``rows`` score rows at once."""
        self.dummy_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)

    @property
    def settings(self) -> tuple:
        """What decides the acceptance of a draft besides the text: sampling or not, and each processor's type and
        plain settings (temperature, top-p, ...)."""
        plain = (int, float, str, bool, type(None))
        return (self.do_sample,) + tuple(
            (type(p).__name__, tuple(sorted((k, v) for k, v in vars(p).items() if isinstance(v, plain)))) for p in self.processors
        )

    @property
    def temperature(self) -> float:
        """The sampling temperature (1.0 without a temperature warper): the draft samples its children at it."""
        return next((float(p.temperature) for p in self.processors if isinstance(p, _lp.TemperatureLogitsWarper)), 1.0)

    @property
    def walks(self) -> bool:
        """Whether acceptance walks the tree node by node (sampling, or processors that read each node's prefix)."""
        return self.do_sample or not self.history_free

    def __call__(self, scores: torch.Tensor, prefixes: Callable[[], list[torch.Tensor]] | None) -> torch.Tensor:
        """scores (n, V) float32 -> processed scores. ``prefixes()`` gives each row's token history (1, len_r)
        for processors that read it; score-only processors run once on all rows."""
        if len(self.processors) == 0:
            return scores
        if self.history_free:
            return self.processors(self.dummy_ids[: scores.shape[0]], scores)
        rows = [self.processors(ids, scores[i : i + 1]) for i, ids in enumerate(prefixes())]
        return torch.cat(rows, dim=0)

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """(n, V) processed scores -> (n,) tokens: argmax or a sample."""
        if not self.do_sample:
            return argmax(scores)
        probs = torch.softmax(scores.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)

    def next_token(self, raw: torch.Tensor, prefixes: Callable[[], list[torch.Tensor]] | None) -> torch.Tensor:
        """(n, V) raw scores -> (n,) tokens: processed, then argmax or a sample."""
        if self.nucleus is not None:
            return draw(*self.nucleus(raw), self.generator)
        return self.choose(self(raw.float(), prefixes))

    def distribution(self, raw: torch.Tensor, prefixes: Callable[[], list[torch.Tensor]] | None):
        """(n, V) raw scores -> (support (n, K), probabilities (n, K)) of the processed distribution when sampling; the
        support is None (and the probabilities (n, V)) where it is the vocabulary or too wide to gain from."""
        if self.nucleus is not None:
            idx, p = self.nucleus(raw)
            if idx.shape[1] <= SPARSE_LIMIT:
                return idx, p
            return None, scattered(idx, p, raw)
        return None, torch.softmax(self(raw.float(), prefixes), dim=-1)


def accept_greedy(tree: Tree, logits, keep, node_logits, process: Processing):
    """Greedy acceptance with history-free processors, all slots at once. ``logits``: the kept slots' (``keep`` as
    ``Verifier.logits_rows`` chose them). Returns (end slot (b,), bonus token (b,))."""
    b, S = tree.tok.shape
    all_slots = isinstance(keep, int) and keep == 0
    scores = logits
    if len(process.processors):
        V = logits.shape[-1]
        scores = process(logits.float().reshape(-1, V), None).view(b, -1, V)
    best = argmax(scores)  # (b, kept slots): the target's choice after each slot
    if not all_slots:
        kept = keep if isinstance(keep, torch.Tensor) else torch.tensor([S - 1], device=logits.device)
        best_all = torch.full((b, S), -1, dtype=torch.long, device=logits.device)
        best_all[:, kept] = best
        best = best_all  # -1 at slots without children (and without logits)
    correct = tree.tok == best.gather(1, tree.parent)
    correct[:, 0] = True
    on_good_path = ~(tree.anc & ~correct[:, None, :]).any(dim=-1)
    end = torch.where(on_good_path, tree.level, -1).argmax(dim=-1)  # deepest fully matched slot (b,)
    bonus = best.gather(1, end[:, None]).squeeze(1)
    if not all_slots and bool((bonus < 0).any()):
        leaf = node_logits(end)  # a path ended at a slot without children: its logits now
        if len(process.processors):
            leaf = process(leaf.float(), None)
        bonus = torch.where(bonus < 0, argmax(leaf), bonus)
    return end, bonus


def proposal_level(probs, support, cand, tok, cur, proposal: Proposal, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling at each row's node ``cur`` (b,) over its sampled children (``cand`` (b, S), in slot
    order, which is draw order): the target's processed distribution ``probs`` on ``support`` (b, K) (None: over the
    vocabulary). Returns (accepted child (b, S), at most one per row; the distribution the token is drawn from
    where every child was rejected (b, K))."""
    b = tok.shape[0]
    rows = torch.arange(b, device=tok.device)
    q = proposal.log_q[rows, proposal.slot_rows[rows, cur].clamp(min=0)].exp()  # (b, Vd) the draft's q at cur
    draft_of = proposal.draft_of
    ids = torch.arange(probs.shape[1], device=tok.device).expand(b, -1) if support is None else support
    in_q = ids < draft_of.numel()
    d = torch.where(in_q, draft_of[ids.clamp(max=draft_of.numel() - 1)], -1)
    q_sup = torch.where(d >= 0, q.gather(1, d.clamp(min=0)), 0.0)  # q on the support of p (b, K)
    child_d = draft_of[tok.clamp(max=draft_of.numel() - 1)]  # children are draft tokens
    q_child = torch.where(cand, q.gather(1, child_d.clamp(min=0)), 0.0)  # (b, S)
    p = probs
    left = torch.ones(b, device=tok.device)  # q's mass not yet drawn: q_j = q / left off the drawn children
    accept = torch.zeros_like(cand)
    rank = cand.cumsum(dim=-1) * cand  # 1..m: a child's place in the draw
    for j in range(1, int(rank.max()) + 1):
        at = rank == j  # (b, S) the j-th child, where a row has one
        slot = at.int().argmax(dim=-1)
        c = tok[rows, slot]
        q_c = q_child[rows, slot] / left.clamp_min(1e-30)
        hit = ids == c[:, None]  # (b, K)
        p_c = (p * hit).sum(dim=-1)
        live = at.any(dim=-1) & ~accept.any(dim=-1) & (q_c > 0)
        ratio = (p_c / q_c.clamp_min(1e-30)).clamp(max=1.0)
        ok = live & (torch.rand(b, device=tok.device, generator=generator) < ratio)
        accept |= at & ok[:, None]
        rejected = live & ~ok
        residual = (p - q_sup / left.clamp_min(1e-30)[:, None]).clamp_min(0.0)
        mass = residual.sum(dim=-1, keepdim=True)
        # p_{j+1} is 0 at a rejected child (p_j < q_j there), so q_sup need not drop it: only its mass leaves q
        p = torch.where(rejected[:, None] & (mass > 0), residual / mass.clamp_min(1e-30), p)
        left = torch.where(rejected, left - q_child[rows, slot], left)
    return accept, p


def kept_slots(tree: Tree, keep) -> torch.Tensor:
    """slot -> its row in the verification's kept logits (``keep`` as ``Verifier.logits_rows`` chose it), -1 where
    the verification computed none (S,)."""
    S = tree.tok.shape[1]
    dev = tree.tok.device
    index = torch.full((S,), -1, dtype=torch.long, device=dev)
    if isinstance(keep, int):  # the last `keep` slots (0: all)
        n = S if keep == 0 else keep
        index[S - n :] = torch.arange(n, device=dev)
    else:
        index[keep] = torch.arange(keep.shape[0], device=dev)
    return index


def accept_walk(tree: Tree, logits, keep, node_logits, process: Processing, history: Callable[[int, torch.Tensor], torch.Tensor]):
    """Walk the tree from the root, level by level (all rows at once): at each node accept one child by
    multi-candidate rejection sampling (greedy: the child equal to the argmax), else stop there and draw the bonus
    token. A node's logits come from the verification's kept slots (``logits``, ``keep``; a leaf's are computed when
    a walk stops there); the processors run on the b visited nodes of each level only, not on every kept slot.
    ``history(i, prefix)``: row i's tokens so far plus ``prefix`` (1, len), for processors that read it.
    Returns (end slot (b,), bonus token (b,))."""
    tok, parent = tree.tok, tree.parent
    dev = tok.device
    cpu = dev.type == "cpu"
    b, S = tok.shape
    arange_b = torch.arange(b, device=dev)
    slots = torch.arange(S, device=dev)
    is_child = (parent[:, None, :] == slots[None, :, None]) & (slots > 0)[None, None, :]  # (b, parent, child)
    if tree.duplicate is not None:  # candidates stay distinct: a repeated token is no second proposal
        is_child &= ~tree.duplicate[:, None, :]
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    bonus = torch.zeros(b, dtype=torch.long, device=dev)
    path: list[torch.Tensor] = []  # accepted tokens so far, one (b,) per level

    index = kept_slots(tree, keep)

    def level_raw():
        at = index[cur]
        if not cpu or bool((at >= 0).all()):  # (off the CPU every slot is kept: no host sync)
            raw = logits[arange_b, at]
        else:
            raw = logits[arange_b, at.clamp(min=0)]
            missing = ((at < 0) & alive).nonzero().squeeze(1)  # live rows at leaves: their logits now, theirs only
            if missing.numel():
                raw[missing] = node_logits(cur[missing], missing).to(raw.dtype)
        return raw.float()

    for _ in range(tree.depth + 1):
        prefix = torch.stack(path, dim=1) if path else torch.zeros(b, 0, dtype=torch.long, device=dev)

        def prefixes(prefix=prefix):  # each row's history, for processors that read it
            return [history(i, prefix[i]) for i in range(b)]

        cand = is_child[arange_b, cur] & alive[:, None]  # (b, S)
        if process.do_sample and tree.proposal is not None:
            support, probs = process.distribution(level_raw(), prefixes)
            accept, residual = proposal_level(probs, support, cand, tok, cur, tree.proposal, process.generator)
        elif process.do_sample:
            support, probs = process.distribution(level_raw(), prefixes)
            if support is None:
                p_tok = probs.gather(1, tok)
            else:  # a slot's token against the support (b, S, K): tokens outside it have probability 0
                match = tok[:, :, None] == support[:, None, :]
                p_tok = (match * probs[:, None, :]).sum(dim=-1)
            p_cand = p_tok * cand
            before = p_cand.cumsum(dim=-1) - p_cand  # mass of the earlier (rejected) children
            left = 1.0 - before
            ratio = torch.where(left > 0, p_cand / left.clamp_min(1e-30), 0.0)
            u = torch.rand(b, S, device=dev, generator=process.generator)
            accept = cand & (u < ratio)
        else:
            best = argmax(process(level_raw(), prefixes))
            accept = cand & (tok == best[:, None])
        has = accept.any(dim=-1)
        stop_here = alive & ~has
        if not cpu or bool(stop_here.any()):  # (no host sync per level on accelerators)
            if process.do_sample:
                if tree.proposal is None:  # residual: p without every (rejected) child of this node, renormalised
                    if support is None:
                        hit = torch.zeros_like(probs).scatter_add_(1, tok, cand.float()) > 0
                    else:
                        hit = (match & cand[:, :, None]).any(dim=1)
                    residual = probs.masked_fill(hit, 0.0)
                    empty = residual.sum(dim=-1, keepdim=True) <= 0
                    residual = torch.where(empty, probs, residual)
                drawn = torch.multinomial(residual, 1, generator=process.generator).squeeze(1)
                if support is not None:
                    drawn = support.gather(1, drawn[:, None]).squeeze(1)
            else:
                drawn = best
            bonus = torch.where(stop_here, drawn, bonus)
        nxt = accept.int().argmax(dim=-1)  # first accepted child
        cur = torch.where(alive & has, nxt, cur)
        path.append(tok.gather(1, cur[:, None]).squeeze(1))
        alive = alive & has
        if cpu and not bool(alive.any()):
            break
    return cur, bonus
