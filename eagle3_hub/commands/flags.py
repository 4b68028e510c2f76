"""Rules for the sampling flags that ``generate`` and ``bench`` share: the same values refused, in the same words."""

from __future__ import annotations

import math


def check_temperature(value: float, given=None) -> float:
    """A temperature: a number >= 0 (0 = greedy)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"--temperature takes numbers >= 0 (0 = greedy), got {given if given is not None else value!r}")
    return float(value)


def check_top_p(value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"--top-p takes a number in (0, 1] (1 = off), got {value!r}")
    return value


def check_top_k(value: int) -> int:
    if value < 0:
        raise ValueError(f"--top-k takes an integer >= 0 (0 = off), got {value!r}")
    return value
