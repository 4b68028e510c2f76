"""What a bench run can be asked for: the method names, and the tree settings parsed from text (comma lists per key,
``number_list``; explicit settings, ``tree_settings``; their grid, ``tree_grid``). Free of torch: the command line
reads it for ``--help``."""

from __future__ import annotations

import itertools

SAME_FORWARD = "same_forward"  # the second baseline: plain decoding through tree decoding's forward
METHOD_NAMES = ("plain", SAME_FORWARD, "lookup", "assisted", "tree", "assistant", "oracle")
# the methods that need an EAGLE-3 draft (oracle: the target proposes, on tree decoding's verifier for that draft)
DRAFT_METHODS = ("assisted", "tree", "oracle")
TREE_KEY_TYPES = {
    "depth": int,
    "tree_top_k": int,
    "total_tokens": int,
    "lookup_tokens": int,
    "min_node_prob": float,
    "grow_min_prob": float,
    "adaptive": int,
    "draft_sampling": int,
    "draft_int8": int,
}  # adaptive, draft_sampling, draft_int8: 1 on, 0 off
TREE_KEYS = tuple(TREE_KEY_TYPES)

SWEEP_DEFAULTS = {"depth": "3,5,7", "tree_top_k": "4,8", "total_tokens": "16,32,60"}


def number_list(text, kind: type = int) -> list:
    """A comma-separated list of numbers of type ``kind`` (``[None]`` when not given: the default setting)."""
    if text is None:
        return [None]
    if isinstance(text, (list, tuple)):
        return [kind(x) for x in text]
    out = []
    for x in str(text).split(","):
        if x.strip():
            try:
                out.append(kind(x))
            except ValueError:
                raise ValueError(f"{x.strip()!r} in {text!r} is not a{'n integer' if kind is int else ' number'}") from None
    return out


def tree_settings(text: str) -> list[dict]:
    """Settings separated by ``;``, each ``key=value,...`` over ``TREE_KEYS`` (unset keys: the device default),
    e.g. ``"depth=3;depth=8,grow_min_prob=0.3"``."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        setting = {}
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, eq, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or key not in TREE_KEY_TYPES:
                raise ValueError(f"--trees: {pair!r} is not key=value with a key among {', '.join(TREE_KEYS)}")
            try:
                setting[key] = TREE_KEY_TYPES[key](value.strip())
            except ValueError:
                raise ValueError(
                    f"--trees: {key} takes a{'n integer' if TREE_KEY_TYPES[key] is int else ' number'}, got {value.strip()!r}"
                ) from None
        out.append(setting)
    if not out:
        raise ValueError("--trees: give at least one tree setting, e.g. --trees 'depth=3;depth=8,grow_min_prob=0.3'")
    return out


def tree_grid(trees: str | None = None, **lists) -> list[dict]:
    """The tree settings to run: ``trees`` (``tree_settings``) as listed, else every combination of the per-key
    lists in ``lists`` (``depth="3,5"``, ``tree_top_k=...``, ``total_tokens``, ``lookup_tokens``, ``min_node_prob``,
    ``grow_min_prob``). Shapes that are not trees are dropped; none left is a ``ValueError``."""
    unknown = set(lists) - set(TREE_KEYS)
    if unknown:
        raise ValueError(f"unknown tree keys {sorted(unknown)}: use {', '.join(TREE_KEYS)}")
    if trees:
        grid = tree_settings(trees)
    else:
        values = [number_list(lists.get(k), TREE_KEY_TYPES[k]) for k in TREE_KEYS]
        grid = [{k: v for k, v in zip(TREE_KEYS, combo) if v is not None} for combo in itertools.product(*values)]
    from ..generation.tree.config import check_setting

    for setting in grid:  # a value outside its range is refused, never dropped with the shapes below
        for key, value in setting.items():
            if key in ("adaptive", "draft_sampling"):
                if value not in (0, 1):
                    raise ValueError(f"{key} takes 1 (on) or 0 (off), got {value!r}")
                continue
            check_setting(key, value)
    # a tree of depth d and top-k k proposes k + (d - 1) * k^2 nodes: larger total_tokens is not a tree shape
    fits = [
        g
        for g in grid
        if not {"depth", "tree_top_k", "total_tokens"} <= g.keys()
        or g["total_tokens"] <= g["tree_top_k"] + (g["depth"] - 1) * g["tree_top_k"] ** 2
    ]
    if grid and not fits:
        raise ValueError("No tree shape in the sweep is valid: total_tokens must be <= top_k + (depth - 1) * top_k**2.")
    return fits
