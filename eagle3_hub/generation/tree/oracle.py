"""The target as its own draft: the acceptance a perfect draft would reach with a given tree and walk.

``TargetProposer`` builds the tree as ``Drafter`` does (the root's ``top_k`` children, the ``top_k`` best frontier
nodes expanded level by level, the ``total_tokens`` best nodes of the pool by cumulative log-probability), but every
node's children are the *target's* own most probable tokens under its processed distribution (temperature, top-p,
... applied), read from the target itself with the node's path as context. Verification and acceptance are those of
tree decoding, unchanged, so its acceptance length is the ceiling of that tree shape: a draft's share of it says
whether to train the draft more or to change the tree. Each level runs the target, so its speed means nothing.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from .acceptance import Processing
from .config import TreeConfig
from .outputs import TreeDecodingStats

# a node the processed distribution rules out (top-p): finite, so a child still scores below its parent
_FLOOR = -1e4


class TargetProposer:
    """Proposes trees from the target for a ``TreeDecoder`` (its rows' tokens, ``decoder.tokens``, are the context).
    Each row keeps its own key/value cache of its tokens, extended by the tokens it accepted since the last tree."""

    levels = None  # no fixed-shape levels: the decoder drafts exactly the depth it asks for

    def __init__(self, decoder, target, config: TreeConfig, processing: Processing, stats: TreeDecodingStats, pads: list[int]):
        self.decoder, self.target, self.processing, self.stats = decoder, target, processing, stats
        self.top_k, self.total_tokens = config.tree_top_k, config.total_tokens
        self.device = target.get_input_embeddings().weight.device
        self.pads = list(pads)  # left padding of each row's prompt, not part of its context
        # transformers renames the cache argument of forward (past_key_values -> cache) within the versions allowed
        self.cache_arg = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"

    def start(self, b: int, capacity: int):
        self.caches = [DynamicCache() for _ in range(b)]
        self.cached = [0] * b  # tokens of each row in its cache

    def queue(self, *pending):
        """The draft's features are not needed: the target reads the tokens themselves."""

    def read(self, holes: bool):
        """The target reads each row's new tokens when it drafts (``draft_tree``)."""

    def select_rows(self, idx: torch.Tensor):
        keep = idx.tolist()
        self.caches = [self.caches[i] for i in keep]
        self.cached = [self.cached[i] for i in keep]
        self.pads = [self.pads[i] for i in keep]

    def _logp(self, logits: torch.Tensor, prefix: list[int], paths: list[list[int]]) -> torch.Tensor:
        """(n, V) log-probabilities of the processed distribution after ``prefix + paths[i]``."""
        device = self.device
        scores = self.processing(logits.float(), lambda: [torch.tensor([prefix + p], device=device) for p in paths])
        return torch.log_softmax(scores, dim=-1).nan_to_num(_FLOOR).clamp(_FLOOR, -1e-4)

    def _forward(self, cache: DynamicCache, ids: torch.Tensor) -> torch.Tensor:
        self.stats.draft_forwards += 1
        return self.target(input_ids=ids, use_cache=True, **{self.cache_arg: cache}).logits[:, -1]

    def draft_tree(self, depth: int, next_pos: torch.Tensor, holes: bool, **shape):
        """Like ``Drafter.draft_tree``: node tokens (b, N), parent slots (b, N) (0 = the root) and depths (b, N).
        ``shape`` may narrow the tree for this step (``top_k``, ``total_tokens``)."""
        k = shape.get("top_k") or self.top_k
        total = shape.get("total_tokens") or self.total_tokens
        trees = [self._row_tree(i, depth, k, total) for i in range(len(self.decoder.rows))]
        return tuple(torch.stack([t[j] for t in trees]) for j in range(3))

    def _row_tree(self, i: int, depth: int, k: int, total: int):
        dev = self.device
        row = self.decoder.rows[i]
        context = self.decoder.tokens[row][self.pads[i] :]  # ends with the root
        cache = self.caches[i]
        new = torch.tensor([context[self.cached[i] :]], device=dev)
        logp = self._logp(self._forward(cache, new), context, [[]])[0]
        self.cached[i] = len(context)
        score, token = logp.topk(k)  # (k,) the root's children
        pool_score, pool_tok, pool_parent, pool_depth = [score], [token], [torch.full((k,), -1, device=dev)], [1]
        f_score, f_tok, f_index, f_paths = score, token, torch.arange(k, device=dev), [[t] for t in token.tolist()]
        offset = k
        depth = min(depth, total)
        if depth >= 2:
            cache.batch_repeat_interleave(k)  # one row of the cache per frontier node
        for lvl in range(2, depth + 1):
            logp = self._logp(self._forward(cache, f_tok[:, None]), context, f_paths)  # (k, V)
            child_logp, child_tok = logp.topk(k, dim=-1)  # (k, k)
            c_score = (f_score[:, None] + child_logp).reshape(-1)
            c_tok = child_tok.reshape(-1)
            pool_score.append(c_score)
            pool_tok.append(c_tok)
            pool_parent.append(f_index[:, None].expand(k, k).reshape(-1))
            pool_depth.append(lvl)
            if lvl < depth:
                best = c_score.topk(k).indices
                parent = best // k
                cache.batch_select_indices(parent)
                f_paths = [f_paths[p] + [t] for p, t in zip(parent.tolist(), c_tok[best].tolist())]
                f_score, f_tok, f_index = c_score[best], c_tok[best], offset + best
            offset += k * k
        if depth >= 2:  # back to the row's context: the tree's slots are not context
            cache.crop(-(depth - 1))  # a negative count removes that many tokens
            cache.batch_select_indices(torch.tensor([0], device=dev))
        scores = torch.cat(pool_score)
        n = min(total, scores.numel())
        selected = scores.topk(n).indices.sort().values  # pool order: parents first
        slot_of = torch.full((scores.numel(),), -1, dtype=torch.long, device=dev)
        slot_of[selected] = torch.arange(n, device=dev)
        parents = torch.cat(pool_parent)[selected]
        node_parent = torch.where(parents < 0, 0, slot_of[parents.clamp(min=0)] + 1)
        depths = torch.cat([torch.full((s.numel(),), d, dtype=torch.long, device=dev) for s, d in zip(pool_score, pool_depth)])
        return torch.cat(pool_tok)[selected], node_parent, depths[selected]


__all__ = ["TargetProposer"]
