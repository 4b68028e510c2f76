"""A lean forward of a Llama-family target's decoder, for tree verification on a CPU.

transformers' forward of a small model spends a large share of a CPU step outside its matrix products: module
calls, keyword plumbing, the capture of hidden states, and, for a grouped-query model given a mask (a tree's), a
copy of every layer's keys and values for each query head (``repeat_kv``). ``LeanTargetForward`` runs the same
computation as plain tensor ops, with SDPA's grouped-query mode, and gives the same hidden states. Its projections
multiply by oneDNN-packed copies of the weights (q/k/v and gate/up each one product) where oneDNN can, else by the
model's own weights. A step of few queries (a plain step, a small tree) attends with each group's query heads
folded into the query length, one head per key/value head: the same rows of the same products, and on a CPU in
bfloat16 several times faster than SDPA's one-query-per-head path.

It reproduces Llama, Mistral, Qwen2 and Qwen3 decoders (sdpa attention, SiLU MLP, RMSNorm, optional q/k/v biases,
Qwen3's q/k norms) and nothing else: ``LeanTargetForward.for_model`` returns None for any other model, for one with
adapters, hooks or offloading on its layers, and for one whose output a probe finds different from transformers'
forward. Torch only (and ``fast_paths.py``): a draft's ``custom_generate/`` carries a copy next to ``generate.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .fast_paths import pack_linear

LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
SILU_CLASSES = ("SiLU", "SiLUActivation")
# up to this many query rows per key/value head, a group's query heads attend folded (faster on a CPU; past it, slower)
FOLD_MAX_ROWS = 24
# the decoder's projections are packed for oneDNN (a copy: their memory once more) up to this many bytes of weights
PACKED_MAX_BYTES = 2 << 30
# per model, while its weights are the same tensors at the same versions: its packed projections (or None) and the
# probe's verdict (True: packed, False: the model's own weights, None: no lean forward)
_verdicts: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


class _Norm(NamedTuple):
    weight: torch.Tensor
    eps: float


class _Layer(NamedTuple):
    input_norm: _Norm
    qkv: Callable  # h -> (q, k, v) projections
    q_norm: _Norm | None  # Qwen3: RMSNorm over each head's query / key
    k_norm: _Norm | None
    o: Callable
    post_norm: _Norm
    gate_up: Callable  # h -> (gate, up) projections
    down: Callable


def _projections(layer) -> tuple[Callable, Callable, Callable, Callable]:
    """(qkv, o, gate_up, down) over the layer's own weights (no copy)."""
    attn, mlp = layer.self_attn, layer.mlp

    def qkv(h):
        return _linear(h, attn.q_proj), _linear(h, attn.k_proj), _linear(h, attn.v_proj)

    def gate_up(h):
        return _linear(h, mlp.gate_proj), _linear(h, mlp.up_proj)

    return qkv, attn.o_proj.forward, gate_up, mlp.down_proj.forward


