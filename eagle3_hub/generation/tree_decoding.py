"""EAGLE-2/3 dynamic-tree speculative decoding for a transformers causal LM and an EAGLE-3 draft.

This file is self-contained (torch, transformers and the standard library only; ``lean_target_forward.py``, a faster
CPU verification, is imported where it lies next to it): it is copied verbatim into a draft folder as
``custom_generate/generate.py`` so that

    target.generate(ids, custom_generate="user/draft-repo", trust_remote_code=True)

runs tree decoding without the ``eagle3_hub`` package installed (the draft itself is loaded from the same
repo with ``AutoModel.from_pretrained(repo, trust_remote_code=True)``).

Entry points
------------
- ``generate(target, draft, input_ids, ...)``: the Python API, returns ``TreeDecodingOutput(sequences, stats)``.
- ``tree_generate``: for ``target.generate(ids, custom_generate=tree_generate, draft=draft, ...)``.
- ``generate(model=..., **generate_arguments)``: what transformers calls for ``custom_generate="repo"``.
- ``write_custom_generate(folder)``: copies this file to ``folder/custom_generate/generate.py`` (and
  ``lean_target_forward.py`` next to it).

One decoding step (b = rows, k = tree top-k, D = depth, N = total_tokens, V = target vocabulary)
-------------------------------------------------------------------------------------------------
Each row has a *root*: its latest token, sampled from the target but not yet in the target's KV cache.

1. Draft. The draft first reads the target features of the tokens accepted in the last step (its cache
   keeps context positions only), which yields the root's children. Then ``D - 1`` draft forwards expand
   the tree one level at a time: the k best frontier nodes by cumulative draft log-probability are fed
   (each with the draft hidden state of its parent), each proposes its k best children. All nodes form a
   pool of ``k + (D - 1) * k * k`` candidates; the N best by cumulative log-probability form the tree
   (ancestor-closed because a child always scores below its parent). With ``min_node_prob`` (the CPU default)
   only the nodes whose cumulative probability reaches it are kept (at least one), and no further level is
   drafted once every frontier node is below it.
2. Verify. One target forward over ``[root, N nodes]`` with a 4D additive mask: context slots of the row
   plus the node's ancestors (the tree attention mask); positions = root position + node depth.
3. Accept. Greedy: the longest path whose every token equals the target's argmax at its parent, plus the
   target's argmax at the path's end (the "bonus" token). Sampling: the multi-candidate rejection walk
   below, lossless for the target's processed distribution.
4. Compact. The target cache keeps the accepted slots only (one gather on the whole cache tensor); their
   target features feed the draft in the next step.

Greedy decoding can add a *lookup branch* to the tree (``lookup_tokens`` > 0, prompt lookup / n-gram
speculation): tokens copied from the row's own text (prompt + output), the continuation of the latest
earlier occurrence of its longest suffix of 1-3 tokens, as a chain under the root. A 3-token match proposes
``lookup_tokens`` tokens, a shorter one a share of them (``LOOKUP_SHARE``): such copies rarely hold for long.
It costs no draft forward and is verified with the tree, so the output is unchanged; it pays where the target
repeats itself or copies from the prompt. Sampling does not use it (its proposals are not draft samples).

Caches are rectangular over the batch: each row accepts its own number of tokens, the slots a row does not
use are holes masked out of every later attention (a per-row validity mask), positions are explicit per
row. Finished rows are removed from the batch.

Lossless sampling with a fixed candidate set
--------------------------------------------
At a tree node let ``p`` be the target's processed distribution (temperature, top-k, top-p, ... applied)
and ``c_1, ..., c_m`` the node's children (distinct tokens) in a fixed order. Treat each child as a
one-hot proposal ``q = delta_c``. Speculative sampling with proposal ``q`` accepts ``c`` with probability
``min(1, p(c) / q(c)) = p(c)`` and otherwise samples from the residual ``norm(max(0, p - q))``, which is
``p`` with ``p(c)`` set to 0 and renormalised. Its output is distributed exactly as ``p``:
``P(c) = p(c)`` and, for ``y != c``, ``P(y) = (1 - p(c)) * p(y) / (1 - p(c)) = p(y)``. Applying the same
step to the residual with the next child, and so on, keeps the output distributed as ``p`` by induction;
when every child is rejected the token is sampled from the final residual. Child ``c_j`` is therefore
accepted (given ``c_1..c_{j-1}`` were rejected) with probability ``p(c_j) / (1 - sum_{i<j} p(c_i))``, which
this file evaluates for all children at once. An accepted child continues the walk at that child, where
the target's distribution conditioned on the longer prefix applies; so every emitted token is distributed
as the target's (processed) next-token distribution given everything before it.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import DynamicCache
from transformers.generation import logits_process as _lp
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StopStringCriteria,
)
from transformers.utils import ModelOutput

try:  # a draft's custom_generate/ carries it next to this file; without it, transformers' forward verifies
    from .lean_target_forward import LeanTargetForward
except ImportError:
    LeanTargetForward = None

# Tree shape per device type: depth (draft levels), top_k (children per expanded node), total_tokens (tree
# nodes verified per target forward, root excluded).
# CPU: a one-token forward is memory-bound, and up to ~16 tokens cost about 1.5x one (SmolLM2-135M fp32, 2
# threads, default OpenMP wait policy: 1 token 72 ms, 4: 107, 9: 108); one draft level costs ~5-7% of a
# one-token forward: small, shallow trees. Sweep with the stage-3 SmolLM2 reference draft on two held-out
# MT-bench questions (results/smollm2-135m-instruct/sweep/, 12 shapes, depth 2-3, top-k 4/6, 8-16 nodes): all
# within noise (0.75-0.79x there, acceptance ~1.5). On the benchmark suites depth 3 / top-k 4 / 8 nodes beat
# depth 2 / top-k 6 / 12 (1.05x against 0.94x plain: the third level pays on predictable text such as GSM8K).
# Re-tune a better draft with run_sweep.sh.
# CUDA: verification is flat up to 128 tokens on an H200 (eager, launch-bound: results/cuda-h200/): the
# EAGLE-2/3 reference trees. There (random 1B Llama, draft graph, no cuDNN attention) trees of 8 to 80 nodes cost
# 16-19 ms per step, a plain token 15 ms.
# lookup_tokens (greedy only): the lookup branch's length after a 3-token match (LOOKUP_SHARE below for shorter
# ones). CPU: on the three suites (3 questions each, 256 tokens, stage-4 draft, one run, before LOOKUP_SHARE,
# results/smollm2-135m-instruct/bench_lookup_branch/) 0 / 6 / 10 gave 1.07x / 1.53x / 1.58x plain (acceptance
# 1.95 / 2.97 / 3.15); 20 with LOOKUP_SHARE: results/smollm2-135m-instruct/bench_lookup_share/. CUDA: its
# 20 more slots cost nothing measurable on the H200 (64.3 tok/s with, 58.7 without; its gain unmeasured there).
# min_node_prob: a tree keeps only the nodes whose cumulative draft probability reaches it (at least one; the
# most probable first, at most total_tokens), with the levels run eagerly. CPU: every verified token costs there
# (~3 ms each in SmolLM2's decoder body here: diagnostics/forward_cost.py). On 10 of the target's own prompts no draft had seen (seed 6, stage-6 draft, one run;
# results/smollm2-135m-instruct/min_node_prob/): 0 / 0.05 / 0.1 / 0.2 gave 1.00 / 1.07 / 1.08 / 1.07x the tokens/s
# (77.0 -> 62.1 ms per step at 0.1, 2.95 -> 2.57 tokens per step); with the levels that could not add a node left
# out (_can_grow), 2.12 draft forwards per step instead of 2.99, 65.0 -> 61.8 ms per step in a second run. CUDA: 0
# (verification is flat there, and the draft graph replays one shape).
# CPU in bfloat16 (a CPU with bf16 units, AVX512-BF16 or AMX, where ``--dtype auto`` picks it): verification is
# nearly flat there (SmolLM2-135M, 200-token cache, AMD EPYC with AVX512-BF16: 1 token 38 ms, 8: 42, 16: 49; float32
# 57 / 83 / 89), so pruning unlikely nodes saves little and wide first levels pay: 3/8/6 without pruning was first or
# second in sweeps on 6 and 10 MT-bench first turns (2.28x / 2.44x plain bf16; results/smollm2-135m-instruct/sweep_bf16/).
# grow_min_prob: a further level only while a frontier node's cumulative draft probability reaches it (min_node_prob
# also stops the levels, where no deeper node could pass it). CPU bf16: depth up to 8 with 0.3 drafts 1.8 forwards a
# step instead of 3 (it mostly cuts levels where the draft is unsure): on all 80 MT-bench first turns in one run,
# stage-9 draft, 2.45x plain against 2.34x for 3/8/6 without it (acceptance 3.19 against 3.28;
# results/smollm2-135m-instruct/bench_mt_first_turns_80_stage9/, sweep_grow/), but 2.21x against 2.29x on the card's
# 9 questions (GSM8K 2.81x against 3.12x), and it lowers acceptance: 0 everywhere (CUDA: the draft graph replays one
# shape). (Its bf16 tokens 0.80 below the float32 argmax on the README command were bf16 ties in the verification:
# results/smollm2-135m-instruct/diagnostics/grow_near_tie_probe.txt.) Levels past total_tokens are never drafted (no
# node there could be selected).
TREE_DEFAULTS: dict[str, dict[str, float]] = {
    "cpu": {"depth": 3, "top_k": 4, "total_tokens": 8, "lookup_tokens": 20, "min_node_prob": 0.1,
            "grow_min_prob": 0.0},
    "cpu-bfloat16": {"depth": 3, "top_k": 8, "total_tokens": 6, "lookup_tokens": 20, "min_node_prob": 0.0,
                     "grow_min_prob": 0.0},
    "cuda": {"depth": 6, "top_k": 10, "total_tokens": 60, "lookup_tokens": 20, "min_node_prob": 0.0,
             "grow_min_prob": 0.0},
}
# share of lookup_tokens proposed after a match of the text's last 3 / 2 / 1 tokens (rounded, at least 1). On
# SmolLM2's greedy answers to 10 questions per suite, the copy after a 3-token match holds for 15 tokens on
# average on MT-bench (its first token 88% of the time, its 20th 32%), after a 2-token match 2.3 (45%), after a
# 1-token match 0.6 (19%): long chains after weak matches are verification spent for nothing
# (results/smollm2-135m-instruct/diagnostics/lookup_lengths.py).
LOOKUP_SHARE = {3: 1.0, 2: 0.3, 1: 0.15}

# device types on which a verification computes the target's logits only for the tree slots it needs (the
# lm_head is ~20% of a small model's compute on a CPU); elsewhere for all slots (no host sync for the index)
LOGITS_SUBSET_DEVICES = ("cpu",)
# ...rounded up to a multiple of this many rows (with other slots' logits, which are then read for free): MKL's
# small-batch sgemm on the 2-core AVX2 CPU here takes ~2x as long for 3 or 7 rows of SmolLM2's lm_head as for 4 or
# 8 (results/smollm2-135m-instruct/diagnostics/lm_head_rows.py; end to end within noise: logits_rows_ab.py)
LOGITS_ROWS_MULTIPLE = 4
# ...computed there with a packed copy of the target's head (_packed_head) where oneDNN can: a small model's head is a
# big matrix (SmolLM2: 49152 x 576, 113 MB in float32), and F.linear over 4-24 rows runs far below the bandwidth one
# row reaches on the 2-core AVX2 CPU here (8 rows 11.0 ms, 1 row 3.2 ms); oneDNN with the weight packed once for
# small batches (one of the kernels torch.compile's CPU backend uses for a frozen linear) takes 4.3 ms for 8 rows:
# verification 63.5 -> 58.0 ms per step on MT-bench (results/smollm2-135m-instruct/diagnostics/lm_head_kernels.py).
# It costs a copy of the head while the head lives.
PACKED_HEAD_ROWS = 8  # the batch size the copy is packed for
# ...for float32 and bfloat16 heads (the check's relative tolerance: a few roundings of the dtype). In bf16 on the
# 2-core EPYC with AVX512-BF16, oneDNN's packed kernel gives F.linear's very numbers at half its time: SmolLM2's
# head over 8 rows 4.96 -> 2.51 ms, a 16,384-row draft head 1.33 -> 0.58 ms; bf16 tree decoding end to end on 10
# MT-bench first turns 35.5 -> 39.7 tok/s, the same tokens (results/smollm2-135m-instruct/diagnostics/
# bf16_packed_heads.py). The draft's head is packed too (_draft_forward).
PACKED_HEAD_DTYPES = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# device types on which verifications run through LeanTargetForward (lean_target_forward.py) where it reproduces the
# target (Llama-family, sdpa, no hooks that may change outputs; checked by a probe): the decoder's ops without
# transformers' per-layer plumbing and repeat_kv copies. SmolLM2, 9 tokens under a tree mask: 59.0 -> 47.7 ms on the
# 2-core CPU here (results/smollm2-135m-instruct/diagnostics/lean_forward.py). Not measured on CUDA.
LEAN_FORWARD_DEVICES = ("cpu",)
_packed_heads: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()
# per target: whether its output head (_TreeDecoder._lm_head) gives its forward's own logits, while the head is the same
# module with the same weight at the same version. Checked at a run's prefill; later prefills then ask the model for no
# logits and compute the last slot's from a fresh row: F.linear of the (b, 1, H) slice of a prompt's hidden states that
# transformers hands its head takes torch's bmm path, which copies the whole head (SmolLM2 in bf16 on the EPYC here:
# 54.5 ms instead of 2.1 ms, and the check costs a second one; diagnostics/prefill_head_path.py).
_head_verdicts: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()

# logits processors that look at the scores only (not at the tokens so far): applied to all tree nodes at once
_HISTORY_FREE_PROCESSORS = tuple(
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


def tree_defaults(device: torch.device | str, dtype: torch.dtype | None = None) -> dict[str, float]:
    """Default ``depth`` / ``top_k`` / ``total_tokens`` / ``lookup_tokens`` / ``min_node_prob`` / ``grow_min_prob``
    for a device and the target's dtype (``TREE_DEFAULTS``: a CPU's differ in bfloat16; CUDA's for other
    accelerators)."""
    kind = torch.device(device).type
    if kind == "cpu" and dtype == torch.bfloat16:
        kind = "cpu-bfloat16"
    return dict(TREE_DEFAULTS.get(kind, TREE_DEFAULTS["cuda"]))


# ----------------------------------------------------------------------------------------------- outputs
@dataclass
class TreeDecodingStats:
    """Counters of one ``generate`` call.

    accepted_per_step: one entry per (target verification, active row): tokens that row committed in that
        step (accepted draft tokens + the target's bonus token; fewer when a stop condition cut the block).
    mean_acceptance_length: new tokens per target forward (prefill included), over all rows.
    lookup_accepted: accepted draft tokens that came from the lookup branch (the rest: from the draft model).
    draft_time_s / verify_time_s: time in draft forwards (tree building included) / target verification
        forwards (prefill included); overhead_time_s: everything else (acceptance, cache compaction, host
        bookkeeping, streaming).
    """

    target_forwards: int = 0
    draft_forwards: int = 0
    steps: int = 0
    new_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    lookup_accepted: int = 0
    mean_acceptance_length: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    overhead_time_s: float = 0.0
    total_time_s: float = 0.0
    tree: dict[str, int] = field(default_factory=dict)
    lean_forward: bool = False  # verifications ran through LeanTargetForward, not transformers' forward

    def per_step_ms(self) -> dict[str, float]:
        """Average milliseconds per decoding step: draft / verify / overhead."""
        n = max(self.steps, 1)
        return {
            "draft": 1e3 * self.draft_time_s / n,
            "verify": 1e3 * self.verify_time_s / n,
            "overhead": 1e3 * self.overhead_time_s / n,
        }

    def __str__(self) -> str:
        ms = self.per_step_ms()
        tps = self.new_tokens / self.total_time_s if self.total_time_s > 0 else float("nan")
        return (
            f"{self.new_tokens} new tokens in {self.total_time_s:.2f} s ({tps:.1f} tok/s), {self.target_forwards} "
            f"target forwards, mean acceptance length {self.mean_acceptance_length:.2f}; per step: draft "
            f"{ms['draft']:.1f} ms, verify {ms['verify']:.1f} ms, overhead {ms['overhead']:.1f} ms; tree {self.tree}"
        )


@dataclass
class TreeDecodingOutput(ModelOutput):
    """sequences: (b, prompt_len + new) prompt (as given, left padding included) + new tokens, right-padded
    with the pad id after a row stopped. stats: ``TreeDecodingStats``."""

    sequences: torch.LongTensor | None = None
    stats: TreeDecodingStats | None = None


# ----------------------------------------------------------------------------------------------- KV cache
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
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(2, rows)


class _ScratchCache:
    """The draft's cache for the tree levels on fixed shapes: a copy of the whole context buffer (capacity C,
    unwritten slots masked out) followed by the tree slots, written at fixed offsets. Every level then has the
    same shapes in every step, as a CUDA graph needs, and the context cache is left untouched."""

    def __init__(self, context: TreeKVCache, slots: int):
        self.context = context
        _, _, b, h, C, d = context.buffer.shape
        self.kv = context.buffer.new_zeros(2, b, h, C + slots, d)
        self.C = C
        self.end = C

    def reset(self):
        self.kv[:, :, :, : self.C] = self.context.buffer[0]
        self.end = self.C

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        start, self.end = self.end, self.end + key_states.shape[-2]
        self.kv[0, :, :, start : self.end] = key_states
        self.kv[1, :, :, start : self.end] = value_states
        return self.kv[0, :, :, : self.end], self.kv[1, :, :, : self.end]


class _DraftLevels:
    """Levels 2..depth of the draft tree over fixed-shape buffers (``_TreeDecoder._grow`` with a
    ``_ScratchCache`` and the context's validity over the whole buffer). With ``capture`` (CUDA) they run as
    one CUDA graph per (rows, depth, context buffer), captured at first use and replayed afterwards: a level
    is ~30 small kernels whose launches, not their work, cost the time at batch 1. Without ``capture`` the
    same fixed-shape code runs eagerly (its test on CPU)."""

    def __init__(self, capture: bool):
        self.capture = capture
        self.entries: dict[tuple, tuple] = {}

    def __call__(self, dec: "_TreeDecoder", depth: int, score, token, root_hidden):
        ctx = dec.dcache
        b, k = score.shape
        key = (b, depth, ctx.buffer.data_ptr(), ctx.buffer.shape[4])
        if key not in self.entries:  # those of an old context buffer or of more rows are not used again
            self.entries = {e: v for e, v in self.entries.items() if e[2:] == key[2:] and e[0] == b}
            static = {
                "score": score.clone(),
                "token": token.clone(),
                "hidden": root_hidden.clone(),
                "valid": torch.zeros(b, ctx.buffer.shape[4], dtype=torch.bool, device=score.device),
                "pos": dec.next_pos.clone(),
            }
            self.entries[key] = (static, _ScratchCache(ctx, (depth - 1) * k), None, None)
        static, scratch, graph, out = self.entries[key]
        static["score"].copy_(score)
        static["token"].copy_(token)
        static["hidden"].copy_(root_hidden)
        static["valid"][:, : ctx.length] = dec.d_valid
        static["valid"][:, ctx.length :] = False
        static["pos"].copy_(dec.next_pos)
        forwards = dec.stats.draft_forwards

        def levels():
            scratch.reset()
            return dec._grow(depth, static["score"], static["token"], static["hidden"], static["valid"][:, None, :],
                             scratch, static["pos"])

        if not self.capture:
            out = levels()
        elif graph is None:
            side = torch.cuda.Stream(device=score.device)
            side.wait_stream(torch.cuda.current_stream(score.device))
            with torch.cuda.stream(side):  # warm-up outside the graph (library handles, workspaces)
                levels()
            torch.cuda.current_stream(score.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = levels()
            self.entries[key] = (static, scratch, graph, out)
            graph.replay()
        else:
            graph.replay()
        dec.stats.draft_forwards = forwards + depth - 1
        return tuple(t.clone() for t in out)  # the graph's outputs are overwritten by its next replay


# ----------------------------------------------------------------------------------------------- helpers
def _packed_head(head) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``hidden (..., in) -> logits (..., out)`` through a oneDNN-packed copy of a float32 or bfloat16 CPU ``nn.Linear``
    (cached while its weight is unchanged), or None where oneDNN is missing or disagrees with ``F.linear`` on random
    rows. The kernels sum in different orders, as ``F.linear`` does itself for different row counts (~1e-6)."""
    if not isinstance(head, torch.nn.Linear) or head._forward_hooks or head._forward_pre_hooks:
        return None
    w = head.weight.detach()
    bias = None if head.bias is None else head.bias.detach()
    if w.device.type != "cpu" or w.dtype not in PACKED_HEAD_DTYPES or not torch.backends.mkldnn.is_available():
        return None
    if w.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    key = (w.data_ptr(), head.weight._version, None if bias is None else (bias.data_ptr(), head.bias._version))
    hit = _packed_heads.get(head)
    if hit is not None and hit[0] == key:
        packed = hit[1]
    else:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACKED_HEAD_ROWS)
            x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
            got = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        except (RuntimeError, AttributeError, NotImplementedError):  # a torch build without these oneDNN ops
            return None
        ref = F.linear(x, w, bias)
        rtol = PACKED_HEAD_DTYPES[w.dtype]
        if got.shape != ref.shape or got.dtype != ref.dtype or not torch.allclose(
            got.float(), ref.float(), rtol=rtol, atol=rtol * 0.1 * float(ref.abs().max())
        ):
            return None
        _packed_heads[head] = (key, packed)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden, packed, bias, "none", [], "")

    return forward


