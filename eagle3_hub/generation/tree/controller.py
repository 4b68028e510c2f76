"""The adaptive tree: each step's shape chosen at run time to maximise expected tokens per second.

A step of depth d verifies ``nodes(d)`` draft nodes per row (the configured tree cut to its first d levels, nodes
in proportion) and yields per row ``1 + sum_{j<=d} prod_{i<=j} alpha_i``, where ``alpha_i`` is that row's running
chance (an exponential moving average) that draft position i is accepted once position i - 1 was. It costs
``(verify(rows, 1 + nodes(d) + lookup) + draft(rows, d)) * factor`` from the machine's measured costs
(``costs.py``); the factor, a median of each kind of step's measured time over the modelled, covers what the table
leaves out (sampling over every slot, host work, a context longer than the table's). It is a ratio, not an added
time, because what the table leaves out grows with the rows and slots: an added time learnt at 16 rows made a tree
for the last row of a batch look 4x dearer than it was, and the batch's slowest rows decoded alone without trees.
Steps where rows finish are not timed (the caches drop those rows: a cost no shape choice changes). The kinds are no tree,
a tree, a tree with the lookup branch, and a tree after steps without one (``catch_up``): a branch's slots form a
chain whose every slot needs logits, and a batch's branch of new width after new width runs far past the table's
tree of as many slots, an error a tree's factor hides; a tree after steps without one first reads their tokens
into the draft, so trying a tree again costs more than drafting on, and a batch near break-even that counted it as
a plain tree step kept trying trees that lost. What a catch-up costs beyond a tree step fades while no tree runs, as
the acceptance estimates relax: one slow catch-up does not stop a batch from trying trees for good. Depth 0 is no
tree: one token per row through the same forward. The controller picks the depth that would finish the batch soonest
if every step to the end took it: each row's tokens still to generate (up to max_new_tokens; an end-of-sequence token
may come sooner) over its expected tokens per step give the step at which it finishes, and the batch's steps cost less
as rows finish. A step costs nearly as much for one row as for several, so a tree that speeds up the rows that accept,
while the batch's slowest row gains little, leaves that row decoding alone at almost the full step's price; the most
tokens per second over the batch's rows counted those early finishers' tokens as if the batch were done sooner. With
one row the two are the same. Finished rows have left the batch and weigh nothing.

The lookup branch (tokens copied from the text so far) rides with a tree only when it pays: its slots are verified
for every row, which a CPU at batch 1 barely notices and a batch of 8 pays for at full price. Each row keeps a
running estimate of the tokens the branch adds beyond the tree's depth (``lookup_gain``); it starts, and relaxes
back while the branch is left out, towards an optimistic prior, so the branch is tried again now and then.

Within the step, a row whose positions are rarely reached gets a shallower tree (``row_depth``): its nodes are its
draft's best candidates of the first levels, alternatives near its root, where its acceptance happens. The node
count is the step's for every row (one rectangular verification).

While no tree is drafted nothing is learnt about acceptance, so each row's estimates relax towards the prior at
every step without a tree: a batch that stopped drafting tries a tree again after a while. A trial that does not pay
(the step after it chooses no tree again) halves the pace of that relaxing, down to 1/2**MAX_BACKOFF of it; a trial
that pays restores it. A batch where trees lose (a large batch sampling at T=1, say) then tries them ever more
rarely, while one where they pay now and then keeps finding them. Only which candidates are verified changes, so the
output is the target's whatever the controller chooses.

A choice of no tree stands for STANDING_STEPS steps while the same rows decode without trees and without a lookup
branch on offer: such a run changes nothing but the estimates' relaxing, which is applied at once (in closed form)
when it ends, with the steps' timings: on a CPU, weighing every shape at every step is a measurable share of a step
that no tree pays for (docs/benchmarks.md).

A run starts from what the last run of the same draft, target and sampling settings saw in this process
(``learnt_start``): per draft position, the share of the tried positions it accepted. A batch where trees lost then
starts without the trial trees that taught the last run so; its estimates still relax towards the prior, so trees
are tried again now and then, and a first run starts from the prior.

A cached table can be wrong for today's machine: measured while another process held a core, it makes every tree
look dear and the controller keeps choosing tiny trees. When the run's own steps are much faster than the table
(``stale``), the decoder measures the table again and hands it over (``replace_costs``), once per table per process.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from .config import TreeConfig
from .costs import StepCosts

PRIOR_ACCEPT = 0.6  # a new row's chance that a draft position is accepted (a draft trained for the target)
RATE = 0.1  # weight of a step's observation in the running averages
RELAX = 0.05  # per step without a tree: estimates move this share of the way back to the prior
MAX_BACKOFF = 4  # trials in a row that did not pay, each halving RELAX, before it stops slowing
RESIDUAL_STEPS = 9  # steps of each kind the factor is the median of
MIN_TIMED = 3  # steps of a kind timed before its own factor counts (a first step of a shape warms up)
MIN_REACH = 0.1  # a row's tree stops at the level it reaches with less than this chance
LOOKUP_PRIOR = 2.0  # tokens beyond the tree's depth a row's lookup branch adds per step, before it was tried
LOOKUP_RELAX = 0.01  # per step without the branch: the estimate moves this share of the way back to the prior
# Steps run this much faster than the table says (the median of a kind's last RESIDUAL_STEPS): the table was measured
# while the machine was busier than now. Noise only adds time, so only a faster run is evidence against a table.
STALE_RATIO = 0.6
STANDING_STEPS = 8  # steps a choice of no tree stands before the shapes are weighed again
MIN_LEARNT = 8  # row-steps that tried a draft position before a run's share of it accepted starts the next run
CONTEXT_BUCKET = 16  # tokens of context over which a step's modelled seconds are taken as one
KINDS = ("none", "tree", "lookup", "catch_up")  # the kinds of step whose factors are kept apart


def step_kind(depth: int, lookup: int = 0, behind: bool = False) -> str:
    """``behind``: the draft has steps without a tree still to read."""
    return "none" if depth < 1 else "catch_up" if behind else "lookup" if lookup else "tree"


@dataclass(frozen=True)
class StepShape:
    """One step's tree: ``depth`` levels (0: no tree), ``top_k`` children per expanded node, ``total_tokens``
    nodes per row, ``row_depth`` (per active row, or None: ``depth``) the levels each row's nodes come from."""

    depth: int
    top_k: int
    total_tokens: int
    row_depth: tuple[int, ...] | None = None
    lookup: int = 0  # the lookup branch's tokens riding with the tree

    @property
    def label(self) -> str:
        if self.depth == 0:
            return "none"
        return f"{self.depth}/{self.top_k}/{self.total_tokens}" + ("+lookup" if self.lookup else "")


