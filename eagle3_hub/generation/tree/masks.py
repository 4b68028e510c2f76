"""Attention masks of a tree: boolean "may attend" -> the additive masks transformers' attention takes."""

from __future__ import annotations

import torch
from transformers.masking_utils import sliding_window_overlay


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool (b, q, kv), True = may attend -> additive float mask (b, 1, q, kv). A finite minimum keeps fully
    masked query rows (holes) free of NaN."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min).unsqueeze(1)


def layer_type_masks(
    allowed: torch.Tensor, dtype: torch.dtype, window: int, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> dict[str, torch.Tensor]:
    """bool (b, q, kv) "may attend", with the query and key positions (b, q) and (b, kv) -> transformers' mask dict
    {"full_attention": ..., "sliding_attention": ...}: the sliding one also hides keys ``window`` positions or more
    behind the query (transformers' sliding-window overlay, as the draft model applies it)."""
    sliding = allowed & sliding_window_overlay(window)(None, None, q_pos[:, :, None], k_pos[:, None, :])
    return {"full_attention": additive_mask(allowed, dtype), "sliding_attention": additive_mask(sliding, dtype)}


def attention_layout(text_config) -> tuple[int | None, str]:
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


def ancestors(parent: torch.Tensor, depth: int) -> torch.Tensor:
    """parent (b, S) slot of each slot's parent (slot 0 = root) -> anc (b, S, S): anc[r, i, j] = slot j is on the
    path root -> i (i itself included). ``depth``: the deepest slot's depth."""
    b, S = parent.shape
    eye = torch.eye(S, dtype=torch.bool, device=parent.device).expand(b, S, S)
    anc = eye
    for _ in range(depth):
        anc = eye | anc.gather(1, parent[:, :, None].expand(b, S, S))
    return anc
