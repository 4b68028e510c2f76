"""Plain decoding through the target forward that tree decoding verifies with: the baseline that isolates what
speculation alone buys.

Tree decoding on a CPU runs its verifications through a lean target forward (``LeanTargetForward``: the same
computation as transformers' forward without its per-module plumbing), computes logits through a oneDNN-packed copy
of the output head, and keeps keys and values in one preallocated buffer (``TreeKVCache``). Part of its speed-up
over ``target.generate`` is those fast paths, not speculation. ``same_forward_generate`` decodes one token per step
through exactly these pieces, chosen by the same rules (the lean forward and the packed head only where they
reproduce the model's own outputs), so ``tree / same_forward`` is the speed-up of speculation alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from ..generation.tree.caches import TreeKVCache
from ..generation.tree.fast_paths import LEAN_FORWARD_DEVICES, LOGITS_SUBSET_DEVICES, argmax, packed_head
from ..generation.tree.lean_forward import LeanTargetForward
from ..generation.tree.masks import attention_layout
from ..generation.tree.verification import forward_cache_kwarg


@dataclass
class SameForwardStats:
    target_forwards: int = 0  # the prefill included
    verify_time_s: float = 0.0  # time inside the target (forward + head)
    lean_forward: bool = False  # the steps ran through LeanTargetForward
    packed_head: bool = False  # the logits came from the oneDNN-packed head


def _sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator=None) -> torch.Tensor:
    """(1, V) float32 logits -> (1, 1) token: temperature, then top-k, then top-p (nucleus), as ``generate`` does."""
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) > top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


@torch.inference_mode()
def same_forward_generate(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, SameForwardStats]:
    """Decode ``input_ids`` (1, L) one token per step; returns (sequences (1, L + n), stats). Greedy output equals
    ``target.generate``'s in float32 (the forward and the head are used only where they reproduce the model's)."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"same_forward_generate decodes one row: input_ids must be (1, L), got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    stats = SameForwardStats()
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    cfg = target.config.get_text_config()
    device = input_ids.device
    cache_kw = forward_cache_kwarg(target)
    head = target.get_output_embeddings()
    L = input_ids.shape[1]

    # the prompt through transformers' forward, as tree decoding's prefill
    t0 = time.perf_counter()
    prefill_cache = DynamicCache()
    out = target(input_ids=input_ids, position_ids=torch.arange(L, device=device)[None], use_cache=True,
                 output_hidden_states=True, logits_to_keep=1, **{cache_kw: prefill_cache})
    logits = out.logits[:, -1]  # (1, V)
    cache = TreeKVCache(cfg.num_hidden_layers, L + max_new_tokens + 1)
    cache.load([(layer.keys, layer.values) for layer in prefill_cache.layers])
    del prefill_cache
    # the fast paths by tree decoding's rules: the head must give the model's own logits, then the lean forward
    head_fn, lean = None, None
    if head is not None and device.type in LOGITS_SUBSET_DEVICES:
        last = out.hidden_states[-1][:, -1:].clone(memory_format=torch.contiguous_format)
        if torch.equal(head(last)[:, -1], logits):  # (a soft-capped model's head alone does not)
            head_fn = packed_head(head) or head
            stats.packed_head = head_fn is not head
            if attention_layout(cfg)[0] is None and device.type in LEAN_FORWARD_DEVICES:
                lean = LeanTargetForward.for_model(target, cache_kw)
                stats.lean_forward = lean is not None
    stats.target_forwards = 1
    stats.verify_time_s += time.perf_counter() - t0

    new: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        scores = logits.float()
        token = _sample(scores, temperature, top_k, top_p, generator) if do_sample else argmax(scores)[:, None]
        new.append(token)
        if int(token) in eos or step == max_new_tokens - 1:
            break
        t0 = time.perf_counter()
        position = torch.full((1, 1), L + step, dtype=torch.long, device=device)
        if lean is not None:
            last, _ = lean(token, position, None, cache)
            logits = head_fn(last[:, -1])
        elif head_fn is not None:  # no lean forward: the model's forward, logits from the head as above
            hidden = target(input_ids=token, position_ids=position, use_cache=True, output_hidden_states=True,
                            logits_to_keep=torch.zeros(0, dtype=torch.long, device=device),
                            **{cache_kw: cache}).hidden_states[-1]
            logits = head_fn(hidden[:, -1])
        else:
            logits = target(input_ids=token, position_ids=position, use_cache=True, logits_to_keep=1,
                            **{cache_kw: cache}).logits[:, -1]
        cache.commit()
        stats.target_forwards += 1
        stats.verify_time_s += time.perf_counter() - t0
    return torch.cat([input_ids, *new], dim=1), stats