def _argmax(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(-1)``; on a CPU through float32, which gives the same index (the conversion is exact and both
    take the first maximum) in a fifth of bf16's time (12 rows of SmolLM2's logits: 1.09 -> 0.21 ms on the EPYC here)."""
    if scores.device.type == "cpu" and scores.dtype != torch.float32:
        scores = scores.float()
    return scores.argmax(dim=-1)


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (b, q, kv), True = may attend -> additive float mask (b, 1, q, kv). A finite minimum keeps fully
    masked query rows (holes) free of NaN."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min).unsqueeze(1)


def _attention_layout(text_config) -> tuple[int | None, str]:
    """(sliding window, kind) with kind "full" (one causal mask), "sliding" (one windowed mask for every
    layer) or "mixed" (a {"full_attention", "sliding_attention"} mask dict, as Gemma-2/3 take it)."""
    window = getattr(text_config, "sliding_window", None)
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types:
        kinds = set(layer_types)
        unknown = kinds - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(
                f"Tree decoding supports full and sliding-window attention layers; this target also has {sorted(unknown)}."
            )
        if "sliding_attention" not in kinds or not window:
            return None, "full"
        return window, ("sliding" if kinds == {"sliding_attention"} else "mixed")
    return (window, "sliding") if window else (None, "full")


def _as_id_list(ids) -> list[int]:
    if ids is None:
        return []
    if isinstance(ids, torch.Tensor):
        return [int(i) for i in ids.flatten().tolist()]
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


def _forward_cache_kwarg(model) -> str:
    """transformers 5 calls the cache argument ``cache``; earlier releases ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _decoder_layer_count(model) -> int:
    return model.config.get_text_config().num_hidden_layers


