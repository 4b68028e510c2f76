"""The recipe's data sources, read and normalised: a preset name (``training.presets``), a Hub dataset id or a local
json/jsonl/parquet file or folder -> a ``Dataset`` of ``{"messages": [{"role": ..., "content": ...}, ...]}``, in
any of the common chat shapes; and what makes two conversations the same (``prompt_key``, ``dedupe``).

A source given as ``{path, kind: text}`` holds documents instead (.txt/.md files, or records with a ``text`` field):
each becomes samples whose user turn is a short opening and whose answer is the rest of the text (``text_samples``),
natural text for a base model's draft."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from pathlib import Path

from ..extras import missing_extra

try:
    from datasets import Dataset, load_dataset
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from .presets import PRESETS
from .recipe_schema import RECORD_SUFFIXES, TEXT_KEYS, Source, defaults, validate_source

logger = logging.getLogger(__name__)

_ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
_PROMPT_FIELDS = ("prompt", "question", "instruction", "input", "text", "query")
_RESPONSE_FIELDS = ("response", "answer", "output", "completion")


class DataError(ValueError):
    """Bad or empty training data: the message says what was expected."""


TEXT_OPTIONS = {k: v for k, v in defaults(Source).items() if k in TEXT_KEYS}  # the defaults of a text source's keys
TEXT_OPENING_CHARS, TEXT_MAX_CHARS = TEXT_OPTIONS["opening_chars"], TEXT_OPTIONS["max_chars"]


def normalise_example(example: dict) -> dict:
    """One record of any supported shape -> {"messages": [...]} (empty list when nothing usable)."""
    if example.get("messages"):
        msgs = [{"role": _ROLE_MAP.get(str(m.get("role", "")).lower()), "content": m.get("content")} for m in example["messages"]]
    elif example.get("conversations"):
        msgs = [
            {"role": _ROLE_MAP.get(str(m.get("from", "")).lower()), "content": m.get("value")} for m in example["conversations"]
        ]
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


def text_options(spec: dict) -> dict | None:
    """Pop a source's ``kind`` and the options of a ``kind: text`` source from ``spec``: those options (defaults
    filled in) for a text source, None for a chat one; one line names a bad value (the recipe schema's ``Source``)."""
    try:
        validate_source(spec, f"data source {spec.get('path')!r}: ")
    except ValueError as e:
        raise DataError(str(e)) from None
    kind = spec.pop("kind", "chat")
    options = {**TEXT_OPTIONS, **{k: spec.pop(k) for k in TEXT_OPTIONS if k in spec}}
    if kind == "chat":
        return None
    suffixes = options["suffixes"]
    options["suffixes"] = (suffixes,) if isinstance(suffixes, str) else tuple(suffixes)
    return options


def _break(text: str, limit: int) -> tuple[int, int]:
    """Where a span of at most ``limit`` characters of ``text`` ends, and where the rest starts: at the span's last
    line break in its second half, else its last space there, else mid-word at ``limit``."""
    for sep in ("\n", " "):
        k = text.rfind(sep, limit // 2, limit + 1)
        if k > 0:
            return k, k + 1
    return limit, limit


def text_samples(documents, opening_chars: int = TEXT_OPENING_CHARS, max_chars: int = TEXT_MAX_CHARS) -> list[dict]:
    """Documents -> samples ``{"messages": [user: opening, assistant: the rest]}``: a document longer than
    ``max_chars`` is cut into pieces (at line breaks where it can), each a sample; a piece opens with at most
    ``opening_chars`` characters, and at most half of it, ending at a line break or a space. The chat template
    writes its own separator between the two, in place of the one the cut removes."""
    out = []
    for doc in documents:
        rest = doc.strip() if isinstance(doc, str) else ""
        while rest:
            end, start = _break(rest, max_chars) if len(rest) > max_chars else (len(rest), len(rest))
            piece, rest = rest[:end].rstrip(), rest[start:].lstrip("\n")
            if len(piece) < 2:
                continue
            cut, after = _break(piece, min(opening_chars, len(piece) // 2))
            opening, continuation = piece[:cut].rstrip(), piece[after:].lstrip("\n")
            if opening.strip() and continuation.strip():
                out.append({"messages": [{"role": "user", "content": opening}, {"role": "assistant", "content": continuation}]})
    return out


BINARY_SHARE = 0.01  # a text file with more undecodable bytes than this (or a NUL byte) is refused as binary


def _text_file(path: str) -> str:
    """One document: the file as UTF-8. A binary file would train on replacement characters: refused, naming it; a
    few stray bytes are replaced, said in a warning."""
    data = Path(path).read_bytes()
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
    if b"\0" in data or bad > BINARY_SHARE * max(len(text), 1):
        why = "it holds NUL bytes" if b"\0" in data else f"{bad} of its characters do not decode"
        raise DataError(
            f"{path} is not UTF-8 text ({why}: a binary file?): a `kind: text` source reads its "
            ".txt/.md files as documents. Remove it, or convert it to UTF-8 text."
        )
    if bad:
        logger.warning("%s: %d bytes are not UTF-8, read as replacement characters.", path, bad)
    return text


def _documents(path: str, files: list[str], records: Dataset | None, field: str, suffixes: tuple) -> list[str]:
    """The documents of a ``kind: text`` source: each text file (one of ``suffixes``) whole, then each record's
    ``field``."""
    docs = [_text_file(f) for f in files if f.endswith(suffixes)]
    if records is not None:
        if field not in records.column_names:
            raise DataError(
                f"{path}: a `kind: text` source reads each record's `{field}` field, but its fields are "
                f"{', '.join(records.column_names)}: set `field` to the one that holds the text."
            )
        docs += [t for t in records[field] if isinstance(t, str)]
    return docs


def load_source(source: str | dict, split: str = "train", max_samples: int | None = None) -> Dataset:
    """A Hub dataset id, a preset name, or a local json/jsonl/parquet file or folder -> normalised Dataset; with
    ``kind: text``, documents (also .txt/.md files) -> opening/continuation samples (``text_samples``)."""
    spec = source_spec(source)
    text = text_options(spec)
    path = spec.pop("path")
    split = spec.pop("split", split)
    limit = spec.pop("max_samples", max_samples)
    p = Path(path)
    suffixes = RECORD_SUFFIXES + (text["suffixes"] if text else ())
    files: list[str] = []
    try:
        if p.exists():
            files = sorted(str(f) for f in (p.rglob("*") if p.is_dir() else [p]) if f.name.endswith(suffixes) and f.is_file())
            if not files:
                raise DataError(f"{path}: no {', '.join(suffixes[:-1])} or {suffixes[-1]} files")
            if all(os.path.getsize(f) == 0 for f in files):
                raise DataError(f"{path}: the dataset is empty")
            records = [f for f in files if f.endswith(RECORD_SUFFIXES)]
            kind = "parquet" if records and records[0].endswith(".parquet") else "json"
            ds = load_dataset(kind, data_files=records, split="train") if records else None
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
    if text is not None:
        docs = _documents(path, files, ds, text["field"], text["suffixes"])
        samples = text_samples(docs, text["opening_chars"], text["max_chars"])
        if not samples:
            raise DataError(f"{path}: no document long enough to split into an opening and a continuation")
        return Dataset.from_list(samples[:limit] if limit else samples)
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
