"""The recipe's data sources, read and normalised: a preset name (``training.presets``), a Hub dataset id or a local
json/jsonl/parquet file or folder -> a ``Dataset`` of ``{"messages": [{"role": ..., "content": ...}, ...]}``, in
any of the common chat shapes; and what makes two conversations the same (``prompt_key``, ``dedupe``)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path

from ..extras import missing_extra

try:
    from datasets import Dataset, load_dataset
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from .presets import PRESETS

_ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
             "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}
_PROMPT_FIELDS = ("prompt", "question", "instruction", "input", "text", "query")
_RESPONSE_FIELDS = ("response", "answer", "output", "completion")


class DataError(ValueError):
    """Bad or empty training data: the message says what was expected."""


def normalise_example(example: dict) -> dict:
    """One record of any supported shape -> {"messages": [...]} (empty list when nothing usable)."""
    if example.get("messages"):
        msgs = [{"role": _ROLE_MAP.get(str(m.get("role", "")).lower(), None), "content": m.get("content")} for m in example["messages"]]
    elif example.get("conversations"):
        msgs = [{"role": _ROLE_MAP.get(str(m.get("from", "")).lower(), None), "content": m.get("value")} for m in example["conversations"]]
    else:
        text = next((example[f] for f in _PROMPT_FIELDS if isinstance(example.get(f), str) and example[f].strip()), None)
        extra = example.get("input")
        if text is not None and text != extra and isinstance(extra, str) and extra.strip():  # Alpaca: instruction + input
            text = f"{text}\n\n{extra}"
        msgs = [{"role": "user", "content": text}] if text else []
        reply = next((example[f] for f in _RESPONSE_FIELDS if isinstance(example.get(f), str) and example[f].strip()), None)
        if msgs and reply:  # prompt/response pairs (GSM8K question/answer, Alpaca instruction/output, ...)
            msgs.append({"role": "assistant", "content": reply})
    msgs = [m for m in msgs if m["role"] is not None and isinstance(m["content"], str) and m["content"].strip()]
    # drop leading assistant turns: a conversation starts with the user (or a system prompt)
    while msgs and msgs[0]["role"] == "assistant":
        msgs.pop(0)
    return {"messages": msgs}


def source_spec(source: str | dict) -> dict:
    """A source of the recipe -> ``load_dataset`` arguments: a preset name (``sharegpt``, ``ultrachat``), a Hub
    id or local path, or a dict ``{path, split, data_files, max_samples, ...}`` (a preset name as ``path`` too)."""
    spec = {"path": source} if isinstance(source, str) else dict(source)
    if not spec.get("path"):
        raise DataError(f"A data source needs a `path` (a Hub dataset id, a preset or a local file), got {source!r}")
    preset = PRESETS.get(spec["path"])
    if preset is not None:
        spec = {**preset, **{k: v for k, v in spec.items() if k != "path"}}
    return spec


def load_source(source: str | dict, split: str = "train", max_samples: int | None = None) -> Dataset:
    """A Hub dataset id, a preset name, or a local json/jsonl/parquet file or folder -> normalised Dataset."""
    spec = source_spec(source)
    path = spec.pop("path")
    split = spec.pop("split", split)
    limit = spec.pop("max_samples", max_samples)
    p = Path(path)
    try:
        if p.exists():
            files = sorted(str(f) for f in (p.rglob("*") if p.is_dir() else [p]) if f.suffix in (".json", ".jsonl", ".parquet"))
            if not files:
                raise DataError(f"{path}: no .json, .jsonl or .parquet files")
            if all(os.path.getsize(f) == 0 for f in files):
                raise DataError(f"{path}: the dataset is empty")
            kind = "parquet" if files[0].endswith(".parquet") else "json"
            ds = load_dataset(kind, data_files=files, split="train")
        else:
            ds = load_dataset(path, split=split, **spec)
    except DataError:
        raise
    except Exception as e:  # malformed files, unknown Hub ids, no network: say which source and what it holds
        where = "local file" if p.exists() else "Hub dataset (or a local path that does not exist)"
        causes, cause = [], e
        while cause is not None and len(causes) < 4:  # datasets wraps the parser's error: show the chain
            causes.append(f"{type(cause).__name__}: {cause}".strip().rstrip(":"))
            cause = cause.__cause__ or cause.__context__
        raise DataError(f"Could not load the {where} {path!r}: " + " <- ".join(causes)) from e
    if limit:
        ds = ds.select(range(min(limit, len(ds))))
    if len(ds) == 0:
        raise DataError(f"{path}: the dataset is empty")
    # the fingerprint names the normaliser's source, so every later cached step is redone when it changes
    version = hashlib.sha1((ds._fingerprint + inspect.getsource(normalise_example) + repr(_RESPONSE_FIELDS)).encode()).hexdigest()
    ds = ds.map(normalise_example, remove_columns=ds.column_names, desc=f"normalise {p.name or path}", new_fingerprint=version)
    ds = ds.filter(lambda ex: len(ex["messages"]) > 0, desc="drop empty")
    if len(ds) == 0:
        raise DataError(
            f"{path}: no usable sample. Expected `messages` (role/content), `conversations` (from/value) "
            f"or a prompt field ({', '.join(_PROMPT_FIELDS)})."
        )
    return ds


def prompt_key(messages: list[dict]) -> str:
    """What makes two conversations the same for dedupe: the first user turn, whitespace and case folded."""
    first = next((m["content"] for m in messages if m["role"] == "user"), "")
    return hashlib.sha1(" ".join(first.split()).lower().encode()).hexdigest()


def dedupe(ds: Dataset, whole: bool = False) -> Dataset:
    """Drop samples whose first user turn was seen before (``whole``: whose whole conversation was)."""
    seen = set()

    def keep(ex):
        key = prompt_key(ex["messages"]) if not whole else hashlib.sha1(json.dumps(ex["messages"]).encode()).hexdigest()
        if key in seen:
            return False
        seen.add(key)
        return True

    return ds.filter(keep, desc="dedupe")
