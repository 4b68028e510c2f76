"""A lean forward of a Llama-family target's decoder, for tree verification on a CPU.

transformers' forward of a small model spends a large share of a CPU step outside its matrix products: module
calls, keyword plumbing, the capture of hidden states, and, for a grouped-query model given a mask (a tree's), a
copy of every layer's keys and values for each query head (``repeat_kv``). ``LeanTargetForward`` runs the same
computation over the model's own weights (no copy) as plain tensor ops, with SDPA's grouped-query mode, and gives
the same hidden states. A step of few queries (a plain step, a small tree) attends with each group's query heads
folded into the query length, one head per key/value head: the same rows of the same products, and on a CPU in
bfloat16 several times faster than SDPA's one-query-per-head path.

It reproduces Llama, Mistral, Qwen2 and Qwen3 decoders (sdpa attention, SiLU MLP, RMSNorm, optional q/k/v biases,
Qwen3's q/k norms) and nothing else: ``LeanTargetForward.for_model`` returns None for any other model, for one with
adapters, hooks or offloading on its layers, and for one whose output a probe finds different from transformers'
forward. Self-contained (torch only): a draft's ``custom_generate/`` carries a copy next to ``generate.py``.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
SILU_CLASSES = ("SiLU", "SiLUActivation")
# up to this many query rows per key/value head, a group's query heads attend folded (faster on a CPU; past it, slower)
FOLD_MAX_ROWS = 24
# the probe's verdict per model, while its weights are the same tensors at the same versions
_verdicts: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


class _Norm(NamedTuple):
    weight: torch.Tensor
    eps: float


class _Layer(NamedTuple):
    input_norm: _Norm
    q: torch.nn.Linear
    k: torch.nn.Linear
    v: torch.nn.Linear
    q_norm: _Norm | None  # Qwen3: RMSNorm over each head's query / key
    k_norm: _Norm | None
    o: torch.nn.Linear
    post_norm: _Norm
    gate: torch.nn.Linear
    up: torch.nn.Linear
    down: torch.nn.Linear


def _norm(module) -> _Norm:
    return _Norm(module.weight, module.variance_epsilon)


def _rms_norm(x: torch.Tensor, norm: _Norm) -> torch.Tensor:
    """As transformers' LlamaRMSNorm: the statistics in float32, the scale in the input's dtype."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x32.to(dtype)


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (b, h, s, d) with cos / sin (b, 1, s, d), halves rotated as in Llama."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _observes_only(hook) -> bool:
    """A hook known to read outputs without changing them: transformers' output recording
    (``output_hidden_states``) and eagle3_hub's feature capture for assisted generation (``eagle3_assistant``, also
    as a trust_remote_code copy). The lean forward does not call hooks; any other hook may change outputs or expect
    to be called."""
    module = getattr(hook, "__module__", None) or ""
    return module.startswith(("transformers.", "eagle3_hub.")) or module.rsplit(".", 1)[-1] == "eagle3_assistant"


def unsupported_reason(model) -> str | None:
    """Why ``model`` is not one ``LeanTargetForward`` reproduces, or None where it is (subject to the probe)."""
    body = getattr(model, "model", None)
    if body is None or not all(hasattr(body, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "not a decoder-only causal LM with model.embed_tokens / layers / norm / rotary_emb"
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(cfg, '_attn_implementation', None)!r}, not 'sdpa'"
    if model.training and getattr(cfg, "attention_dropout", 0.0):
        return "training mode with attention dropout"
    for module in model.modules():
        if hasattr(module, "_hf_hook"):  # accelerate's offloading / device maps
            return "accelerate hooks (offloading or a device map)"
        hooks = list(module._forward_hooks.values()) + list(module._forward_pre_hooks.values())
        if any(not _observes_only(h) for h in hooks):
            return f"forward hooks on {type(module).__name__}"
    if type(body.norm).__name__ not in NORM_CLASSES:
        return f"final norm {type(body.norm).__name__}"
    for layer in body.layers:
        if type(layer).__name__ not in LAYER_CLASSES:
            return f"decoder layer {type(layer).__name__}"
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if any(type(m) is not torch.nn.Linear for m in linears):  # adapters (peft), quantized layers
            return "projections that are not plain nn.Linear (adapters or quantized layers)"
        norms = [layer.input_layernorm, layer.post_attention_layernorm] + [
            getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)
        ]
        if any(type(n).__name__ not in NORM_CLASSES for n in norms):
            return "norms other than RMSNorm"
        if type(mlp.act_fn).__name__ not in SILU_CLASSES:
            return f"MLP activation {type(mlp.act_fn).__name__}"
    return None


def _weights_signature(model) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