def check_draft_fits_target(draft, target):
    """Raise a clear ``ValueError`` when ``draft`` was not made for ``target``."""
    cfg = target.config.get_text_config()
    dc = draft.config
    problems = []
    if getattr(dc, "target_hidden_size", None) != cfg.hidden_size:
        problems.append(
            f"the draft reads target features of width {getattr(dc, 'target_hidden_size', None)}, the target's "
            f"hidden size is {cfg.hidden_size}"
        )
    if dc.vocab_size != cfg.vocab_size:
        problems.append(f"the draft maps to a vocabulary of {dc.vocab_size} tokens, the target has {cfg.vocab_size}")
    ids = list((getattr(dc, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids") or [])
    L = cfg.num_hidden_layers
    if len(ids) != 3 or any(not 0 <= int(i) < L for i in ids):
        problems.append(f"the draft's aux layers {ids} do not exist in a target with {L} decoder layers")
    d2t = getattr(draft, "d2t", None)
    if isinstance(d2t, torch.Tensor) and d2t.numel() and not d2t.is_meta:
        target_ids = d2t + torch.arange(d2t.numel(), device=d2t.device)
        if int(target_ids.min()) < 0 or int(target_ids.max()) >= cfg.vocab_size:
            problems.append(f"its d2t map sends draft ids outside the target's {cfg.vocab_size} tokens")
    if problems:
        raise ValueError(
            "This draft does not fit the target: " + "; ".join(problems) + ". Use a draft trained for this target."
        )


def _check_tree_parameters(
    depth: int,
    top_k: int,
    total_tokens: int,
    draft_vocab: int,
    lookup_tokens: int = 0,
    min_node_prob: float = 0.0,
    grow_min_prob: float = 0.0,
):
    for name, value in (
        ("depth", depth),
        ("tree_top_k", top_k),
        ("total_tokens", total_tokens),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(lookup_tokens, int) or isinstance(lookup_tokens, bool) or lookup_tokens < 0:
        raise ValueError(f"lookup_tokens must be a non-negative integer (0: no lookup branch), got {lookup_tokens!r}")
    if isinstance(min_node_prob, bool) or not isinstance(min_node_prob, (int, float)) or not 0 <= min_node_prob < 1:
        raise ValueError(f"min_node_prob must be a probability in [0, 1) (0: always total_tokens nodes), got {min_node_prob!r}")
    if isinstance(grow_min_prob, bool) or not isinstance(grow_min_prob, (int, float)) or not 0 <= grow_min_prob < 1:
        raise ValueError(
            f"grow_min_prob must be a probability in [0, 1) (0: always `depth` levels), got {grow_min_prob!r}"
        )
    if top_k > draft_vocab:
        raise ValueError(f"tree_top_k={top_k} exceeds the draft vocabulary ({draft_vocab} tokens)")
    pool = top_k + (depth - 1) * top_k * top_k
    if total_tokens > pool:
        raise ValueError(
            f"total_tokens={total_tokens} is larger than the {pool} candidates a tree of depth={depth} and "
            f"tree_top_k={top_k} proposes (top_k + (depth - 1) * top_k**2): lower total_tokens or raise depth/top_k."
        )


# ----------------------------------------------------------------------------------------------- decoder
class _PromptLookup:
    """Draft tokens copied from a row's own text: after the latest earlier occurrence of the text's longest suffix
    of 3 down to 1 tokens, the tokens that followed it, ``m * share[n]`` of them (rounded, at least 1) after an
    n-token match. A copy that reaches the end of the text goes on with the tokens it has copied (as an LZ77 match
    may overlap itself), so a loop of period P is proposed in full, not only its first P tokens. ``tokens`` is the
    row's list, which the decoder appends to; positions before ``start`` (left padding) are never matched.
    Indexing is incremental: each new token costs 3 dict writes."""

    def __init__(self, tokens: list[int], start: int, share: dict[int, float] = LOOKUP_SHARE):
        self.tokens, self.start, self.share = tokens, start, share
        self.max_ngram = max(share)
        self.next_of: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence
        self.indexed = start + 1  # positions p < indexed have their n-grams ending at p - 1 in next_of

    def match(self) -> tuple[int, int]:
        """(n, p): the longest suffix of the text seen before has n tokens (0: none) and was followed by t[p]."""
        t = self.tokens
        for p in range(self.indexed, len(t)):  # the n-grams ending at p - 1, each followed by t[p]
            for n in range(1, min(self.max_ngram, p - self.start) + 1):
                self.next_of[tuple(t[p - n : p])] = p
        self.indexed = max(self.indexed, len(t))
        for n in range(min(self.max_ngram, len(t) - self.start), 0, -1):
            p = self.next_of.get(tuple(t[-n:]))
            if p is not None:
                return n, p
        return 0, 0

    def propose(self, m: int) -> list[int]:
        n, p = self.match()
        if not n:
            return []
        t = self.tokens
        m = max(1, round(m * self.share[n]))
        out = t[p : p + m]
        while len(out) < m:  # past the end: the copy continues from what it copied
            out.append(out[p + len(out) - len(t)])
        return out


class _TreeDecoder:
    """State and steps of one tree-decoding run. Shapes: b active rows, T committed target slots, N tree
    nodes (root excluded), F = 3 * target hidden (concatenated aux features), H draft hidden."""

    def __init__(
        self,
        target,
        draft,
        *,
        depth: int,
        top_k: int,
        total_tokens: int,
        lookup_tokens: int,
        min_node_prob: float,
        grow_min_prob: float,
        do_sample: bool,
        processors: LogitsProcessorList,
        eos_ids: list[int],
        pad_id: int,
        max_new_tokens: int,
        criteria: list,
        streamer,
        on_step: Callable | None,
        generator: torch.Generator | None,
        draft_graph: bool = False,
    ):
        self.target, self.draft = target, draft
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.lookup_tokens = lookup_tokens
        self.min_node_logp = math.log(min_node_prob) if min_node_prob > 0 else None
        # a further level is drafted only while a frontier node reaches this (the stricter of the two thresholds)
        grow = max(min_node_prob, grow_min_prob)
        self.grow_logp = math.log(grow) if grow > 0 else None
        self.do_sample = do_sample
        self.processors = processors
        self.history_free = all(isinstance(p, _HISTORY_FREE_PROCESSORS) for p in processors)
        self.eos = set(eos_ids)
        self.pad_id = pad_id
        self.max_new_tokens = max_new_tokens
        self.criteria = criteria
        self.streamer = streamer
        self.on_step = on_step
        self.generator = generator

        cfg = target.config.get_text_config()
        self.window, self.mask_kind = _attention_layout(cfg)
        self.aux = [int(i) + 1 for i in draft.config.aux_layer_ids]  # hidden_states index = layer output + 1
        self.num_layers = _decoder_layer_count(target)
        self.t_embed = target.get_input_embeddings()
        self.device = self.t_embed.weight.device
        self.t_dtype = self.t_embed.weight.dtype
        self.d_dtype = draft.lm_head.weight.dtype
        self.cache_kw = _forward_cache_kwarg(target)
        self.t_head = target.get_output_embeddings()
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        # logits of the needed tree slots only (LOGITS_SUBSET_DEVICES), if the lm_head reproduces the model's
        # own logits (checked at the prefill)
        self.lazy_logits = False
        self.packed_head = None  # the head for those logits where oneDNN can (_packed_head), else t_head
        self.lean = None  # the target's forward for verifications where LeanTargetForward reproduces it
        # the draft's token embedding: its own, or the target's when it was saved without one
        if getattr(draft, "_embedding_missing", False) and not getattr(draft, "_embedding_from_target", False):
            self.d_embed = self.t_embed.weight[: draft.config.vocab_size]
        else:
            self.d_embed = draft.embed_tokens.weight
        self.d2t = draft.d2t.to(self.device)
        # the draft's logits through a packed copy of its head where oneDNN can (_packed_head): the draft then
        # computes none itself, and _draft_forward applies its final norm and this head to the kept positions
        self.d_head = _packed_head(draft.lm_head) if isinstance(getattr(draft, "norm", None), torch.nn.Module) else None
        self.stats = TreeDecodingStats(
            tree={"depth": depth, "top_k": top_k, "total_tokens": total_tokens, "lookup_tokens": lookup_tokens,
                  "min_node_prob": min_node_prob, "grow_min_prob": grow_min_prob}
        )
        self._timed = self.device.type == "cuda"
        self._events: list = []
        # the tree levels on fixed shapes: one CUDA graph per shape on CUDA (draft_graph)
        self.levels = _DraftLevels(capture=self.device.type == "cuda") if draft_graph else None

    # ------------------------------------------------------------------ timing
    def _clock(self):
        """A time stamp: CUDA events (read once at the end: no sync per step) or ``perf_counter``."""
        if self._timed:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _add_time(self, phase: str, start, stop):
        if self._timed:
            self._events.append((phase, start, stop))
        else:
            setattr(self.stats, phase, getattr(self.stats, phase) + stop - start)

    # ------------------------------------------------------------------ forwards
    def _target_mask(self, allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor | None):
        full = _additive_mask(allowed, self.t_dtype)
        if self.window is None:
            return full
        in_window = (q_pos[:, :, None] - k_pos[:, None, :]) < self.window
        sliding = _additive_mask(allowed & in_window, self.t_dtype)
        if self.mask_kind == "sliding":
            return sliding
        return {"full_attention": full, "sliding_attention": sliding}

    def _target_forward(self, ids, position_ids, mask, logits_to_keep: int | torch.Tensor, cache=None):
        """-> (logits of the kept slots, aux features (b, s, F), final normed hidden states (b, s, Ht))."""
        t0 = self._clock()
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        if self.lean is not None and cache is None:  # a verification through the lean forward: logits from `last`
            last, hidden_states = self.lean(ids, position_ids, mask, self.tcache)
            logits = self._lm_head(last[:, kept])
        else:
            # a subset of slots with the packed head: the model computes no logits, the head those of the subset
            own_head = self.packed_head is not None and not (isinstance(logits_to_keep, int) and logits_to_keep == 0)
            out = self.target(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=self._no_slots if own_head else logits_to_keep,
                **{self.cache_kw: self.tcache if cache is None else cache},
            )
            hidden_states = out.hidden_states
            last = hidden_states[-1]
            logits = self._lm_head(last[:, kept]) if own_head else out.logits
        feats = torch.cat([hidden_states[i] for i in self.aux], dim=-1)  # (b, s, F)
        self._add_time("verify_time_s", t0, self._clock())
        self.stats.target_forwards += 1
        return logits, feats, last

    def _lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits from its final (normed) hidden states, (n, Ht) -> (n, V)."""
        logits = (self.packed_head or self.t_head)(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _draft_forward(
        self,
        tokens,
        position_ids,
        allowed,
        *,
        features=None,
        hidden=None,
        logits_to_keep=0,
        cache=None,
    ):
        """``allowed``: (b, s, kv) bool, or None for causal attention over the whole draft cache. ``cache``: the
        draft's context cache by default."""
        own_head = self.d_head is not None
        out = self.draft(
            inputs_embeds=F.embedding(tokens, self.d_embed),
            target_hidden_states=features,
            hidden_states=hidden,
            position_ids=position_ids,
            attention_mask=None if allowed is None else _additive_mask(allowed, self.d_dtype),
            cache=self.dcache if cache is None else cache,
            use_cache=True,
            # with the packed head: a (b, s) mask that keeps no position, so the draft computes no logits
            logits_to_keep=torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device) if own_head else logits_to_keep,
        )
        self.stats.draft_forwards += 1
        if not own_head:
            return out.logits, out.hidden_states
        kept = out.hidden_states[:, -logits_to_keep:] if logits_to_keep else out.hidden_states
        return self.d_head(self.draft.norm(kept)), out.hidden_states

    def _draft_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        # strictly negative, so a child always scores below its parent (the selected tree is ancestor-closed)
        return torch.log_softmax(logits.float(), dim=-1).clamp_max(-1e-4)

    # ------------------------------------------------------------------ logits processing
    def _process(self, scores: torch.Tensor, prefixes: Callable[[], list[torch.Tensor]]) -> torch.Tensor:
        """scores (n, V) float32 -> processed scores. ``prefixes()`` gives each row's token history (1, len_r)
        for processors that read it; score-only processors run once on all rows."""
        if len(self.processors) == 0:
            return scores
        if self.history_free:
            return self.processors(self._dummy_ids[: scores.shape[0]], scores)
        rows = [self.processors(ids, scores[i : i + 1]) for i, ids in enumerate(prefixes())]
        return torch.cat(rows, dim=0)

    def _history(self, row: int, extra: list[int] | torch.Tensor = ()) -> torch.Tensor:
        ids = self.tokens[row] + (extra.tolist() if isinstance(extra, torch.Tensor) else list(extra))
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def _choose(self, scores: torch.Tensor) -> torch.Tensor:
        """(n, V) processed scores -> (n,) tokens: argmax or a sample."""
        if not self.do_sample:
            return _argmax(scores)
        probs = torch.softmax(scores.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)

    # ------------------------------------------------------------------ host-side emission
    def _emit(self, row: int, new: list[int]) -> tuple[list[int], bool]:
        """Append ``new`` to ``row`` up to the first stop condition: (tokens taken, row finished)."""
        tokens = self.tokens[row]
        taken = []
        done = False
        for tok in new:
            tokens.append(tok)
            taken.append(tok)
            self.generated[row] += 1
            if tok in self.eos or self.generated[row] >= self.max_new_tokens:
                done = True
            elif self.criteria:
                ids = torch.tensor([tokens], dtype=torch.long)
                done = any(bool(c(ids, None).any()) for c in self.criteria)
            if done:
                break
        return taken, done

    def _publish(self, emitted: dict[int, list[int]], from_draft: dict[int, int]):
        if self.streamer is not None and 0 in emitted and emitted[0]:
            self.streamer.put(torch.tensor(emitted[0], dtype=torch.long))
        if self.on_step is not None:
            rows = range(len(self.tokens))
            self.on_step([emitted.get(r, []) for r in rows], [from_draft.get(r, 0) for r in rows])

    # ------------------------------------------------------------------ main loop
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """Decode; returns each row's prompt + new tokens, right-padded to a common length."""
        b, L = input_ids.shape
        dev = self.device
        t_start = time.perf_counter()
        self.tokens = [row for row in input_ids.tolist()]
        self.generated = [0] * b
        self.rows = list(range(b))  # original row of each active row
        slots = self.total_tokens + self.lookup_tokens + 1  # most tree slots of one verification
        self._dummy_ids = torch.zeros(b * slots, 1, dtype=torch.long, device=dev)

        capacity = L + self.max_new_tokens + self.total_tokens + self.lookup_tokens + self.depth + 16
        self.tcache = TreeKVCache(self.num_layers, capacity)
        self.dcache = TreeKVCache(1, capacity)

        # ---- prefill: the prompt through the target (transformers builds the causal / padding / sliding-window
        # masks from the 2D mask, as in plain generation), the first new token from its last position
        valid = attention_mask.bool()
        self.holes = b > 1 or not bool(valid.all())  # rows with masked slots: explicit masks everywhere
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)  # (b, L)
        subset = self.t_head is not None and dev.type in LOGITS_SUBSET_DEVICES
        head_key = (id(self.t_head), self.t_head.weight.data_ptr(), self.t_head.weight._version) if subset else None
        verdict = _head_verdicts.get(self.target) if subset else None
        trusted = verdict == (head_key, True)  # the head is known to give the model's logits: none from the model
        self._no_slots = torch.zeros(0, dtype=torch.long, device=dev)
        prefill_cache = DynamicCache()  # no config: every layer keeps all its keys
        logits, feats, last = self._target_forward(
            input_ids,
            pos,
            attention_mask if self.holes else None,
            logits_to_keep=self._no_slots if trusted else 1,
            cache=prefill_cache,
        )
        self.tcache.load([(layer.keys, layer.values) for layer in prefill_cache.layers])
        del prefill_cache
        if trusted:
            self.lazy_logits = True
            logits = self._lm_head(last[:, -1:].clone(memory_format=torch.contiguous_format))  # (b, 1, V)
        elif subset:
            # (b, 1, H) as the model gave it to its head: MKL rounds a (b, H) product differently for b > 1
            self.lazy_logits = bool(torch.equal(self._lm_head(last[:, -1:]), logits[:, -1:]))
            _head_verdicts[self.target] = (head_key, self.lazy_logits)
        if subset:
            self.packed_head = _packed_head(self.t_head) if self.lazy_logits else None
        if self.lazy_logits and self.window is None and LeanTargetForward is not None and dev.type in LEAN_FORWARD_DEVICES:
            self.lean = LeanTargetForward.for_model(self.target, self.cache_kw)
            self.stats.lean_forward = self.lean is not None
        self.t_valid, self.t_pos = valid, pos  # (b, T)
        if self.lookup_tokens:
            pads = (~valid).sum(-1).tolist()
            self.lookups = [_PromptLookup(self.tokens[r], start=pads[r]) for r in range(b)]
        scores = logits[:, -1].float()
        scores = self._process(scores, lambda: [input_ids[i : i + 1] for i in range(b)])
        root = self._choose(scores)  # (b,)
        self.next_pos = pos[:, -1] + 1  # position of the root (b,)
        self.root = root
        # the draft reads (feature t, token t+1) at position t: the prompt's features with the shifted prompt
        self.pend_feats, self.pend_tok = (
            feats,
            torch.cat([input_ids[:, 1:], root[:, None]], dim=1),
        )
        self.pend_pos, self.pend_valid = pos, valid
        self.d_valid = torch.zeros(b, 0, dtype=torch.bool, device=dev)

        if self.streamer is not None:
            self.streamer.put(input_ids[0].cpu())
        first = root.tolist()
        emitted, finished = {}, []
        for i, tok in enumerate(first):
            taken, done = self._emit(i, [tok])
            emitted[i] = taken
            self.stats.accepted_per_step.append(len(taken))
            if done:
                finished.append(i)
        self._forwards_per_row = [1] * b
        self._publish(emitted, {})
        self._drop_rows(finished)

        # ---- tree steps
        while self.rows:
            remaining = max(self.max_new_tokens - self.generated[r] for r in self.rows)
            depth = min(self.depth, remaining - 1)
            if self.levels is not None and depth >= 1:
                depth = self.depth  # one shape (one graph) to the end: _emit stops each row at max_new_tokens
            self._step(depth, min(self.lookup_tokens, remaining - 1))

        # ---- output
        if self._timed:
            torch.cuda.synchronize()
            for phase, start, stop in self._events:
                setattr(
                    self.stats,
                    phase,
                    getattr(self.stats, phase) + start.elapsed_time(stop) / 1e3,
                )
            self._events.clear()
        new_max = max(self.generated) if self.generated else 0
        seqs = [row + [self.pad_id] * (L + new_max - len(row)) for row in self.tokens]
        st = self.stats
        st.new_tokens = sum(self.generated)
        st.total_time_s = time.perf_counter() - t_start
        st.overhead_time_s = max(st.total_time_s - st.draft_time_s - st.verify_time_s, 0.0)
        st.mean_acceptance_length = st.new_tokens / max(sum(self._forwards_per_row), 1)
        return seqs

    def _step(self, depth: int, lookup: int = 0):
        """One draft + verify + accept step. ``depth`` (tree levels) and ``lookup`` (lookup branch length) may be
        below the configured ones near max_new_tokens."""
        dev = self.device
        b = len(self.rows)
        arange_b = torch.arange(b, device=dev)
        # the lookup branch first: host work while the device is idle, then one copy to it
        chains = [self.lookups[r].propose(lookup) for r in self.rows] if lookup >= 1 else []
        m = max((len(c) for c in chains), default=0)
        if m:  # padded per row (a padding token is verified like any other guess)
            chain = torch.tensor([c + [self.pad_id] * (m - len(c)) for c in chains], device=dev)  # (b, m)
        if depth >= 1:
            t0 = self._clock()
            node_tok, node_parent, node_depth = self._draft_tree(depth)
            self._add_time("draft_time_s", t0, self._clock())
        else:  # one token left for every row: a plain target step
            node_tok = node_parent = node_depth = torch.zeros(b, 0, dtype=torch.long, device=dev)
        n_tree = node_tok.shape[1]  # slots 1..n_tree: the draft tree; after them, the lookup branch
        if m:  # a chain under the root: node n_tree + j is slot n_tree + j + 1, its parent slot n_tree + j (j > 0)
            chain_parent = torch.arange(n_tree, n_tree + m, device=dev)
            chain_parent[0] = 0
            node_tok = torch.cat([node_tok, chain], dim=1)
            node_parent = torch.cat([node_parent, chain_parent.expand(b, m)], dim=1)
            node_depth = torch.cat([node_depth, torch.arange(1, m + 1, device=dev).expand(b, m)], dim=1)
            depth = max(depth, m)
        N = node_tok.shape[1]
        tok = torch.cat([self.root[:, None], node_tok], dim=1)  # (b, N+1), slot 0 = root
        parent = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=dev), node_parent], dim=1)
        level = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=dev), node_depth], dim=1)

        # ancestors (self included): anc[r, i, j] = slot j is on the path root -> i
        eye = torch.eye(N + 1, dtype=torch.bool, device=dev).expand(b, N + 1, N + 1)
        anc = eye
        for _ in range(depth):
            anc = eye | anc.gather(1, parent[:, :, None].expand(b, N + 1, N + 1))

        # ---- verify: [root, nodes] in one target forward
        T = self.tcache.length
        q_pos = self.next_pos[:, None] + level  # (b, N+1)
        allowed = torch.cat([self.t_valid[:, None, :].expand(b, N + 1, T), anc], dim=-1)
        k_pos = torch.cat([self.t_pos, q_pos], dim=-1) if self.window is not None else None
        walk = self.do_sample or not self.history_free  # the walk reads the logits of the nodes it visits
        keep: int | torch.Tensor = 0  # logits of every slot
        if self.lazy_logits and walk:
            keep = 1
        elif self.lazy_logits:  # greedy: slots with children (in any row)
            has_child = torch.zeros(b, N + 1, dtype=torch.bool, device=dev).scatter_(1, node_parent, True)
            wanted = has_child.any(dim=0)
            short = -int(wanted.sum()) * b % LOGITS_ROWS_MULTIPLE  # rows to add (b rows per slot)
            if short:  # the first slots not wanted, as many as make the row count a multiple (or all slots)
                wanted |= (~wanted).cumsum(0) <= -(-short // b)
            keep = wanted.nonzero().squeeze(1)
            if not has_child.any():
                keep = 1
        mask = self._target_mask(allowed, q_pos, k_pos)
        logits, feats, last = self._target_forward(tok, q_pos, mask, logits_to_keep=keep)
        for r in self.rows:
            self._forwards_per_row[r] += 1

        def node_logits(
            slot: torch.Tensor,
        ) -> torch.Tensor:  # (b,) slot per row -> (b, V)
            if isinstance(keep, int) and keep == 0:
                return logits[arange_b, slot]
            return self._lm_head(last[arange_b, slot])

        # ---- accept
        if not walk:
            V = logits.shape[-1]
            scores = logits
            if len(self.processors):
                scores = self._process(logits.float().reshape(-1, V), None).view(b, -1, V)
            best = _argmax(scores)  # (b, kept slots): the target's choice after each slot
            if not (isinstance(keep, int) and keep == 0):
                kept = keep if isinstance(keep, torch.Tensor) else torch.tensor([N], device=dev)
                best_all = torch.full((b, N + 1), -1, dtype=torch.long, device=dev)
                best_all[:, kept] = best
                best = best_all  # -1 at slots without children (and without logits)
            correct = tok == best.gather(1, parent)
            correct[:, 0] = True
            on_good_path = ~(anc & ~correct[:, None, :]).any(dim=-1)
            end = torch.where(on_good_path, level, -1).argmax(dim=-1)  # deepest fully matched slot (b,)
            bonus = best.gather(1, end[:, None]).squeeze(1)
            if not (isinstance(keep, int) and keep == 0) and bool((bonus < 0).any()):
                leaf = node_logits(end)  # a path ended at a slot without children: its logits now
                if len(self.processors):
                    leaf = self._process(leaf.float(), None)
                bonus = torch.where(bonus < 0, _argmax(leaf), bonus)
        else:
            end, bonus = self._walk(node_logits, tok, parent, depth)

        accepted = level.gather(1, end[:, None]).squeeze(1)  # accepted draft tokens per row (b,)
        on_path = anc[arange_b, end]  # (b, N+1)
        W = min(depth, N) + 1
        slot_ids = torch.arange(N + 1, device=dev).expand(b, N + 1)
        path = torch.where(on_path, slot_ids, -1).sort(dim=-1).values[:, -W:]  # right-aligned slots, -1 = hole
        path_tok = tok.gather(1, path.clamp(min=0))
        from_lookup = (end > n_tree).long()  # the accepted path ran along the lookup branch
        host = torch.cat([accepted[:, None], bonus[:, None], from_lookup[:, None], path_tok], dim=1).tolist()  # one sync

        # ---- host: emit, stop conditions, stream
        emitted, from_draft, finished = {}, {}, []
        for i, r in enumerate(self.rows):
            a, bonus_tok, looked_up, toks = host[i][0], host[i][1], host[i][2], host[i][3:]
            new = toks[W - a :] + [bonus_tok]
            taken, done = self._emit(r, new)
            emitted[r], from_draft[r] = taken, min(a, len(taken))
            if looked_up:
                self.stats.lookup_accepted += min(a, len(taken))
            self.stats.accepted_per_step.append(len(taken))
            if done:
                finished.append(i)
        self.stats.steps += 1
        self._publish(emitted, from_draft)
        if len(finished) == b:
            self.rows = []
            return

        # ---- compact the target cache to the accepted paths; queue their features for the draft
        A = max(h[0] for h in host) + 1
        slots = path[:, W - A :]  # (b, A) right-aligned, -1 = hole (a row that accepted fewer)
        slots_valid = slots >= 0
        slots = slots.clamp(min=0)
        self.tcache.keep(slots)
        slots_pos = q_pos.gather(1, slots)
        self.t_valid = torch.cat([self.t_valid, slots_valid], dim=1)
        self.t_pos = torch.cat([self.t_pos, slots_pos], dim=1)
        self.pend_feats = feats.gather(1, slots[:, :, None].expand(b, A, feats.shape[-1]))
        self.pend_tok = torch.cat([path_tok[:, W - A + 1 :], bonus[:, None]], dim=1)  # the token after each slot
        self.pend_pos, self.pend_valid = slots_pos, slots_valid
        self.next_pos = self.next_pos + accepted + 1
        self.root = bonus
        self._drop_rows(finished)

    def _drop_rows(self, finished: list[int]):
        if not finished:
            return
        gone = set(finished)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.tcache.select_rows(idx)
        self.dcache.select_rows(idx)
        for name in (
            "t_valid",
            "t_pos",
            "d_valid",
            "pend_feats",
            "pend_tok",
            "pend_pos",
            "pend_valid",
            "next_pos",
            "root",
        ):
            setattr(self, name, getattr(self, name).index_select(0, idx))

    # ------------------------------------------------------------------ drafting
    def _draft_tree(self, depth: int):
        """Build the dynamic tree. Returns node tokens (b, N) (target ids), parent slots (b, N) (0 = root,
        node i is slot i+1) and depths (b, N); nodes are ordered so that parents precede children."""
        dev = self.device
        b, k = len(self.rows), self.top_k

        # 1. the accepted tokens' target features -> draft context; the root's children from its slot
        A = self.pend_tok.shape[1]
        Td = self.dcache.length
        allowed = None  # causal over the whole draft context
        if self.holes:
            causal = torch.ones(A, A, dtype=torch.bool, device=dev).tril()
            allowed = torch.cat(
                [
                    self.d_valid[:, None, :].expand(b, A, Td),
                    causal[None] & self.pend_valid[:, None, :],
                ],
                dim=-1,
            )
        logits, hidden = self._draft_forward(
            self.pend_tok,
            self.pend_pos,
            allowed,
            features=self.pend_feats,
            logits_to_keep=1,
        )
        self.dcache.commit()
        self.d_valid = torch.cat([self.d_valid, self.pend_valid], dim=1)
        logp = self._draft_log_probs(logits[:, -1])  # (b, Vd)
        score, draft_ids = logp.topk(k, dim=-1)  # (b, k): the root's children
        token = draft_ids + self.d2t[draft_ids]
        if self.levels is not None:  # fixed shapes (a CUDA graph on CUDA)
            return self.levels(self, depth, score, token, hidden[:, -1:])
        # a node at depth d comes with its d - 1 ancestors, so no node past depth total_tokens can be selected: those
        # levels are not drafted (the same tree)
        depth = min(depth, self.total_tokens)
        tree = self._grow(depth, score, token, hidden[:, -1:], self.d_valid[:, None, :], self.dcache, self.next_pos)
        self.dcache.rollback()  # the tree's draft slots are not context
        return tree

    def _can_grow(self, f_score: torch.Tensor) -> bool:
        """Whether to draft a further level: not when every frontier node (b, k) scores below min_node_prob (a child
        always scores below its parent, so the level could add no node) or below grow_min_prob (its nodes would
        rarely be accepted). One sync; never with draft_graph."""
        return self.grow_logp is None or bool((f_score >= self.grow_logp).any())

    def _grow(self, depth, score, token, root_hidden, ctx_allowed, cache, next_pos):
        """Levels 2..depth of the tree from the root's k children (score, token: (b, k); root_hidden (b, 1, H)),
        then the best ``total_tokens`` nodes of the pool. ``ctx_allowed`` (b, 1, C): the draft context slots of
        ``cache`` each row may read; the levels append their slots to ``cache`` after them."""
        dev = self.device
        b, k = score.shape
        H = root_hidden.shape[-1]
        pool_score, pool_tok = [score], [token]
        pool_parent = [None]  # the root's children: "parent = root", set once the pool's size is known
        # frontier: nodes fed to the next draft forward
        f_score, f_tok = score, token
        f_hidden = root_hidden.expand(b, k, H)
        f_index = torch.arange(k, device=dev).expand(b, k)  # pool index
        f_anc = torch.zeros(b, k, 0, dtype=torch.bool, device=dev)  # ancestors among the fed tree slots
        eye_k = torch.eye(k, dtype=torch.bool, device=dev).expand(b, k, k)
        offset = k

        # one draft forward per further level
        for lvl in range(2, depth + 1):
            if not self._can_grow(f_score):
                break  # the tree it would add to is already complete
            anc_self = torch.cat([f_anc, eye_k], dim=-1)  # (b, k, (lvl-1)*k)
            allowed = torch.cat([ctx_allowed.expand(b, k, ctx_allowed.shape[-1]), anc_self], dim=-1)
            f_pos = (next_pos + lvl - 2)[:, None].expand(b, k)  # a depth-d node sits at root pos + d - 1
            logits, hidden = self._draft_forward(f_tok, f_pos, allowed, hidden=f_hidden, cache=cache)
            logp = self._draft_log_probs(logits)  # (b, k, Vd)
            child_logp, child_ids = logp.topk(k, dim=-1)  # (b, k, k)
            c_score = (f_score[:, :, None] + child_logp).reshape(b, k * k)
            c_tok = (child_ids + self.d2t[child_ids]).reshape(b, k * k)
            pool_score.append(c_score)
            pool_tok.append(c_tok)
            pool_parent.append(f_index[:, :, None].expand(b, k, k).reshape(b, k * k))
            if lvl < depth:
                best = c_score.topk(k, dim=-1).indices  # (b, k) next frontier
                parent_j = best // k
                f_score = c_score.gather(1, best)
                f_tok = c_tok.gather(1, best)
                f_hidden = hidden.gather(1, parent_j[:, :, None].expand(b, k, H))
                f_anc = anc_self.gather(1, parent_j[:, :, None].expand(b, k, anc_self.shape[-1]))
                f_index = offset + best
            offset += k * k

        # the best total_tokens nodes of the pool by cumulative log-probability
        pool_score = torch.cat(pool_score, dim=1)  # (b, P)
        P = pool_score.shape[1]
        pool_parent[0] = torch.full((b, k), P, dtype=torch.long, device=dev)  # index P = the root
        N = min(self.total_tokens, P)
        if self.min_node_logp is not None:  # fewer nodes where the draft gives the rest little chance (one sync)
            N = max(1, min(N, int((pool_score >= self.min_node_logp).sum(-1).max())))
        selected = pool_score.topk(N, dim=-1).indices.sort(dim=-1).values  # (b, N), pool order: parents first
        slot_of = torch.full((b, P + 1), -1, dtype=torch.long, device=dev)  # pool index -> node index
        slot_of.scatter_(1, selected, torch.arange(N, device=dev).expand(b, N))
        parent_pool = torch.cat(pool_parent, dim=1).gather(1, selected)
        node_parent = slot_of.gather(1, parent_pool) + 1  # slot of the parent, root = 0
        node_tok = torch.cat(pool_tok, dim=1).gather(1, selected)
        pool_depth = torch.cat(
            [torch.ones(k, dtype=torch.long, device=dev)]
            + [torch.full((k * k,), d, dtype=torch.long, device=dev) for d in range(2, len(pool_tok) + 1)]
        )
        node_depth = pool_depth[selected]
        return node_tok, node_parent, node_depth

    # ------------------------------------------------------------------ acceptance walk
    def _walk(self, node_logits, tok, parent, depth):
        """Walk the tree from the root, level by level (all rows at once): at each node accept one child by
        multi-candidate rejection sampling (greedy: the child equal to the argmax), else stop there and draw
        the bonus token. Returns (end slot (b,), bonus token (b,))."""
        dev = self.device
        cpu = dev.type == "cpu"
        b, S = tok.shape
        arange_b = torch.arange(b, device=dev)
        slots = torch.arange(S, device=dev)
        is_child = (parent[:, None, :] == slots[None, :, None]) & (slots > 0)[None, None, :]  # (b, parent, child)
        cur = torch.zeros(b, dtype=torch.long, device=dev)
        alive = torch.ones(b, dtype=torch.bool, device=dev)
        bonus = torch.zeros(b, dtype=torch.long, device=dev)
        path: list[torch.Tensor] = []  # accepted tokens so far, one (b,) per level
        for _ in range(depth + 1):
            scores = node_logits(cur).float()  # (b, V)
            prefix = torch.stack(path, dim=1) if path else torch.zeros(b, 0, dtype=torch.long, device=dev)
            scores = self._process(
                scores,
                lambda prefix=prefix: [self._history(r, prefix[i]) for i, r in enumerate(self.rows)],
            )
            cand = is_child[arange_b, cur] & alive[:, None]  # (b, S)
            if self.do_sample:
                probs = torch.softmax(scores, dim=-1)
                p_cand = probs.gather(1, tok) * cand
                before = p_cand.cumsum(dim=-1) - p_cand  # mass of the earlier (rejected) children
                left = 1.0 - before
                ratio = torch.where(left > 0, p_cand / left.clamp_min(1e-30), 0.0)
                u = torch.rand(b, S, device=dev, generator=self.generator)
                accept = cand & (u < ratio)
            else:
                best = _argmax(scores)
                accept = cand & (tok == best[:, None])
            has = accept.any(dim=-1)
            stop_here = alive & ~has
            if not cpu or bool(stop_here.any()):  # (no host sync per level on accelerators)
                if self.do_sample:
                    # residual: p without every (rejected) child of this node, renormalised
                    hit = torch.zeros_like(probs).scatter_add_(1, tok, cand.float()) > 0
                    residual = probs.masked_fill(hit, 0.0)
                    empty = residual.sum(dim=-1, keepdim=True) <= 0
                    residual = torch.where(empty, probs, residual)
                    drawn = torch.multinomial(residual, 1, generator=self.generator).squeeze(1)
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


# ----------------------------------------------------------------------------------------------- API
def attention_kernels(device: torch.device | str):
    """On CUDA, scaled-dot-product attention without the cuDNN kernel (a context manager; a no-op elsewhere).
    cuDNN attention builds an execution plan for every new (query length, key length) pair, ~40 ms each on an
    H200 with torch 2.11 (results/cuda-h200/), and decoding meets a new key length at every step; the flash and
    memory-efficient kernels need no plan. Tree decoding runs under it; the benchmark runs every method under it,
    so that all compare on the same kernels (plain ``generate`` with a padding mask was 3.2x slower there
    without it)."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _prepare_draft(draft, target, trust_remote_code: bool | None = False):
    if draft is None:
        raise ValueError(
            "Tree decoding needs an EAGLE-3 draft: pass `draft=` (a loaded Eagle3DraftModel, or a repo id / folder)."
        )
    if isinstance(draft, (str, Path)):
        draft = _load_draft(str(draft), target, trust_remote_code=trust_remote_code)
    if not hasattr(draft, "d2t") or not hasattr(draft.config, "aux_layer_ids"):
        raise ValueError(f"`draft` must be an EAGLE-3 draft (Eagle3DraftModel), got {type(draft).__name__}")
    if callable(getattr(draft, "check_fits", None)):
        draft.check_fits(target)
    else:  # a draft whose modeling code predates check_fits
        check_draft_fits_target(draft, target)
    t_dev = target.get_input_embeddings().weight.device
    d_dev = draft.lm_head.weight.device
    if t_dev != d_dev:
        raise ValueError(f"The draft is on {d_dev} and the target on {t_dev}: move both to the same device.")
    return draft


_LOADED_DRAFTS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _our_draft_class():
    """``Eagle3DraftModel`` when the eagle3_hub package is importable (a Hub copy of this file may run without it)."""
    try:
        from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
    except ImportError:
        return None
    return Eagle3DraftModel


def _load_draft(repo: str, target, revision: str | None = None, trust_remote_code: bool | None = False):
    """Load (once per target) the EAGLE-3 draft stored in ``repo`` (a Hub id or a folder).

    Code from ``repo`` runs only with the caller's ``trust_remote_code=True``: a draft of our own type loads
    through ``Eagle3DraftModel`` when the package is installed, anything else needs the caller's consent."""
    per_target = _LOADED_DRAFTS.setdefault(target, {})
    key = (repo, revision, trust_remote_code)
    if key in per_target:
        return per_target[key]
    from transformers import AutoModel, PretrainedConfig

    weight = target.get_input_embeddings().weight
    kwargs = {"revision": revision} if revision else {}
    config, _ = PretrainedConfig.get_config_dict(repo, **kwargs)  # reads config.json, runs nothing
    ours = _our_draft_class()
    model_type, auto_map = config.get("model_type"), config.get("auto_map")
    if ours is not None and (model_type == ours.config_class.model_type or not auto_map):
        draft = ours.from_pretrained(repo, dtype=weight.dtype, **kwargs)  # our class: no code from the folder
    elif trust_remote_code or not auto_map:
        draft = AutoModel.from_pretrained(repo, trust_remote_code=trust_remote_code, dtype=weight.dtype, **kwargs)
    else:
        raise ValueError(
            f"The draft {repo} needs remote code to load (its config.json has model_type {model_type!r} and an "
            "auto_map): if you trust the code in it, pass trust_remote_code=True, or load it yourself with "
            "AutoModel.from_pretrained(repo, trust_remote_code=True) and pass the model as draft=."
        )
    per_target[key] = draft.to(weight.device).eval().requires_grad_(False)
    return per_target[key]


class _PausedFeatureHooks:
    """A bound draft (``draft.bind(target)``) captures target features on every target forward for assisted
    generation; tree decoding reads ``output_hidden_states`` instead, so the hooks are removed meanwhile."""

    def __init__(self, draft):
        self.draft = draft
        self.target = None

    def __enter__(self):
        if getattr(self.draft, "_hook_handles", None) and hasattr(self.draft, "unbind"):
            self.target = getattr(self.draft, "target", None)
            self.draft.unbind(keep_target=True)
        return self

    def __exit__(self, *exc):
        if self.target is not None and hasattr(self.draft, "_register_feature_hooks"):
            self.draft._register_feature_hooks(self.target)
        return False


def _check_call(target, input_ids, max_new_tokens):
    """The arguments every entry point needs before anything else reads them: one clear error each."""
    if target is None or not hasattr(target, "get_input_embeddings") or not hasattr(target, "config"):
        raise ValueError(
            f"target must be a transformers causal LM (e.g. AutoModelForCausalLM.from_pretrained(...)), got "
            f"{type(target).__name__}."
        )
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(
            f"input_ids must be a tensor of token ids (batch, prompt_len), got {type(input_ids).__name__}: use "
            "tokenizer(..., return_tensors='pt') or torch.tensor([ids])."
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}: e.g. max_new_tokens=256.")


def _run(
    target,
    draft,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    max_new_tokens: int,
    do_sample: bool,
    processors: LogitsProcessorList,
    eos_ids: list[int],
    pad_id: int | None,
    criteria: list,
    streamer,
    on_step,
    generator,
    depth,
    tree_top_k,
    total_tokens,
    lookup_tokens=None,
    draft_graph=None,
    min_node_prob=None,
    grow_min_prob=None,
    trust_remote_code: bool | None = False,
) -> TreeDecodingOutput:
    _check_call(target, input_ids, max_new_tokens)
    draft = _prepare_draft(draft, target, trust_remote_code)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be (batch, prompt_len) with batch >= 1 and prompt_len >= 1, got shape "
            f"{tuple(input_ids.shape)}: pass at least one non-empty prompt."
        )
    device = target.get_input_embeddings().weight.device
    input_ids = input_ids.to(device=device, dtype=torch.long)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
        )
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError(
            "Tree decoding needs left padding (the last prompt position of every row must be a token): "
            "use tokenizer(..., padding_side='left')."
        )
    b = input_ids.shape[0]
    if streamer is not None and b != 1:
        raise ValueError("Streaming works with one prompt at a time (batch size 1), like transformers' streamers.")
    cfg = target.config.get_text_config()
    context = getattr(cfg, "max_position_embeddings", None)
    prompt_len = int(attention_mask.sum(-1).max())
    if context is not None and prompt_len >= context:
        raise ValueError(
            f"The prompt has {prompt_len} tokens but the target's context is {context} positions: shorten the prompt."
        )
    if context is not None and prompt_len + max_new_tokens > context:
        warnings.warn(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) exceeds the target's context ({context}); "
            "quality may degrade past it.",
            stacklevel=3,
        )
    defaults = tree_defaults(device, target.get_input_embeddings().weight.dtype)
    depth = defaults["depth"] if depth is None else depth
    tree_top_k = defaults["top_k"] if tree_top_k is None else tree_top_k
    total_tokens = defaults["total_tokens"] if total_tokens is None else total_tokens
    if lookup_tokens is None:
        lookup_tokens = 0 if do_sample else defaults["lookup_tokens"]
    if draft_graph is None:
        draft_graph = device.type == "cuda"
    if min_node_prob is None:
        min_node_prob = 0.0 if draft_graph else defaults["min_node_prob"]
    if grow_min_prob is None:
        grow_min_prob = 0.0 if draft_graph else defaults["grow_min_prob"]
    _check_tree_parameters(
        depth, tree_top_k, total_tokens, draft.config.draft_vocab_size, lookup_tokens, min_node_prob, grow_min_prob
    )
    for name, value in (("min_node_prob", min_node_prob), ("grow_min_prob", grow_min_prob)):
        if value > 0 and draft_graph:
            raise ValueError(
                f"{name} sizes each tree anew, and draft_graph replays one tree shape: set {name}=0 or "
                "draft_graph=False."
            )
    if lookup_tokens and do_sample:
        raise ValueError(
            "lookup_tokens works with greedy decoding only (its tokens are not samples of the draft): "
            "set lookup_tokens=0 or do_sample=False."
        )
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    if max_new_tokens == 0:
        if streamer is not None:
            streamer.end()
        return TreeDecodingOutput(sequences=input_ids.clone(), stats=TreeDecodingStats())

    decoder = _TreeDecoder(
        target,
        draft,
        depth=depth,
        top_k=tree_top_k,
        total_tokens=total_tokens,
        lookup_tokens=lookup_tokens,
        min_node_prob=float(min_node_prob),
        grow_min_prob=float(grow_min_prob),
        do_sample=do_sample,
        processors=processors,
        eos_ids=eos_ids,
        pad_id=pad_id,
        max_new_tokens=max_new_tokens,
        criteria=criteria,
        streamer=streamer,
        on_step=on_step,
        generator=generator,
        draft_graph=bool(draft_graph),
    )
    was_training = (target.training, draft.training)
    target.eval()
    draft.eval()
    try:
        with _PausedFeatureHooks(draft), torch.inference_mode(), attention_kernels(device):
            rows = decoder.run(input_ids, attention_mask)
    finally:
        target.train(was_training[0])
        draft.train(was_training[1])
        if streamer is not None:
            streamer.end()
    sequences = torch.tensor(rows, dtype=torch.long, device=device)  # a normal tensor (outside inference mode)
    return TreeDecodingOutput(sequences=sequences, stats=decoder.stats)


