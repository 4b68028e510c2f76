"""CPU fast paths of a verification: the logits of the needed tree slots only, through a oneDNN-packed head.

On a CPU a small model's output head is a large share of a step, and ``F.linear`` over a few rows runs far below
the bandwidth one row reaches; oneDNN with the weight packed once for small batches does not (``pack_linear``; the
lean target forward, ``lean_forward.py``, packs its projections the same way).
"""

from __future__ import annotations

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

_packed_heads: weakref.WeakKeyDictionary[torch.nn.Linear, tuple] = weakref.WeakKeyDictionary()


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


def argmax(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(-1)``; on a CPU through float32, which gives the same index (the conversion is exact and both
    take the first maximum) in much less time than bfloat16's argmax."""
    if scores.device.type == "cpu" and scores.dtype != torch.float32:
        scores = scores.float()
    return scores.argmax(dim=-1)
