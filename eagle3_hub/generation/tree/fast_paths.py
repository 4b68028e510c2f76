"""CPU fast paths of a verification: the logits of the needed tree slots only, through a oneDNN-packed head; and a
draft whose products run in int8 (``int8_draft``).

On a CPU a small model's output head is a large share of a step, and ``F.linear`` over a few rows runs far below
the bandwidth one row reaches; oneDNN with the weight packed once for small batches does not (``pack_linear``; the
lean target forward, ``lean_forward.py``, packs its projections the same way). A draft's products need not be exact
(the target verifies every token), so they may run on int8 weights, a quarter of the bytes (``int8_linear``).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

# device types on which a verification computes the target's logits only for the tree slots it needs; elsewhere
# for all slots (no host sync for the index)
LOGITS_SUBSET_DEVICES = ("cpu",)
# ...rounded up to a multiple of this many rows (MKL's small-batch sgemm is much slower for 3 or 7 rows than for
# 4 or 8; the extra rows are other slots' logits, read for free)
LOGITS_ROWS_MULTIPLE = 4
PACKED_ROWS = 8  # the batch size a weight is packed for
# dtypes a weight is packed for, with the check's relative tolerance (a few roundings of the dtype)
PACKED_DTYPES = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# device types on which verifications run through LeanTargetForward where it reproduces the target
LEAN_FORWARD_DEVICES = ("cpu",)

# int8_linear's probe: the largest error it accepts against F.linear, as a share of the output's largest magnitude
INT8_TOLERANCE = 0.05

_packed_heads: weakref.WeakKeyDictionary[torch.nn.Linear, tuple] = weakref.WeakKeyDictionary()
_int8_drafts: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x (..., in) -> x @ weight.T + bias`` through a oneDNN-packed copy of a float32 or bfloat16 CPU ``weight``
    (out, in) (the copy costs its memory once more), or None where oneDNN is missing or disagrees with ``F.linear``
    on random rows. The kernels sum in different orders, as ``F.linear`` does itself for different row counts
    (~1e-6)."""
    w = weight.detach()
    bias = None if bias is None else bias.detach()
    if w.device.type != "cpu" or w.dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return None
    if w.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACKED_ROWS)
        x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):  # a torch build without these oneDNN ops
        return None
    ref = F.linear(x, w, bias)
    rtol = PACKED_DTYPES[w.dtype]
    if (
        got.shape != ref.shape
        or got.dtype != ref.dtype
        or not torch.allclose(got.float(), ref.float(), rtol=rtol, atol=rtol * 0.1 * float(ref.abs().max()))
    ):
        return None

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward


def packed_head(head) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``pack_linear`` of an ``nn.Linear`` head without hooks, cached while its weight is unchanged."""
    if not isinstance(head, torch.nn.Linear) or head._forward_hooks or head._forward_pre_hooks:
        return None
    w, bias = head.weight, head.bias
    key = (w.data_ptr(), w._version, None if bias is None else (bias.data_ptr(), bias._version))
    hit = _packed_heads.get(head)
    if hit is None or hit[0] != key:
        hit = (key, pack_linear(w, bias))
        _packed_heads[head] = hit
    return hit[1]


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x (..., in) -> x @ weight.T + bias`` (float32) through torch's dynamic int8 product (fbgemm): the weight
    quantized once per output channel, each call's input per tensor. None where ``weight`` is not a float32 CPU
    tensor, torch lacks the kernels, or they miss ``F.linear`` by more than ``INT8_TOLERANCE`` on random rows."""
    w = weight.detach()
    bias = None if bias is None else bias.detach()
    if w.device.type != "cpu" or w.dtype != torch.float32:
        return None
    x = torch.randn(4, w.shape[1], generator=torch.Generator().manual_seed(0))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch deprecates creating quantized tensors; only its kernels are used
            scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
            q = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(q, bias)
            # reduce_range: 7-bit inputs, as torch's dynamic quantization does (no overflow on CPUs without VNNI)
            got = torch.ops.quantized.linear_dynamic(x, packed, True)
    except (RuntimeError, AttributeError, NotImplementedError):  # a torch build without the quantized kernels
        return None
    ref = F.linear(x, w, bias)
    if got.shape != ref.shape or float((got - ref).abs().max()) > INT8_TOLERANCE * float(ref.abs().max()):
        return None

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, packed, True)

    return forward


class _Product(torch.nn.Module):
    """An ``nn.Linear`` whose product is ``product``; keeps its ``weight`` and ``bias`` for the code that reads them
    (dtype, device)."""

    def __init__(self, linear: torch.nn.Linear, product: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.weight, self.bias, self.product = linear.weight, linear.bias, product

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)


def int8_draft(draft: torch.nn.Module, keep: tuple[str, ...] = ("fc",)) -> torch.nn.Module | None:
    """A copy of ``draft`` that shares its weights and multiplies by ``int8_linear`` in every ``nn.Linear`` without
    hooks but those named in ``keep`` (the fused-feature ``fc``, whose input spans target layers of very different
    scales: packed float32 there where ``pack_linear`` can). None where a product cannot run in int8. The draft
    itself is left as it is; the copy is cached while its weights are unchanged."""
    key = (keep, tuple((p.data_ptr(), p._version) for p in draft.parameters()))
    hit = _int8_drafts.get(draft)
    if hit is None or hit[0] != key:
        hit = (key, _int8_copy(draft, keep))
        _int8_drafts[draft] = hit
    return hit[1]


def _int8_copy(draft: torch.nn.Module, keep: tuple[str, ...]) -> torch.nn.Module | None:
    def swapped(module: torch.nn.Module, prefix: str) -> torch.nn.Module | None:
        new = copy.copy(module)  # shares parameters, buffers and hooks; only the tree of submodules is new
        new._modules = {}
        for name, child in module._modules.items():
            path = f"{prefix}{name}"
            if isinstance(child, torch.nn.Linear) and not (child._forward_hooks or child._forward_pre_hooks):
                product = pack_linear(child.weight, child.bias) if path in keep else int8_linear(child.weight, child.bias)
                if product is None and path not in keep:
                    return None
                new._modules[name] = child if product is None else _Product(child, product)
            elif child is not None:
                sub = swapped(child, f"{path}.")
                if sub is None:
                    return None
                new._modules[name] = sub
            else:
                new._modules[name] = None
        return new

    return swapped(draft, "")


def argmax(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(-1)``; on a CPU through float32, which gives the same index (the conversion is exact and both
    take the first maximum) in much less time than bfloat16's argmax."""
    if scores.device.type == "cpu" and scores.dtype != torch.float32:
        scores = scores.float()
    return scores.argmax(dim=-1)
