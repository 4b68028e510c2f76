"""Tiny random causal LMs of several architectures, built from a config in milliseconds (no download)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from eagle3_hub.benchmark.random_target import copy_draft  # noqa: F401  (the one copy draft, shared by the tests)

ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3"]

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
_EXTRA = {
    "qwen3": dict(head_dim=16),
    "gemma2": dict(head_dim=16, sliding_window=64),
    "gemma3_text": dict(head_dim=16, sliding_window=64),
    "mistral": dict(sliding_window=None),
    "phi3": dict(num_key_value_heads=4),
}


def make_tiny_target(arch: str = "llama", seed: int = 0, dtype=torch.float32, **overrides):
    """A random-initialised target; eval mode, frozen."""
    kwargs = {**_COMMON, **_EXTRA.get(arch, {}), **overrides}
    if arch == "gemma3":  # the multimodal wrapper (Gemma3ForConditionalGeneration) around a tiny text model
        text = {**_COMMON, **_EXTRA["gemma3_text"], **overrides}
        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=16
        )
        config = AutoConfig.for_model(arch, text_config=text, vision_config=vision, mm_tokens_per_image=4)
    else:
        config = AutoConfig.for_model(arch, **kwargs)
    config._attn_implementation = "sdpa" if arch not in ("gemma2",) else "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval().requires_grad_(False)


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """1D prompts -> (ids, attention_mask), left-padded with 0 to the longest."""
    L = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), L, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :], mask[i, L - len(p) :] = p, 1
    return ids, mask
