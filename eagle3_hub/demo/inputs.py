"""The demo's requests: what one may ask for (``Limits``), what it asked (``Settings``), and one clear message per
bad value. No torch: ``eagle3-hub demo --help`` reads the limits."""

from __future__ import annotations

import math
from dataclasses import dataclass


class DemoError(ValueError):
    """An error whose message is shown in the page as is (bad input, a model that cannot load, ...)."""


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    depth: int = 5
    tree_top_k: int = 8
    total_tokens: int = 24


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (the UI sliders stop here too; API calls are checked against it)."""

    max_new_tokens: int = 512
    max_prompt_chars: int = 4000
    max_context_tokens: int = 2048
    max_temperature: float = 2.0
    max_depth: int = 12
    max_tree_top_k: int = 16
    max_total_tokens: int = 128


def _number(value, name: str, kind):
    """``value`` as the browser or an API client sends it (number or text) -> a finite ``kind``, or a DemoError.
    Text goes through ``float`` first, so ``"24.0"`` and ``"1e2"`` are numbers; ``inf`` and ``nan`` are not."""
    if isinstance(value, bool):
        raise DemoError(f"{name} must be a number, got {value!r}.")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise DemoError(f"{name} must be a number, got {value!r}.") from None
    if not math.isfinite(number):
        raise DemoError(f"{name} must be a number, got {value!r} (inf and nan are not numbers here).")
    if kind is int:
        if number != int(number):
            raise DemoError(f"{name} must be a whole number, got {value!r}.")
        return int(number)
    return number


def _in_range(number, name: str, low, high):
    if not low <= number <= high:
        raise DemoError(f"{name} must be between {low} and {high}, got {number}.")
    return number


def validate_request(prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens, limits: Limits = Limits()):
    """Check one request's inputs; returns (prompt, Settings) or raises ``DemoError`` with what to change."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise DemoError("Type a prompt first.")
    prompt = prompt.strip()
    if len(prompt) > limits.max_prompt_chars:
        raise DemoError(f"The prompt has {len(prompt)} characters; this demo takes at most {limits.max_prompt_chars}.")
    settings = Settings(
        max_new_tokens=_in_range(_number(max_new_tokens, "Max new tokens", int), "Max new tokens", 1, limits.max_new_tokens),
        temperature=_in_range(_number(temperature, "Temperature", float), "Temperature", 0.0, limits.max_temperature),
        depth=_in_range(_number(depth, "Tree depth", int), "Tree depth", 1, limits.max_depth),
        tree_top_k=_in_range(_number(tree_top_k, "Tree top-k", int), "Tree top-k", 1, limits.max_tree_top_k),
        total_tokens=_in_range(_number(total_tokens, "Tree total tokens", int), "Tree total tokens", 1, limits.max_total_tokens),
    )
    candidates = settings.tree_top_k + (settings.depth - 1) * settings.tree_top_k**2
    if settings.total_tokens > candidates:
        raise DemoError(
            f"A tree of depth {settings.depth} and top-k {settings.tree_top_k} proposes {candidates} candidate tokens; "
            f"lower the tree total tokens ({settings.total_tokens}) to at most that, or raise depth / top-k."
        )
    return prompt, settings


def check_context(loaded, *input_ids, settings: Settings, limits: Limits = Limits()):
    """The prompt (with the conversation so far) plus the new tokens must fit the model and the demo. ``loaded``: a
    ``racing.LoadedPair``; ``input_ids``: its (1, n) token tensors."""
    budget = min(limits.max_context_tokens, loaded.context_length)
    longest = max(ids.shape[-1] for ids in input_ids)
    if longest + settings.max_new_tokens + settings.total_tokens > budget:
        raise DemoError(
            f"The conversation is {longest} tokens long; with {settings.max_new_tokens} new tokens it does not fit "
            f"the {budget}-token window of this demo. Clear the conversation or ask for fewer new tokens."
        )
