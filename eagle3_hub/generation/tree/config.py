"""``TreeConfig``: the shape of the draft tree, with defaults per device (how they were chosen and how to tune
them: docs/tree-decoding.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

# depth: draft levels; top_k: children per expanded node; total_tokens: tree nodes verified per target forward (root
# excluded); lookup_tokens: the lookup branch after a 3-token match; min_node_prob: keep only nodes whose
# cumulative draft probability reaches it; grow_min_prob: draft a further level only while a frontier node reaches it.
# A CPU verification costs about linearly in its tokens, so its trees are small and pruned; in bfloat16 on a CPU
# with bf16 units it is nearly flat, so wider unpruned trees pay; on CUDA it is flat up to large trees and the draft
# runs as a CUDA graph of one shape (no pruning, which changes the shape).
TREE_DEFAULTS: dict[str, dict[str, float]] = {
    "cpu": {"depth": 3, "top_k": 4, "total_tokens": 8, "lookup_tokens": 20, "min_node_prob": 0.1, "grow_min_prob": 0.0},
    "cpu-bfloat16": {"depth": 3, "top_k": 8, "total_tokens": 6, "lookup_tokens": 20, "min_node_prob": 0.0, "grow_min_prob": 0.0},
    # sampling accepts fewer tokens per node than greedy, and a wider tree keeps more of the target's mass
    "cpu-bfloat16-sampling": {
        "depth": 3,
        "top_k": 8,
        "total_tokens": 10,
        "lookup_tokens": 0,
        "min_node_prob": 0.0,
        "grow_min_prob": 0.0,
    },
    "cuda": {"depth": 6, "top_k": 10, "total_tokens": 60, "lookup_tokens": 20, "min_node_prob": 0.0, "grow_min_prob": 0.0},
}
# Smaller trees for batches, from a batch size on: a CPU verifies b rows at about b times one row's cost, so each
# row's tree must be cheaper (measured at batch 4 on a bf16 CPU; other rows keep their batch-1 trees).
BATCH_TREE_DEFAULTS: dict[str, dict[int, dict[str, float]]] = {
    "cpu-bfloat16": {4: {"depth": 2, "top_k": 8, "total_tokens": 4}},
    "cpu-bfloat16-sampling": {4: {"depth": 2, "top_k": 8, "total_tokens": 8}},
}


def tree_defaults(
    device: torch.device | str, dtype: torch.dtype | None = None, do_sample: bool = False, batch: int = 1
) -> dict[str, float]:
    """Default ``depth`` / ``top_k`` / ``total_tokens`` / ``lookup_tokens`` / ``min_node_prob`` / ``grow_min_prob``
    for a device, the target's dtype, the mode and the batch size (``TREE_DEFAULTS``: a CPU's differ in bfloat16; a
    ``-sampling`` row, where one was measured, when sampling; CUDA's for other accelerators; then the
    ``BATCH_TREE_DEFAULTS`` of the largest batch size up to ``batch``)."""
    kind = torch.device(device).type
    if kind == "cpu" and dtype == torch.bfloat16:
        kind = "cpu-bfloat16"
    if do_sample and f"{kind}-sampling" in TREE_DEFAULTS:
        kind = f"{kind}-sampling"
    shape = dict(TREE_DEFAULTS.get(kind, TREE_DEFAULTS["cuda"]))
    for size, smaller in sorted(BATCH_TREE_DEFAULTS.get(kind, {}).items()):
        if batch >= size:
            shape.update(smaller)
    return shape


def check_setting(name: str, value) -> None:
    """The range of one tree setting, alone (how settings combine is ``TreeConfig._check``'s): a ValueError naming
    it. ``eagle3-hub bench`` checks its lists with it before running."""
    if name in ("depth", "tree_top_k", "total_tokens"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    elif name == "lookup_tokens":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"lookup_tokens must be a non-negative integer (0: no lookup branch), got {value!r}")
    elif name in ("min_node_prob", "grow_min_prob"):
        zero = "always total_tokens nodes" if name == "min_node_prob" else "always `depth` levels"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{name} must be a probability in [0, 1) (0: {zero}), got {value!r}")


@dataclass(frozen=True)
class TreeConfig:
    """The tree's shape; ``None`` = the default for the target's device and dtype (``tree_defaults``).

    depth: draft levels. tree_top_k: children per expanded node. total_tokens: tree nodes per verification (root
        excluded); at most ``tree_top_k + (depth - 1) * tree_top_k**2``.
    lookup_tokens: length of the lookup branch (tokens copied from the text so far, 0 = none) after a 3-token
        match, less after shorter ones (``LOOKUP_SHARE``). When sampling, each copied token is one more one-hot
        candidate at its node (merged with an equal drafted child), so the walk stays lossless; default 0 there.
    min_node_prob: keep only the nodes whose cumulative draft probability reaches it (at least one, at most
        ``total_tokens``); 0 = always ``total_tokens``.
    grow_min_prob: draft a further level only while some frontier node's cumulative draft probability reaches it:
        deep trees where the draft is sure, shallow ones where it is not; 0 = always ``depth`` levels.
    draft_graph: run the draft's levels on fixed shapes, as one CUDA graph per (rows, depth) on CUDA (launches,
        not work, cost the time of a small draft at batch 1); default on CUDA only. It replays one tree shape, so
        ``min_node_prob`` and ``grow_min_prob`` default to 0 with it.
    adaptive: choose each step's tree at run time (``controller.py``): from each row's running acceptance by draft
        position and the machine's measured costs, the depth (and its nodes) with the most expected tokens per
        second, down to no tree (one token per row); the shape above is then the largest it may choose. Default
        (``None``): on, unless ``depth``, ``tree_top_k`` or ``total_tokens`` is given, which asks for that fixed
        shape; ``True`` with a shape makes it the largest; ``False`` is the fixed shape, given or default.
    draft_sampling: when sampling, each node's children are drawn from the draft's distribution (without
        replacement, at ``drafting.DRAW_TEMPERATURE_SHARE`` of the sampling temperature) and acceptance reads the
        draft's probabilities (recursive rejection sampling) instead of taking the draft's most probable tokens as
        one-hot proposals: both lossless; drawn children are accepted more often where the target's distribution is
        wide. Default: on when sampling, off with a lookup branch (its copied tokens have no draft probability, so
        it is refused there) and with ``draft_graph`` (it runs there, its draws' noise an input of the graph, when
        asked for). No effect on greedy decoding.
    draft_int8: the draft's products on a CPU run on int8 weights (torch's dynamic int8 kernels,
        ``fast_paths.int8_draft``; a float32 draft): a quarter of the bytes, at a small cost in the draft's guesses
        and none in the output, which the target verifies. Default off; a CPU only.
    """

    depth: int | None = None
    tree_top_k: int | None = None
    total_tokens: int | None = None
    lookup_tokens: int | None = None
    min_node_prob: float | None = None
    grow_min_prob: float | None = None
    draft_graph: bool | None = None
    adaptive: bool | None = None
    draft_sampling: bool | None = None
    draft_int8: bool | None = None

    def replace(self, **overrides) -> TreeConfig:
        """A copy with the given fields set (``None`` values are ignored: they keep this config's)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def resolve(self, device: torch.device, dtype: torch.dtype, do_sample: bool, draft_vocab: int, batch: int = 1) -> TreeConfig:
        """Every field set (the defaults for the device, dtype, mode and batch size where ``None``) and checked: one
        clear ``ValueError`` per problem."""
        defaults = tree_defaults(device, dtype, do_sample, batch)
        graph = device.type == "cuda" if self.draft_graph is None else self.draft_graph
        lookup = (0 if do_sample else int(defaults["lookup_tokens"])) if self.lookup_tokens is None else self.lookup_tokens
        min_p = (0.0 if graph else defaults["min_node_prob"]) if self.min_node_prob is None else self.min_node_prob
        grow_p = (0.0 if graph else defaults["grow_min_prob"]) if self.grow_min_prob is None else self.grow_min_prob
        c = TreeConfig(
            depth=int(defaults["depth"]) if self.depth is None else self.depth,
            tree_top_k=int(defaults["top_k"]) if self.tree_top_k is None else self.tree_top_k,
            total_tokens=int(defaults["total_tokens"]) if self.total_tokens is None else self.total_tokens,
            lookup_tokens=lookup,
            min_node_prob=min_p,
            grow_min_prob=grow_p,
            draft_graph=graph,
            adaptive=(self.depth is None and self.tree_top_k is None and self.total_tokens is None)
            if self.adaptive is None
            else self.adaptive,
            draft_sampling=(do_sample and not graph and not lookup) if self.draft_sampling is None else self.draft_sampling,
            draft_int8=bool(self.draft_int8),
        )
        if c.draft_int8 and device.type != "cpu":
            raise ValueError(
                f"draft_int8 runs the draft on a CPU's int8 kernels; this target is on {device}: set draft_int8=False."
            )
        c._check(draft_vocab, do_sample)
        return replace(
            c,
            min_node_prob=float(min_p),
            grow_min_prob=float(grow_p),
            draft_graph=bool(c.draft_graph),
            adaptive=bool(c.adaptive),
            draft_sampling=bool(c.draft_sampling and do_sample),
        )

    def _check(self, draft_vocab: int, do_sample: bool):
        for name in ("depth", "tree_top_k", "total_tokens", "lookup_tokens", "min_node_prob", "grow_min_prob"):
            check_setting(name, getattr(self, name))
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be True, False or None (None: on unless a shape is given), got {self.adaptive!r}")
        if not isinstance(self.draft_sampling, bool):
            raise ValueError(f"draft_sampling must be True, False or None (None: on when sampling), got {self.draft_sampling!r}")
        if self.draft_sampling and do_sample and self.lookup_tokens:
            raise ValueError(
                "draft_sampling reads the draft's probability of each child, and the lookup branch's copied tokens have "
                "none: set lookup_tokens=0 or draft_sampling=False."
            )
        k, depth, total = self.tree_top_k, self.depth, self.total_tokens
        assert k is not None and depth is not None and total is not None  # positive integers (checked above)
        if k > draft_vocab:
            raise ValueError(f"tree_top_k={k} exceeds the draft vocabulary ({draft_vocab} tokens)")
        pool = k + (depth - 1) * k * k
        if total > pool:
            raise ValueError(
                f"total_tokens={self.total_tokens} is larger than the {pool} candidates a tree of depth={depth} and "
                f"tree_top_k={k} proposes (top_k + (depth - 1) * top_k**2): lower total_tokens or raise depth/top_k."
            )
        for name in ("min_node_prob", "grow_min_prob"):
            if getattr(self, name) > 0 and self.draft_graph:
                raise ValueError(
                    f"{name} sizes each tree anew, and draft_graph replays one tree shape: set {name}=0 or draft_graph=False."
                )

    def as_stats(self) -> dict:
        """The shape as ``TreeDecodingStats.tree`` reports it (``TREE_DEFAULTS``' key names)."""
        shape = asdict(self)
        shape["top_k"] = shape.pop("tree_top_k")
        del shape["draft_graph"]
        return {
            k: shape[k]
            for k in (
                "depth",
                "top_k",
                "total_tokens",
                "lookup_tokens",
                "min_node_prob",
                "grow_min_prob",
                "adaptive",
                "draft_sampling",
                "draft_int8",
            )
        }