class LeanTargetForward:
    """``(ids, position_ids, mask, cache) -> (final normed hidden states, hidden states)`` of a Llama-family
    target, the same as ``model(..., output_hidden_states=True)`` computes them. Build with ``for_model``."""

    def __init__(self, model):
        body = model.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.final_norm = _norm(body.norm)
        self.layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            q_norm, k_norm = (_norm(attn.q_norm), _norm(attn.k_norm)) if hasattr(attn, "q_norm") else (None, None)
            self.layers.append(
                _Layer(
                    _norm(layer.input_layernorm), attn.q_proj, attn.k_proj, attn.v_proj, q_norm, k_norm,
                    attn.o_proj, _norm(layer.post_attention_layernorm), mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                )
            )
        attn = body.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        cfg = model.config
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads  # query heads per key/value head

    @classmethod
    def for_model(cls, model, cache_kwarg: str = "past_key_values") -> LeanTargetForward | None:
        """A lean forward of ``model``, or None where ``unsupported_reason`` finds one or the probe (run once
        while the weights are unchanged) sees its output differ from transformers' forward."""
        if unsupported_reason(model) is not None:
            return None
        lean = cls(model)
        signature = _weights_signature(model)
        hit = _verdicts.get(model)
        if hit is None or hit[0] != signature:
            hit = (signature, lean._agrees_with(model, cache_kwarg))
            _verdicts[model] = hit
        return lean if hit[1] else None

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache):
        """ids, position_ids (b, s); mask: additive (b, 1, s, kv) over the cache's slots and these; cache: has
        transformers' ``update(keys, values, layer_idx) -> (all keys, all values)``. -> (final normed hidden
        states (b, s, H), [embeddings, layer 1, ..., layer n-1, final normed], indexed as transformers'
        ``hidden_states``)."""
        b, s = ids.shape
        d = self.head_dim
        x = self.embed(ids)  # (b, s, H)
        cos, sin = self.rotary(x, position_ids)  # (b, s, d)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        states = [x]
        fold = 1 < self.groups and self.groups * s <= FOLD_MAX_ROWS
        folded_mask = mask.repeat(1, 1, self.groups, 1) if fold and mask is not None else None
        for i, p in enumerate(self.layers):
            h = _rms_norm(x, p.input_norm)
            q = _linear(h, p.q).view(b, s, -1, d)
            k = _linear(h, p.k).view(b, s, -1, d)
            if p.q_norm is not None:
                q, k = _rms_norm(q, p.q_norm), _rms_norm(k, p.k_norm)
            q = _rotate(q.transpose(1, 2), cos, sin)  # (b, h, s, d)
            k = _rotate(k.transpose(1, 2), cos, sin)  # (b, h_kv, s, d)
            v = _linear(h, p.v).view(b, s, -1, d).transpose(1, 2)
            k, v = cache.update(k, v, i)  # (b, h_kv, kv, d)
            if fold:  # query head h reads key/value head h // groups: (b, h_kv, groups * s, d)
                a = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], -1, d), k, v, attn_mask=folded_mask,
                                                   scale=self.scaling).view(b, -1, s, d)
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=self.groups > 1)
            x = x + _linear(a.transpose(1, 2).reshape(b, s, -1), p.o)
            h = _rms_norm(x, p.post_norm)
            x = x + _linear(F.silu(_linear(h, p.gate)) * _linear(h, p.up), p.down)
            states.append(x)
        last = _rms_norm(x, self.final_norm)
        states[-1] = last
        return last, states

    def _agrees_with(self, model, cache_kwarg: str) -> bool:
        """Five tokens causally, then three more under a tree mask (the third does not see the second), through
        transformers' forward and this one: the same hidden states at every layer (float32: to 1e-4 of their
        scale; lower precisions: 2e-2)."""
        from transformers.cache_utils import DynamicCache

        dev = self.embed.weight.device
        vocab = self.embed.weight.shape[0]
        ids = (torch.arange(8, device=dev) * 7919 % vocab)[None]
        pos = torch.arange(8, device=dev)[None]
        allowed = torch.ones(8, 8, dtype=torch.bool, device=dev).tril()
        allowed[7, 6] = False
        dtype = self.embed.weight.dtype
        mask = torch.zeros(1, 1, 8, 8, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        theirs_cache, ours_cache = DynamicCache(), DynamicCache()
        try:
            with torch.no_grad():
                for part in (slice(0, 5), slice(5, 8)):
                    out = model(
                        input_ids=ids[:, part], position_ids=pos[:, part], attention_mask=mask[:, :, part, : part.stop],
                        use_cache=True, output_hidden_states=True, **{cache_kwarg: theirs_cache},
                    )
                    _, ours = self(ids[:, part], pos[:, part], mask[:, :, part, : part.stop], ours_cache)
                    if len(ours) != len(out.hidden_states):
                        return False
                    for a, b in zip(out.hidden_states, ours):
                        scale = float(a.abs().max()) or 1.0
                        if a.shape != b.shape or float((a - b).abs().max()) > tol * scale:
                            return False
        except Exception:  # noqa: BLE001 - any failure of the lean forward means: do not use it
            return False
        return True


__all__ = ["LeanTargetForward", "unsupported_reason"]