def _packed_projections(layer) -> tuple[Callable, Callable, Callable, Callable] | None:
    """(qkv, o, gate_up, down) through oneDNN-packed copies, q/k/v and gate/up each as one product (on a CPU, a few
    rows through a packed weight take less time than through F.linear), or None where a projection cannot be packed."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv_layers = (attn.q_proj, attn.k_proj, attn.v_proj)
    sizes = [m.out_features for m in qkv_layers]
    bias = None
    if any(m.bias is not None for m in qkv_layers):
        bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in qkv_layers])
    packed = (
        pack_linear(torch.cat([m.weight for m in qkv_layers]), bias),
        pack_linear(attn.o_proj.weight, attn.o_proj.bias),
        pack_linear(
            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]),
        ),
        pack_linear(mlp.down_proj.weight, mlp.down_proj.bias),
    )
    if any(f is None for f in packed):
        return None
    qkv_f, o_f, gate_up_f, down_f = packed
    split = mlp.gate_proj.out_features

    def qkv(h):
        return qkv_f(h).split(sizes, dim=-1)

    def gate_up(h):
        return gate_up_f(h).split(split, dim=-1)

    return qkv, o_f, gate_up, down_f


def _packed_decoder(model) -> list[tuple] | None:
    """Every layer's ``_packed_projections``, or None where one cannot be packed or the layers' weights take more
    than ``PACKED_MAX_BYTES``."""
    layers = model.model.layers
    if sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters()) > PACKED_MAX_BYTES:
        return None
    packed = [_packed_projections(layer) for layer in layers]
    return None if any(p is None for p in packed) else packed


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

    def __init__(self, model, projections: list[tuple] | None = None):
        """``projections``: per layer (qkv, o, gate_up, down), default ``_projections``."""
        body = model.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.final_norm = _norm(body.norm)
        self.packed = projections is not None
        projections = projections or [_projections(layer) for layer in body.layers]
        self.layers = []
        for layer, (qkv, o, gate_up, down) in zip(body.layers, projections):
            attn = layer.self_attn
            q_norm, k_norm = (_norm(attn.q_norm), _norm(attn.k_norm)) if hasattr(attn, "q_norm") else (None, None)
            self.layers.append(
                _Layer(_norm(layer.input_layernorm), qkv, q_norm, k_norm, o, _norm(layer.post_attention_layernorm), gate_up, down)
            )
        attn = body.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        cfg = model.config
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads  # query heads per key/value head

    @classmethod
    def for_model(cls, model, cache_kwarg: str = "past_key_values") -> LeanTargetForward | None:
        """A lean forward of ``model`` (its projections packed where oneDNN can and they take at most
        ``PACKED_MAX_BYTES``), or None where ``unsupported_reason`` finds one or the probe (run once while the
        weights are unchanged) sees its output differ from transformers' forward, packed and not."""
        if unsupported_reason(model) is not None:
            return None
        signature = _weights_signature(model)
        hit = _verdicts.get(model)
        if hit is None or hit[0] != signature:
            projections = _packed_decoder(model)
            tries = ([projections] if projections is not None else []) + [None]
            packed = next((p is not None for p in tries if cls(model, p)._agrees_with(model, cache_kwarg)), None)
            hit = (signature, projections if packed else None, packed)
            _verdicts[model] = hit
        _, projections, packed = hit
        return None if packed is None else cls(model, projections if packed else None)

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
        fold = self.groups > 1 and self.groups * s <= FOLD_MAX_ROWS
        folded_mask = mask.repeat(1, 1, self.groups, 1) if fold and mask is not None else None
        for i, p in enumerate(self.layers):
            h = _rms_norm(x, p.input_norm)
            q, k, v = p.qkv(h)
            q, k = q.view(b, s, -1, d), k.view(b, s, -1, d)
            if p.q_norm is not None:
                q, k = _rms_norm(q, p.q_norm), _rms_norm(k, p.k_norm)
            q = _rotate(q.transpose(1, 2), cos, sin)  # (b, h, s, d)
            k = _rotate(k.transpose(1, 2), cos, sin)  # (b, h_kv, s, d)
            v = v.reshape(b, s, -1, d).transpose(1, 2)
            k, v = cache.update(k, v, i)  # (b, h_kv, kv, d)
            if fold:  # query head h reads key/value head h // groups: (b, h_kv, groups * s, d)
                a = F.scaled_dot_product_attention(
                    q.reshape(b, k.shape[1], -1, d), k, v, attn_mask=folded_mask, scale=self.scaling
                ).view(b, -1, s, d)
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=self.groups > 1)
            x = x + p.o(a.transpose(1, 2).reshape(b, s, -1))
            h = _rms_norm(x, p.post_norm)
            gate, up = p.gate_up(h)
            x = x + p.down(F.silu(gate) * up)
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
                        input_ids=ids[:, part],
                        position_ids=pos[:, part],
                        attention_mask=mask[:, :, part, : part.stop],
                        use_cache=True,
                        output_hidden_states=True,
                        **{cache_kwarg: theirs_cache},
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