def nodes_at(config: TreeConfig, depth: int) -> int:
    """Nodes of the configured tree cut to ``depth`` levels: its nodes in proportion (at least one per level),
    no more than it has or ``depth`` levels of ``tree_top_k`` children can offer."""
    if depth < 1:
        return 0
    k = config.tree_top_k
    pool = k + (depth - 1) * k * k
    return min(config.total_tokens, pool, max(depth, math.ceil(config.total_tokens * depth / config.depth)))


def levels_for(nodes: int, top_k: int) -> int:
    """The fewest levels whose candidates (``top_k + (levels - 1) * top_k**2``) hold ``nodes``."""
    if nodes <= top_k:
        return 1
    return 1 + math.ceil((nodes - top_k) / (top_k * top_k))


class TreeController:
    """Per-row acceptance estimates (``alpha``: original row -> one per draft position) and the choice of each
    step's ``StepShape``. ``row_depths``: whether rows may get shallower trees than the step's (not with the
    fixed-shape draft graph)."""

    def __init__(
        self,
        config: TreeConfig,
        costs: StepCosts,
        rows: int,
        row_depths: bool = True,
        prior: float = PRIOR_ACCEPT,
        start: np.ndarray | None = None,
    ):
        self.config, self.costs, self.row_depths, self.prior = config, costs, row_depths, prior
        # NumPy, not torch: a step reads and updates a few numbers per row, where a torch op costs microseconds
        # (``start``: per draft position, every row's first estimate; the estimates relax towards ``prior``)
        self.alpha = np.tile(start, (rows, 1)) if start is not None else np.full((rows, config.depth), prior)
        self.tried, self.hits = np.zeros(config.depth), np.zeros(config.depth)  # over the run's rows and trees
        self.lookup_gain = np.full(rows, LOOKUP_PRIOR)
        # measured over modelled seconds per step, by kind (``step_kind``): the median of the last RESIDUAL_STEPS, so
        # that a one-off (a first shape's warm-up, another process) does not decide
        self._forget_times()
        self.chosen: dict[str, int] = {}
        self.catch_up_weight = 1.0  # the share of the catch-up's extra factor still counted (fades without trees)
        self.failed_trials = 0  # trials in a row (trees after steps without one) that the next step did not follow
        self.trial = False  # the step just observed was a trial: the next choice tells whether it paid
        self.standing = 0  # steps the last choice of no tree still stands for ``standing_rows``
        self.standing_rows: list[int] | None = None
        self.weighed = False  # the last choice weighed the shapes (not a standing one)
        self._unapplied = 0  # steps without a tree observed for ``standing_rows`` whose relaxing is not applied yet
        self._untimed: list[tuple[float, int, int | None]] = []  # their (seconds, rows, context), oldest first

    def _forget_times(self):
        self._memo: dict[tuple, float] = {}
        self.factor = {kind: 1.0 for kind in KINDS}
        self.recent: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}  # (measured, modelled) s

    def factor_of(self, depth: int, lookup: int = 0, behind: bool = False) -> float:
        """The factor of a step's kind; a kind timed fewer than MIN_TIMED times borrows the tree's, else no tree's,
        else 1 (a lookup step is a tree step; one slow first tree step, taken alone, can make trees look dear for the
        rest of a run that then never drafts). A catch-up step (``behind``) is a tree or lookup step plus the
        catch-up's extra, weighed by ``catch_up_weight``."""
        kind = step_kind(depth, lookup)
        plain = next((self.factor[k] for k in (kind, step_kind(depth), "none") if len(self.recent[k]) >= MIN_TIMED), 1.0)
        if not (behind and depth >= 1 and len(self.recent["catch_up"]) >= MIN_TIMED):
            return plain
        return plain + self.catch_up_weight * max(self.factor["catch_up"] - self.factor["tree"], 0.0)

    # ------------------------------------------------------------------ the choice
    def shape(self, depth: int) -> StepShape:
        n = nodes_at(self.config, depth)
        return StepShape(depth, min(self.config.tree_top_k, max(n, 1)), n)

    def expected_tokens(self, rows: list[int], depth: int) -> np.ndarray:
        """(len(rows),) tokens each row is expected to commit in a step of ``depth`` levels (the bonus token
        included)."""
        if depth < 1:
            return np.ones(len(rows))
        reach = self.alpha[rows, :depth].cumprod(axis=1)
        return 1.0 + reach.sum(axis=1)

    def step_seconds(self, rows: int, depth: int, lookup: int = 0, context: int | None = None) -> float:
        """Modelled seconds of a step of ``depth`` levels (with a lookup branch of ``lookup`` tokens) for ``rows``
        after ``context`` tokens (None: the table's)."""
        if depth < 1:
            return self.costs.verify_s(rows, 1, context)
        s = self.shape(depth)
        return self.costs.verify_s(rows, 1 + s.total_tokens + lookup, context) + self.costs.draft_s(rows, depth, context)

    def choose(
        self,
        rows: list[int],
        lookup: int = 0,
        max_depth: int | None = None,
        proposed: list[bool] | None = None,
        behind: bool = False,
        context: int | None = None,
        remaining: list[int] | None = None,
    ) -> StepShape:
        """The shape of the next step for the active ``rows`` (original indices): the depth, and whether the
        lookup branch of ``lookup`` tokens (held by the rows where ``proposed``, default all) rides with the tree,
        that would finish the batch soonest if every step to the end took it; ``remaining``: each row's tokens
        still to generate (None: the most expected tokens per second);
        ``behind``: a tree would first read steps without one; ``context``: the tokens the step attends to."""
        if self.standing and behind and not lookup and rows == self.standing_rows:
            self.standing -= 1
            self.weighed = False
            self.chosen["none"] += 1
            return self.shape(0)
        self._apply_standing()
        self.weighed = True
        top = self.config.depth if max_depth is None else min(self.config.depth, max_depth)
        gain = np.zeros(len(rows))
        if lookup:
            held = np.array([True] * len(rows) if proposed is None else proposed, dtype=bool)
            gain = np.where(held, self.lookup_gain[rows], 0.0)
        left = None if remaining is None else np.array(remaining, dtype=np.float64)
        best, best_lookup, best_time = 0, 0, math.inf
        for depth in range(top + 1):
            tokens = self.expected_tokens(rows, depth)
            for m in (0, lookup) if depth >= 1 and lookup else (0,):
                per_row = tokens + gain if m else tokens
                if left is None or len(rows) == 1:  # seconds per token (one row: the same choice as finishing soonest)
                    seconds = self.step_seconds(len(rows), depth, m, context) / float(per_row.sum())
                else:
                    seconds = self.finish_seconds(left / per_row, depth, m, context)
                seconds *= self.factor_of(depth, m, behind)
                if seconds < best_time:
                    best, best_lookup, best_time = depth, m, seconds
        shape = self.shape(best)
        if best >= 1:
            row_depth = self._row_depths(rows, shape) if self.row_depths else None
            shape = StepShape(shape.depth, shape.top_k, shape.total_tokens, row_depth, best_lookup)
        if self.trial:  # a trial followed by no tree did not pay: relax more slowly until one does
            self.failed_trials = 0 if best >= 1 else self.failed_trials + 1
            self.trial = False
        self.standing, self.standing_rows = (STANDING_STEPS - 1, list(rows)) if best == 0 else (0, None)
        self.chosen[shape.label] = self.chosen.get(shape.label, 0) + 1
        return shape

    def finish_seconds(self, steps: np.ndarray, depth: int, lookup: int, context: int | None) -> float:
        """Modelled seconds until every row is done, each row taking ``steps`` (per row) more steps of this shape:
        the batch shrinks as rows finish, so a shape under which rows part far apart leaves its slowest rows
        decoding in small, dear steps (a step's cost falls much less than its rows)."""
        ends = np.sort(steps).tolist()
        total, done = 0.0, 0.0
        for i, end in enumerate(ends):
            if end > done:
                total += (end - done) * self._step_seconds_memo(len(ends) - i, depth, lookup, context)
                done = end
        return total

    def _step_seconds_memo(self, rows: int, depth: int, lookup: int, context: int | None) -> float:
        """``step_seconds``, remembered per CONTEXT_BUCKET tokens of context (it is called per row count, depth and
        lookup at every step)."""
        key = (rows, depth, lookup, None if context is None else context // CONTEXT_BUCKET)
        if key not in self._memo:
            self._memo[key] = self.step_seconds(rows, depth, lookup, context)
        return self._memo[key]

    @property
    def relax(self) -> float:
        """The share of the way back to the prior the estimates move per step without a tree."""
        return RELAX * 0.5 ** min(self.failed_trials, MAX_BACKOFF)

    def _row_depths(self, rows: list[int], shape: StepShape) -> tuple[int, ...] | None:
        """Per row: the deepest level it reaches with at least MIN_REACH chance, no shallower than the levels
        that hold the step's nodes; None when every row keeps the step's depth."""
        reach = self.alpha[rows, : shape.depth].cumprod(axis=1)
        deep = np.clip((reach >= MIN_REACH).sum(axis=1), levels_for(shape.total_tokens, shape.top_k), shape.depth)
        depths = tuple(int(d) for d in deep)
        return None if all(d == shape.depth for d in depths) else depths

    # ------------------------------------------------------------------ learning
    def observe(
        self,
        rows: list[int],
        shape: StepShape,
        accepted: list[int],
        seconds: float | None = None,
        looked_up: list[bool] | None = None,
        proposed: list[bool] | None = None,
        behind: bool = False,
        context: int | None = None,
    ):
        """After a step with ``shape`` over ``rows``: ``accepted`` draft tokens per row, ``looked_up`` whether its
        path ran along the lookup branch (held by the rows where ``proposed``); ``seconds`` the step's measured
        time (updates the factor of its kind; None: not timed); ``behind``: the step first read steps without a
        tree."""
        depth = shape.depth
        if depth < 1 and not shape.lookup and rows == self.standing_rows:  # applied with the run's other steps
            self._unapplied += 1
            if seconds is not None:
                self._untimed.append((seconds, len(rows), context))
                del self._untimed[:-RESIDUAL_STEPS]
            self.trial = False
            return
        self._apply_standing()
        row_depth = shape.row_depth or (depth,) * len(rows)
        if depth >= 1:
            for r, a, d in zip(rows, accepted, row_depth):
                reached = min(a + 1, d)  # positions 1..reached were tried; the first a accepted
                hit = (np.arange(reached) < a).astype(np.float64)
                self.alpha[r, :reached] += RATE * (hit - self.alpha[r, :reached])
                self.tried[:reached] += 1
                self.hits[:reached] += hit
        else:
            self.alpha[rows] += self.relax * (self.prior - self.alpha[rows])
            self.catch_up_weight *= 1.0 - self.relax
        if shape.lookup:
            for i, (r, a, d) in enumerate(zip(rows, accepted, row_depth)):
                if proposed is None or proposed[i]:
                    extra = max(a - d, 0) if looked_up is not None and looked_up[i] else 0
                    self.lookup_gain[r] += RATE * (extra - self.lookup_gain[r])
        else:
            self.lookup_gain[rows] += LOOKUP_RELAX * (LOOKUP_PRIOR - self.lookup_gain[rows])
        if seconds is not None:
            kind = step_kind(depth, shape.lookup, behind)
            if kind == "catch_up":
                self.catch_up_weight = 1.0
            self._time(kind, [(seconds, self.step_seconds(len(rows), depth, shape.lookup, context))])
        self.trial = depth >= 1 and behind

    def _time(self, kind: str, steps: list[tuple[float, float]]):
        """Add (measured, modelled) seconds of steps of ``kind``; its factor is the median of the latest."""
        recent = self.recent[kind]
        recent.extend(steps)
        del recent[:-RESIDUAL_STEPS]
        self.factor[kind] = _median([t / max(m, 1e-12) for t, m in recent])

    def _apply_standing(self):
        """Apply the steps without a tree observed during a standing choice: n steps of relaxing at once, and their
        timings."""
        n, rows = self._unapplied, self.standing_rows
        if n:
            keep = (1.0 - self.relax) ** n
            self.alpha[rows] = self.prior + (self.alpha[rows] - self.prior) * keep
            self.catch_up_weight *= keep
            gain_keep = (1.0 - LOOKUP_RELAX) ** n
            self.lookup_gain[rows] = LOOKUP_PRIOR + (self.lookup_gain[rows] - LOOKUP_PRIOR) * gain_keep
            self._unapplied = 0
        if self._untimed:
            self._time("none", [(t, self.step_seconds(r, 0, 0, c)) for t, r, c in self._untimed])
            self._untimed = []

    def learnt(self) -> np.ndarray | None:
        """Per draft position, the share of the run's tried positions that were accepted (the prior where fewer than
        MIN_LEARNT were tried); None when the first position was tried fewer times."""
        if self.tried[0] < MIN_LEARNT:
            return None
        share = self.hits / np.maximum(self.tried, 1)
        return np.where(self.tried >= MIN_LEARNT, share, self.prior)

    @property
    def stale(self) -> bool:
        """Whether the run's steps of either kind are much faster than the cost table says (its last
        RESIDUAL_STEPS of them, median below STALE_RATIO of the modelled seconds)."""
        self._apply_standing()  # a standing choice's steps count too
        return any(len(self.recent[k]) >= RESIDUAL_STEPS and self.factor[k] < STALE_RATIO for k in KINDS)

    def replace_costs(self, costs: StepCosts):
        """Continue with ``costs`` (measured again): what was learnt about the old table's errors is dropped, the
        acceptance estimates are kept."""
        self._apply_standing()
        self.costs = costs
        self._forget_times()


# per draft, per target: the acceptance the last run of each (depth, sampling settings) saw (weak keys: a model that
# is freed takes its entries with it)
_learnt: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def learnt_start(draft, target, depth: int, settings: tuple) -> np.ndarray | None:
    """The acceptance per draft position that the last run of ``draft`` on ``target`` with ``depth`` levels and these
    sampling ``settings`` saw in this process, or None."""
    return _learnt.get(draft, {}).get(target, {}).get((depth, settings))


def remember_learnt(draft, target, depth: int, settings: tuple, controller: TreeController) -> None:
    """Keep what ``controller``'s run saw, for the next run of the same pair and settings (a run that tried too
    few positions leaves the last one's)."""
    seen = controller.learnt()
    if seen is not None:
        by_target = _learnt.setdefault(draft, weakref.WeakKeyDictionary())
        by_target.setdefault(target, {})[(depth, settings)] = seen


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]