def _generate(
    target,
    draft,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 256,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    stop_strings: str | list[str] | None = None,
    tokenizer=None,
    streamer=None,
    depth: int | None = None,
    tree_top_k: int | None = None,
    total_tokens: int | None = None,
    lookup_tokens: int | None = None,
    on_step: Callable[[list[list[int]], list[int]], None] | None = None,
    generator: torch.Generator | None = None,
    draft_graph: bool | None = None,
    min_node_prob: float | None = None,
    grow_min_prob: float | None = None,
    trust_remote_code: bool = False,
) -> TreeDecodingOutput:
    """EAGLE tree decoding of ``target`` with ``draft``; equal to ``target.generate`` in distribution (token
    for token when greedy, up to floating-point ties).

    Args:
        target: a transformers causal LM. draft: an ``Eagle3DraftModel`` for it (or a repo id / folder).
        input_ids: (b, L), left-padded when b > 1; attention_mask: (b, L) 1 = token, 0 = padding.
        max_new_tokens: new tokens per row.
        do_sample / temperature / top_k / top_p: as in transformers (top_k=0 and top_p=1.0 disable them).
        eos_token_id: stop ids (default: the target's generation config); stop_strings: needs ``tokenizer``.
        streamer: a transformers streamer (batch size 1); receives the prompt, then each accepted block.
        depth / tree_top_k / total_tokens: tree shape; ``None`` = ``TREE_DEFAULTS`` for the device.
        lookup_tokens: length of the lookup branch (tokens copied from the text so far; greedy only, 0 = none)
            after a 3-token match, less after shorter ones (``LOOKUP_SHARE``); ``None`` = ``TREE_DEFAULTS`` for the
            device when greedy, 0 when sampling.
        on_step: ``on_step(tokens, num_from_draft)`` after every target forward: per row the tokens it just
            committed and how many of them came from the draft tree or the lookup branch (the rest: the
            target's bonus token).
        generator: a ``torch.Generator`` for sampling.
        draft_graph: run the draft's tree levels on fixed shapes, as one CUDA graph per (rows, depth) on CUDA
            (captured at first use: launches, not work, cost the time of a small draft at batch 1). ``None`` =
            on CUDA only; elsewhere the fixed-shape path runs eagerly and is slower (it exists for testing).
        min_node_prob: keep only the tree nodes whose cumulative draft probability reaches it (at least one, at
            most ``total_tokens``); 0 = always ``total_tokens``. ``None`` = ``TREE_DEFAULTS`` for the device (0 with
            ``draft_graph``, which replays one tree shape).
        grow_min_prob: draft a further tree level (up to ``depth``) only while some node of the frontier has a
            cumulative draft probability of at least this: deep trees where the draft is sure, shallow ones where
            it is not. 0 = always ``depth`` levels. ``None`` = ``TREE_DEFAULTS`` for the device (0 with
            ``draft_graph``).
        trust_remote_code: a ``draft`` given as a repo id / folder of another model type than ours may run the
            code it ships only with ``True`` (as in transformers); ours loads without it.

    Returns ``TreeDecodingOutput(sequences (b, L + new), stats)``; rows that stopped are right-padded.
    """
    _check_call(target, input_ids, max_new_tokens)
    if do_sample:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    processors = LogitsProcessorList()
    if do_sample:
        if temperature != 1.0:
            processors.append(_lp.TemperatureLogitsWarper(temperature))
        if top_k > 0:
            processors.append(_lp.TopKLogitsWarper(top_k))
        if top_p < 1.0:
            processors.append(_lp.TopPLogitsWarper(top_p))
    if eos_token_id is None:
        eos_token_id = getattr(target.generation_config, "eos_token_id", None)
    eos_ids = _as_id_list(eos_token_id)
    pad_id = getattr(target.generation_config, "pad_token_id", None)
    criteria = []
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the target's tokenizer: pass tokenizer=...")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    return _run(
        target,
        draft,
        input_ids,
        attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        processors=processors,
        eos_ids=eos_ids,
        pad_id=pad_id,
        criteria=criteria,
        streamer=streamer,
        on_step=on_step,
        generator=generator,
        depth=depth,
        tree_top_k=tree_top_k,
        total_tokens=total_tokens,
        lookup_tokens=lookup_tokens,
        draft_graph=draft_graph,
        min_node_prob=min_node_prob,
        grow_min_prob=grow_min_prob,
        trust_remote_code=trust_remote_code,
    )


