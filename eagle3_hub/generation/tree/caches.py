"""Key/value caches of tree decoding: one tensor for all layers, compacted to the accepted path in one gather."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache


class TreeKVCache(DynamicCache):
    """The key/value cache of all layers of a model in one tensor ``(layers, 2, b, h_kv, capacity, d)``.

    Slots ``[0, length)`` are committed. A forward appends its ``s`` new slots at ``end`` (every layer at the
    same offset) and returns views ``[..., :end, :]``: no copy of the cache per forward. The decoder then
    ``commit``s them, drops them (``rollback``), or ``keep``s a per-row selection (tree compaction: one
    gather over all layers).
    """

    def __init__(self, num_layers: int, capacity: int):
        super().__init__()
        self.num_layers = num_layers
        self.capacity = capacity
        self.buffer: torch.Tensor | None = None
        self.length = 0  # committed slots
        self.end = 0  # committed slots + slots written since
        self._start = 0  # where the forward in progress writes

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        s = key_states.shape[-2]
        if layer_idx == 0:  # a new forward: all layers write at the same offset
            self._start = self.end
            self.end += s
            self._reserve(key_states)
        start, end = self._start, self._start + s
        layer = self.buffer[layer_idx]  # (2, b, h_kv, capacity, d)
        layer[0, :, :, start:end] = key_states
        layer[1, :, :, start:end] = value_states
        return layer[0, :, :, :end], layer[1, :, :, :end]

    def _reserve(self, like: torch.Tensor):
        b, h, _, d = like.shape
        if self.buffer is None:
            self.capacity = max(self.capacity, self.end)
            # zeros, not empty: the fixed-shape draft path attends over unwritten slots (masked; NaN would leak)
            self.buffer = like.new_zeros(self.num_layers, 2, b, h, self.capacity, d)
        elif self.end > self.capacity:
            self.capacity = max(2 * self.capacity, self.end)
            grown = self.buffer.new_zeros(*self.buffer.shape[:4], self.capacity, d)
            grown[..., : self._start, :] = self.buffer[..., : self._start, :]
            self.buffer = grown

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.end

    def load(self, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        """Commit the (keys, values) (b, h_kv, s, d) of every layer, e.g. the prefill's ``DynamicCache``."""
        keys, _ = layers[0]
        self._start, self.end = self.end, self.end + keys.shape[-2]
        self._reserve(keys)
        for layer, (k, v) in zip(self.buffer, layers):
            layer[0, :, :, self._start : self.end] = k
            layer[1, :, :, self._start : self.end] = v
        self.commit()

    def commit(self):
        self.length = self.end

    def rollback(self):
        self.end = self.length

    def keep(self, index: torch.Tensor):
        """Commit, for row ``r``, the uncommitted slots ``index[r]`` (b, A) (offsets from ``length``), in order."""
        n_layers, _, b, h, _, d = self.buffer.shape
        A = index.shape[1]
        new = self.buffer[..., self.length : self.end, :]
        if b == 1:
            kept = new.index_select(4, index[0])
        else:
            kept = new.gather(4, index.view(1, 1, b, 1, A, 1).expand(n_layers, 2, b, h, A, d))
        self.buffer[..., self.length : self.length + A, :] = kept
        self.length = self.end = self.length + A

    def select_rows(self, rows: torch.Tensor):
        """Keep the batch rows ``rows``, in that order. Where every kept row comes from its own place or one after it
        (``rows[j] >= j``: in order, or the last rows moved into the places of dropped ones) the rows move within the
        buffer, their written slots only, and the buffer is narrowed: copying the whole buffer into a new one for
        every finished row costs a large batch more than its last steps."""
        if self.buffer is None:
            return
        order = rows.tolist()
        if any(r < j for j, r in enumerate(order)):
            self.buffer = self.buffer.index_select(2, rows)
            return
        for j, r in enumerate(order):
            if r != j:  # row r has not been written over yet: every place written so far is before it
                self.buffer[:, :, j, :, : self.end].copy_(self.buffer[:, :, r, :, : self.end])
        self.buffer = self.buffer[:, :, : len(order)]


class ScratchCache:
    """The draft's cache for the tree levels on fixed shapes: a copy of the whole context buffer (capacity C,
    unwritten slots masked out) followed by the tree slots, written at fixed offsets. Every level then has the
    same shapes in every step, as a CUDA graph needs, and the context cache is left untouched."""

    def __init__(self, context: TreeKVCache, slots: int):
        self.context = context
        n_layers, _, b, h, C, d = context.buffer.shape
        self.kv = context.buffer.new_zeros(n_layers, 2, b, h, C + slots, d)
        self.C = C
        self.end = C
        self._start = C

    def reset(self):
        self.kv[..., : self.C, :] = self.context.buffer
        self.end = self._start = self.C

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == 0:  # a new forward: every layer writes at the same offset
            self._start, self.end = self.end, self.end + key_states.shape[-2]
        layer = self.kv[layer_idx]
        layer[0, :, :, self._start : self.end] = key_states
        layer[1, :, :, self._start : self.end] = value_states
        return layer[0, :, :, : self.end], layer[1, :, :, : self.end]
