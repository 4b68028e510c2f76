"""Verification: one target forward over ``[root, tree nodes]`` under the tree attention mask, with the logits of
the slots acceptance reads, and the target cache compacted to the accepted path afterwards."""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from .caches import TreeKVCache
from .fast_paths import LEAN_FORWARD_DEVICES, LOGITS_ROWS_MULTIPLE, LOGITS_SUBSET_DEVICES, packed_head
from .lean_forward import LeanTargetForward
from .masks import additive_mask, ancestors, attention_layout, layer_type_masks
from .outputs import PhaseClock, TreeDecodingStats

# per target: whether its output head gives its forward's own logits, while the head is the same module with the
# same weight at the same version. Checked at a run's first prefill; later prefills then ask the model for no
# logits and compute the last slot's from a fresh row (transformers hands its head a strided (b, 1, H) slice,
# which takes a slow path that copies the whole head on a CPU).
_head_verdicts: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


def forward_cache_kwarg(model) -> str:
    """transformers 5 calls the cache argument ``cache``; earlier releases ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass
class Proposal:
    """The draft's distributions of a sampled tree (``draft_sampling``): log-probabilities at the sampling
    temperature over the draft vocabulary of the root and of each node the draft expanded (b, R, Vd); each slot's row
    there (b, S), -1 at a leaf; and the draft id of each target id (V,), -1 outside the draft vocabulary."""

    log_q: torch.Tensor
    slot_rows: torch.Tensor
    draft_of: torch.Tensor


@dataclass
class Tree:
    """The slots of one verification, per row (b rows, S = N + 1 slots): slot 0 is the root, slots 1..n_tree the draft
    tree's nodes, the rest the lookup branch; parents precede their children. The lookup branch is merged into the
    draft tree: while its tokens follow a drafted path, its next token hangs under that path's node (so a path
    accepted through drafted nodes can go on along the copied text); a lookup token equal to a drafted sibling stays
    as a slot (shapes stay rectangular) marked ``duplicate``, never a candidate of its own."""

    tok: torch.Tensor  # (b, S) target token ids
    parent: torch.Tensor  # (b, S) parent slot (the root's: 0)
    level: torch.Tensor  # (b, S) depth below the root
    anc: torch.Tensor  # (b, S, S) anc[r, i, j]: slot j is on the path root -> i (i included)
    n_tree: int
    depth: int  # at least the deepest slot's level
    duplicate: torch.Tensor | None = None  # (b, S) a slot whose token an earlier sibling holds (None: none can)
    proposal: Proposal | None = None  # the children were sampled from the draft (None: its top-k, one-hot)

    @classmethod
    def build(
        cls, root, node_tok, node_parent, node_depth, chain: torch.Tensor | None, depth: int, proposal: Proposal | None = None
    ) -> Tree:
        b, n_tree = node_tok.shape
        dev = root.device
        duplicate = None
        if chain is not None:  # chain token j is slot n_tree + j + 1, at level j + 1
            m = chain.shape[1]
            chain_parent = torch.empty(b, m, dtype=torch.long, device=dev)
            at = torch.zeros(b, dtype=torch.long, device=dev)  # the slot chain token j hangs under (root first)
            drafted = torch.arange(1, n_tree + 1, device=dev)
            for j in range(m):
                chain_parent[:, j] = at
                same = (node_tok == chain[:, j : j + 1]) & (node_parent == at[:, None])  # (b, n_tree)
                # along a drafted path the copy continues under the drafted node; off it, under its own slot
                at = torch.where(same.any(dim=1), (same.long() * drafted).amax(dim=1), n_tree + j + 1)
            node_tok = torch.cat([node_tok, chain], dim=1)
            node_parent = torch.cat([node_parent, chain_parent], dim=1)
            node_depth = torch.cat([node_depth, torch.arange(1, m + 1, device=dev).expand(b, m)], dim=1)
            depth = max(depth, m)
        zero = torch.zeros(b, 1, dtype=torch.long, device=dev)
        tok = torch.cat([root[:, None], node_tok], dim=1)
        parent = torch.cat([zero, node_parent], dim=1)
        level = torch.cat([zero, node_depth], dim=1)
        if chain is not None:
            S = tok.shape[1]
            earlier = torch.ones(S, S, dtype=torch.bool, device=dev).tril(-1)  # [i, j]: j < i
            sibling = (parent[:, :, None] == parent[:, None, :]) & (tok[:, :, None] == tok[:, None, :]) & earlier
            duplicate = sibling.any(dim=-1)
            duplicate[:, 0] = False
        return cls(tok, parent, level, ancestors(parent, depth), n_tree, depth, duplicate, proposal)

    @property
    def N(self) -> int:
        """Nodes under the root."""
        return self.tok.shape[1] - 1


class Verifier:
    """The target's side of a run: its cache (committed slots plus per-row validity and positions; slots a row
    did not accept are holes masked out of every later attention) and its forwards. Ht: target hidden size,
    F = 3 * Ht: the concatenated aux features the draft reads."""

    def __init__(self, target, aux_layer_ids, stats: TreeDecodingStats, clock: PhaseClock):
        self.target, self.stats, self.clock = target, stats, clock
        cfg = target.config.get_text_config()
        self.window, self.mask_kind = attention_layout(cfg)
        self.aux = [int(i) + 1 for i in aux_layer_ids]  # hidden_states index = layer output + 1
        self.num_layers = cfg.num_hidden_layers
        weight = target.get_input_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        self.cache_kw = forward_cache_kwarg(target)
        self.head = target.get_output_embeddings()
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        # logits of the needed tree slots only (LOGITS_SUBSET_DEVICES), if the head reproduces the model's own
        # logits (checked at the prefill)
        self.lazy_logits = False
        self.packed_head = None  # the head for those logits where oneDNN can, else self.head
        self.lean = None  # the target's forward for verifications where LeanTargetForward reproduces it
        self.no_slots = torch.zeros(0, dtype=torch.long, device=self.device)

    def start(self, capacity: int):
        self.cache = TreeKVCache(self.num_layers, capacity)

    def select_rows(self, idx: torch.Tensor):
        self.cache.select_rows(idx)
        self.valid = self.valid.index_select(0, idx)
        self.pos = self.pos.index_select(0, idx)

    # ------------------------------------------------------------------ forwards
    def forward(self, ids, position_ids, mask, logits_to_keep: int | torch.Tensor, cache=None):
        """-> (logits of the kept slots, aux features (b, s, F), final normed hidden states (b, s, Ht))."""
        t0 = self.clock.now()
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        if self.lean is not None and cache is None:  # a verification through the lean forward: logits from `last`
            last, hidden_states = self.lean(ids, position_ids, mask, self.cache)
            logits = self.lm_head(last[:, kept])
        else:
            # a subset of slots with the packed head: the model computes no logits, the head those of the subset
            own_head = self.packed_head is not None and not (isinstance(logits_to_keep, int) and logits_to_keep == 0)
            out = self.target(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=self.no_slots if own_head else logits_to_keep,
                **{self.cache_kw: self.cache if cache is None else cache},
            )
            hidden_states = out.hidden_states
            last = hidden_states[-1]
            logits = self.lm_head(last[:, kept]) if own_head else out.logits
        feats = torch.cat([hidden_states[i] for i in self.aux], dim=-1) if self.aux else None  # (b, s, F)
        self.clock.add("verify_time_s", t0, self.clock.now())
        self.stats.target_forwards += 1
        return logits, feats, last

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits from its final (normed) hidden states, (n, Ht) -> (n, V)."""
        logits = (self.packed_head or self.head)(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def prefill(self, input_ids, attention_mask, holes: bool):
        """The prompt through the target (transformers builds the causal / padding / sliding-window masks from the
        2D mask, as in plain generation). Returns the last slot's logits (b, 1, V), the features (b, L, F), the
        positions and the validity (b, L) of the prompt's slots; chooses the fast paths of this run's verifications."""
        valid = attention_mask.bool()
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)  # (b, L)
        subset = self.head is not None and self.device.type in LOGITS_SUBSET_DEVICES
        head_key = (id(self.head), self.head.weight.data_ptr(), self.head.weight._version) if subset else None
        verdict = _head_verdicts.get(self.target) if subset else None
        trusted = verdict == (head_key, True)  # the head is known to give the model's logits: none from the model
        prefill_cache = DynamicCache()  # no config: every layer keeps all its keys
        # the last slot by index, not `1`: the model then hands its head a contiguous (b, 1, H) copy, as in a decoding
        # step (a strided slice of a frozen head runs as a batched product that copies the weight once per row)
        last_slot = torch.full((1,), input_ids.shape[1] - 1, dtype=torch.long, device=input_ids.device)
        logits, feats, last = self.forward(
            input_ids,
            pos,
            attention_mask if holes else None,
            logits_to_keep=self.no_slots if trusted else last_slot,
            cache=prefill_cache,
        )
        self.cache.load([(layer.keys, layer.values) for layer in prefill_cache.layers])
        del prefill_cache
        if trusted:
            self.lazy_logits = True
            logits = self.lm_head(last[:, -1:].clone(memory_format=torch.contiguous_format))  # (b, 1, V)
        elif subset:
            # (b, 1, H) as the model gave it to its head: MKL rounds a (b, H) product differently for b > 1
            self.lazy_logits = bool(torch.equal(self.lm_head(last[:, -1:].contiguous()), logits[:, -1:]))
            _head_verdicts[self.target] = (head_key, self.lazy_logits)
        if subset:
            self.packed_head = packed_head(self.head) if self.lazy_logits else None
        if self.lazy_logits and self.window is None and self.device.type in LEAN_FORWARD_DEVICES:
            self.lean = LeanTargetForward.for_model(self.target, self.cache_kw)
            self.stats.lean_forward = self.lean is not None
        self.valid, self.pos = valid, pos  # (b, T)
        return logits, feats, pos, valid

    # ------------------------------------------------------------------ a tree
    def logits_rows(self, tree: Tree) -> int | torch.Tensor:
        """The slots whose logits acceptance reads, as ``logits_to_keep``: 0 = all; else the slots with children in
        any row (a path's end without children gets its logits from ``node_logits`` when acceptance stops there),
        rounded up to a multiple of LOGITS_ROWS_MULTIPLE rows."""
        if not self.lazy_logits:
            return 0
        b, S = tree.tok.shape
        has_child = torch.zeros(b, S, dtype=torch.bool, device=self.device).scatter_(1, tree.parent[:, 1:], True)
        wanted = has_child.any(dim=0)
        short = -int(wanted.sum()) * b % LOGITS_ROWS_MULTIPLE  # rows to add (b rows per slot)
        if short:  # the first slots not wanted, as many as make the row count a multiple (or all slots)
            wanted |= (~wanted).cumsum(0) <= -(-short // b)
        keep = wanted.nonzero().squeeze(1)
        if not has_child.any():
            keep = 1
        return keep

    def _mask(self, allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor | None):
        if self.window is None:
            return additive_mask(allowed, self.dtype)
        masks = layer_type_masks(allowed, self.dtype, self.window, q_pos, k_pos)
        return masks["sliding_attention"] if self.mask_kind == "sliding" else masks

    def verify(self, tree: Tree, next_pos: torch.Tensor, keep: int | torch.Tensor):
        """One forward over the tree's slots: each attends to its row's context slots and its ancestors, at position
        root position + depth. Returns (kept logits, features (b, S, F), final hidden states (b, S, Ht), positions)."""
        b, S = tree.tok.shape
        q_pos = next_pos[:, None] + tree.level  # (b, S)
        allowed = torch.cat([self.valid[:, None, :].expand(b, S, self.cache.length), tree.anc], dim=-1)
        k_pos = torch.cat([self.pos, q_pos], dim=-1) if self.window is not None else None
        logits, feats, last = self.forward(tree.tok, q_pos, self._mask(allowed, q_pos, k_pos), logits_to_keep=keep)
        return logits, feats, last, q_pos

    def node_logits(self, logits, last, keep, slot: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(n,) one slot for each of ``rows`` (default: every row) -> its logits (n, V): from the verification's, or
        from the hidden states."""
        if rows is None:
            rows = torch.arange(slot.shape[0], device=slot.device)
        if isinstance(keep, int) and keep == 0:
            return logits[rows, slot]
        return self.lm_head(last[rows, slot])

    def commit(self, slots: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor):
        """Keep the tree slots ``slots`` (b, A) of each row (``valid`` False: a hole), in order; drop the rest."""
        self.cache.keep(slots)
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.pos = torch.cat([self.pos, positions], dim=1)