def tree_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config,
    draft=None,
    eagle_streamer=None,
    depth: int | None = None,
    tree_top_k: int | None = None,
    total_tokens: int | None = None,
    lookup_tokens: int | None = None,
    on_step: Callable | None = None,
    generator: torch.Generator | None = None,
    draft_graph: bool | None = None,
    min_node_prob: float | None = None,
    grow_min_prob: float | None = None,
    **model_kwargs,
):
    """``target.generate(ids, custom_generate=tree_generate, draft=draft, ...)``.

    transformers builds the logits processors (temperature, top-k, top-p, repetition penalty, ...) and
    stopping criteria from the generation config and hands them here; it drops ``streamer`` for a
    custom_generate callable, so pass one as ``eagle_streamer``. Returns the sequences, or a
    ``TreeDecodingOutput`` with ``return_dict_in_generate=True``. Stop strings need a ``StopStringCriteria``
    in ``stopping_criteria`` (transformers does not hand the tokenizer to a custom_generate callable).
    """
    if getattr(generation_config, "num_beams", 1) > 1:
        raise ValueError("Tree decoding does not do beam search: use num_beams=1.")
    max_length = generation_config.max_length
    max_new_tokens = max(int(max_length) - input_ids.shape[1], 0)
    eos_ids = _as_id_list(getattr(generation_config, "_eos_token_tensor", None))
    if not eos_ids:
        eos_ids = _as_id_list(generation_config.eos_token_id)
    pad = getattr(generation_config, "_pad_token_tensor", None)
    pad_id = int(pad.flatten()[0]) if isinstance(pad, torch.Tensor) else generation_config.pad_token_id
    criteria = [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    out = _run(
        model,
        draft,
        input_ids,
        model_kwargs.get("attention_mask"),
        max_new_tokens=max_new_tokens,
        do_sample=bool(generation_config.do_sample),
        processors=logits_processor,
        eos_ids=eos_ids,
        pad_id=pad_id,
        criteria=criteria,
        streamer=eagle_streamer,
        on_step=on_step,
        generator=generator,
        depth=depth,
        tree_top_k=tree_top_k,
        total_tokens=total_tokens,
        lookup_tokens=lookup_tokens,
        draft_graph=draft_graph,
        min_node_prob=min_node_prob,
        grow_min_prob=grow_min_prob,
    )
    return out if generation_config.return_dict_in_generate else out.sequences


def _custom_generate_source() -> tuple[str | None, str | None, bool | None]:
    """(repo, revision, trust_remote_code) of ``target.generate(custom_generate="repo", ...)`` up the call stack.

    transformers calls a Hub ``custom_generate/generate.py`` as ``generate(model=..., **arguments)`` without the
    repo it came from and without the caller's ``trust_remote_code`` (the file runs from transformers' module
    cache), so both are read from the caller's frame."""
    frame = inspect.currentframe()
    while frame is not None:
        local = frame.f_locals
        if frame.f_code.co_name == "generate" and isinstance(local.get("custom_generate"), str) and "self" in local:
            extra = local.get("kwargs") or {}
            return local["custom_generate"], extra.get("revision"), local.get("trust_remote_code")
        frame = frame.f_back
    return None, None, None


def _generate_from_hub(
    model,
    inputs=None,
    generation_config=None,
    logits_processor=None,
    stopping_criteria=None,
    prefix_allowed_tokens_fn=None,
    synced_gpus=None,
    assistant_model=None,
    streamer=None,
    negative_prompt_ids=None,
    negative_prompt_attention_mask=None,
    draft=None,
    tokenizer=None,
    **kwargs,
):
    """``target.generate(ids, custom_generate="user/draft-repo", trust_remote_code=True, ...)``: loads the
    draft from the same repo (unless ``draft=`` is given) and runs ``tree_generate`` through transformers."""
    if negative_prompt_ids is not None or negative_prompt_attention_mask is not None:
        raise ValueError("Tree decoding does not support negative prompts.")
    if draft is None:
        draft = assistant_model
    # transformers ran this file only with the caller's trust_remote_code=True: their word, passed on as they said it
    repo, revision, trust_remote_code = _custom_generate_source()
    if draft is None:
        if repo is None:
            raise ValueError("Could not tell which repo this custom_generate came from: pass draft=... explicitly.")
        draft = _load_draft(repo, model, revision, trust_remote_code=trust_remote_code)
    elif isinstance(draft, (str, Path)):
        draft = _load_draft(str(draft), model, trust_remote_code=trust_remote_code)
    stop_strings = kwargs.pop("stop_strings", None)
    if generation_config is not None and getattr(generation_config, "stop_strings", None):
        import copy

        stop_strings = stop_strings or generation_config.stop_strings
        generation_config = copy.deepcopy(generation_config)
        generation_config.stop_strings = None
    criteria = StoppingCriteriaList(stopping_criteria or [])
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the target's tokenizer: pass tokenizer=...")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    # the class's generate: an instance whose `generate` was replaced by this file would loop
    return type(model).generate(
        model,
        inputs,
        generation_config=generation_config,
        logits_processor=logits_processor,
        stopping_criteria=criteria,
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        custom_generate=tree_generate,
        draft=draft,
        eagle_streamer=streamer,
        **kwargs,
    )


def generate(*args, **kwargs):
    """EAGLE tree decoding (see ``_generate`` for the arguments):

        generate(target, draft, input_ids, attention_mask=None, max_new_tokens=256, do_sample=False,
                 temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, stop_strings=None, tokenizer=None,
                 streamer=None, depth=None, tree_top_k=None, total_tokens=None, lookup_tokens=None, on_step=None,
                 generator=None, draft_graph=None, min_node_prob=None,
                 grow_min_prob=None, trust_remote_code=False)
        -> TreeDecodingOutput(sequences, stats)

    Also the entry point of ``custom_generate/generate.py``: transformers calls it as
    ``generate(model=target, inputs=..., generation_config=..., ...)``.
    """
    if "model" in kwargs and not args:
        return _generate_from_hub(**kwargs)
    return _generate(*args, **kwargs)


generate.__signature__ = inspect.signature(_generate)  # type: ignore[attr-defined]


def write_custom_generate(folder: str | Path) -> Path:
    """Copy this file to ``folder/custom_generate/generate.py``, with the lean target forward it imports next to it
    (the draft folder also needs its ``modeling_eagle3.py`` and an ``auto_map`` for ``trust_remote_code``)."""
    out = Path(folder) / "custom_generate" / "generate.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    for source, name in ((Path(__file__), "generate.py"), (here / "lean_target_forward.py", "lean_target_forward.py")):
        if not source.is_file():  # this file is itself a custom_generate copy that came without it
            continue
        tmp = out.with_name(f".{name}.{os.getpid()}.tmp")  # atomic: a reader never sees half a file
        tmp.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        os.replace(tmp, out.with_name(name))
    return out


__all__ = [
    "TREE_DEFAULTS",
    "attention_kernels",
    "TreeDecodingOutput",
    "TreeDecodingStats",
    "TreeKVCache",
    "check_draft_fits_target",
    "generate",
    "tree_defaults",
    "tree_generate",
    "write_custom_generate",
]
