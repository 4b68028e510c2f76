"""Training data for a draft: load chat datasets of the common shapes, regenerate responses with the target,
self-synthesise prompts (Magpie style), and tokenise with the chat template and an assistant-only loss mask.

Every sample is normalised to ``{"messages": [{"role": ..., "content": ...}, ...]}``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from pathlib import Path

import torch
from datasets import Dataset, concatenate_datasets, load_dataset
from datasets.fingerprint import Hasher
from tqdm.auto import tqdm

# Named presets: real Hub dataset ids with the split and shape they hold.
PRESETS = {
    "sharegpt": {"path": "Aeala/ShareGPT_Vicuna_unfiltered", "split": "train", "data_files": "ShareGPT_V4.3_unfiltered_cleaned_split.json"},
    "ultrachat": {"path": "HuggingFaceH4/ultrachat_200k", "split": "train_sft"},
}

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


def dedupe(ds: Dataset) -> Dataset:
    """Drop samples whose first user turn was seen before."""
    seen = set()

    def keep(ex):
        key = prompt_key(ex["messages"])
        if key in seen:
            return False
        seen.add(key)
        return True

    return ds.filter(keep, desc="dedupe")


# ---------------------------------------------------------------------------------------------- generation
@torch.no_grad()
def _generate_batch(target, tokenizer, conversations: list[list[dict]], max_new_tokens: int, temperature: float,
                    add_generation_prompt: bool = True, raw_prefixes: list[str] | None = None) -> list[str]:
    if raw_prefixes is not None:
        texts = raw_prefixes
    else:
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=False) for c in conversations]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
    out = target.generate(
        **enc, max_new_tokens=max_new_tokens, do_sample=temperature > 0, temperature=temperature or None,
        top_p=0.95 if temperature > 0 else None, pad_token_id=tokenizer.pad_token_id,
    )
    return [tokenizer.decode(o[enc.input_ids.shape[1]:], skip_special_tokens=True).strip() for o in out]


def regenerate(ds: Dataset, target, tokenizer, cache_path: str | Path, max_new_tokens: int = 384,
               temperature: float = 0.0, batch_size: int = 16, max_turns: int = 1) -> Dataset:
    """Replace every assistant turn by the target's own answer (turn by turn, batched).

    Resumable: finished batches are appended to ``cache_path`` (jsonl keyed by sample index), a rerun skips
    them. A draft must learn the target's distribution, so this is the default for training data.
    """
    cache_path = Path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    done: dict[int, list] = {}
    if cache_path.exists():
        with open(cache_path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill: redo that sample
                    continue
                done[rec["i"]] = rec["messages"]
    todo = [i for i in range(len(ds)) if i not in done]
    bar = tqdm(total=len(ds), initial=len(ds) - len(todo), desc="regenerate responses", unit="sample")
    with open(cache_path, "a") as f:
        for start in range(0, len(todo), batch_size):
            idx = todo[start:start + batch_size]
            users = [[m for m in ds[i]["messages"] if m["role"] != "assistant"] for i in idx]
            convs = [[] for _ in idx]
            for turn in range(max_turns):
                active = [j for j, u in enumerate(users) if sum(m["role"] == "user" for m in u) > turn]
                if not active:
                    break
                for j in active:  # append system prompts and the next user turn
                    n_user = 0
                    for m in users[j]:
                        n_user += m["role"] == "user"
                        if n_user == turn + 1 and m["role"] == "user":
                            convs[j].append(m)
                            break
                        if turn == 0 and m["role"] == "system" and not convs[j]:
                            convs[j].append(m)
                answers = _generate_batch(target, tokenizer, [convs[j] for j in active], max_new_tokens, temperature)
                for j, a in zip(active, answers):
                    convs[j].append({"role": "assistant", "content": a})
            for i, c in zip(idx, convs):
                f.write(json.dumps({"i": i, "messages": c}) + "\n")
                done[i] = c
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(idx))
    bar.close()
    return Dataset.from_list([{"messages": done[i]} for i in range(len(ds))])


def synthesize_prompts(target, tokenizer, num_prompts: int, cache_path: str | Path, seed: int = 0,
                       max_new_tokens: int = 96, temperature: float = 1.0, batch_size: int = 16,
                       openers: list[str] | None = None) -> Dataset:
    """Magpie-style self-synthesis: feed the chat template's *user prefix* alone and let the target write
    the user's message. Resumable through ``cache_path`` (jsonl).

    ``openers`` (e.g. ``["Write", "Explain", "Pretend you are"]``) start the user's message, in turn: a small
    target left alone mostly asks for advice, an opener steers it to other kinds of request."""
    prefix = user_prefix(tokenizer)
    cache_path = Path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    prompts = []
    if cache_path.exists():
        for line in open(cache_path):
            try:
                prompts.append(json.loads(line)["prompt"])
            except json.JSONDecodeError:
                continue
    bar = tqdm(total=num_prompts, initial=min(len(prompts), num_prompts), desc="synthesise prompts", unit="prompt")
    torch.manual_seed(seed + len(prompts))
    attempts, max_attempts = 0, 10 * num_prompts + batch_size
    with open(cache_path, "a") as f:
        while len(prompts) < num_prompts:
            if attempts >= max_attempts:
                raise DataError(f"The target wrote {len(prompts)} usable prompts in {attempts} tries (10..2000 characters "
                                f"wanted): it cannot self-synthesise; give `data.sources` instead.")
            starts = [openers[(len(prompts) + j) % len(openers)].strip() if openers else "" for j in range(batch_size)]
            attempts += batch_size
            outs = _generate_batch(target, tokenizer, [None] * batch_size, max_new_tokens, temperature,
                                   raw_prefixes=[prefix + start for start in starts])
            for start, text in zip(starts, outs):
                text = (start + " " + text.split("<|im_end|>")[0]).strip()
                if 10 <= len(text) <= 2000 and len(prompts) < num_prompts:
                    prompts.append(text)
                    f.write(json.dumps({"prompt": text}) + "\n")
                    bar.update(1)
            f.flush()
    bar.close()
    return Dataset.from_list([{"messages": [{"role": "user", "content": p}]} for p in prompts[:num_prompts]])


def user_prefix(tokenizer) -> str:
    """The text a chat template writes before a user message's content (incl. a default system prompt)."""
    if not tokenizer.chat_template:
        raise DataError("The tokenizer has no chat template: set `chat_template` in the recipe or use a chat model.")
    marker = "\x00USER\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return text[: text.index(marker)]


# ---------------------------------------------------------------------------------------------- tokenising
def render_with_mask(tokenizer, messages: list[dict], max_length: int) -> dict:
    """Chat template + loss mask on assistant tokens only. Works for templates without generation markers:
    assistant spans are found by rendering growing prefixes of the conversation. Samples longer than
    ``max_length`` tokens are truncated (``truncated`` says so, for the data report)."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (full.startswith(before) and full.startswith(upto)):
            raise DataError(
                "The chat template does not render conversations prefix by prefix (e.g. it rewrites earlier turns), "
                "so the assistant tokens cannot be located: use single-turn conversations (regeneration with data.max_turns: 1 "
                "writes them) or another chat template."
            )
        spans.append((len(before), len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    n = len(enc["input_ids"])
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"][:max_length]]
    return {"input_ids": enc["input_ids"][:max_length], "loss_mask": mask, "truncated": n > max_length}


def tokenize_dataset(ds: Dataset, tokenizer, max_length: int, num_proc: int | None = None, min_loss_tokens: int = 1) -> tuple[Dataset, dict]:
    """Tokenise with loss masks. Long samples are truncated to ``max_length`` (no packing), samples without loss
    tokens dropped; both are counted in the returned report."""
    if not tokenizer.chat_template:
        raise DataError("The tokenizer has no chat template: set `chat_template` in the recipe or use a chat model.")
    # datasets hashes module functions by name: name the code, the tokenizer and the length in the cache key
    fingerprint = Hasher.hash((ds._fingerprint, inspect.getsource(render_with_mask), tokenizer, max_length))
    out = ds.map(lambda ex: render_with_mask(tokenizer, ex["messages"], max_length),
                 remove_columns=[c for c in ds.column_names if c != "eval_ok"],
                 num_proc=num_proc, desc="tokenise", new_fingerprint=fingerprint)
    n_trunc = sum(out["truncated"])
    kept = out.filter(lambda ex: sum(ex["loss_mask"]) >= min_loss_tokens, desc="drop samples without loss tokens")
    report = {"samples": len(out), "truncated": n_trunc, "dropped_no_loss_tokens": len(out) - len(kept), "kept": len(kept)}
    if len(kept) == 0:
        raise DataError(f"No sample has assistant tokens to learn from ({report}). Regenerate responses or check the data.")
    return kept.remove_columns("truncated"), report


def build_conversations(sources: list, target, tokenizer, work_dir: str | Path, seed: int = 0,
                        synthesize: int = 0, regenerate_responses: bool = True, max_new_tokens: int = 384,
                        temperature: float = 0.0, batch_size: int = 16, max_turns: int = 1,
                        min_chars: int = 1, max_chars: int = 20000, strip_patterns: list[str] | None = None,
                        synthesize_seed: int | None = None, synthesize_openers: list[str] | None = None,
                        synthesize_batch_size: int = 16) -> Dataset:
    """All sources (+ synthesised prompts), filtered, deduplicated, shuffled with ``seed`` and (by default)
    answered by the target. Intermediate results live in ``work_dir`` so an interrupted run resumes.

    A source given as ``{path, regenerate: false}`` keeps its answers whatever ``regenerate_responses`` says:
    for data this target has already answered (an earlier run's ``regen-*.jsonl``). One given with ``eval: false``
    never goes to the held-out split (data an earlier stage trained on): the returned ``eval_ok`` column says
    which samples may."""
    work_dir = Path(work_dir)
    fresh, kept = [], []  # answered by the target here / kept as they are
    trained_before = set()  # prompt keys of the `eval: false` sources
    for src in sources:
        spec = {"path": src} if isinstance(src, str) else dict(src)
        n = spec.pop("max_samples", None)
        own = spec.pop("regenerate", None)
        eval_ok = spec.pop("eval", True)
        ds = load_source(spec)
        if n:
            ds = ds.shuffle(seed=seed).select(range(min(n, len(ds))))
        if eval_ok is False:
            trained_before.update(prompt_key(m) for m in ds["messages"])
        (kept if own is False or (own is None and not regenerate_responses) else fresh).append(ds)
    if synthesize:
        sseed = seed if synthesize_seed is None else synthesize_seed
        name = f"synth-seed{sseed}"
        if synthesize_openers:  # other openers, other prompts: their own cache
            name += "-openers-" + hashlib.sha1(json.dumps(synthesize_openers).encode()).hexdigest()[:8]
        synth = synthesize_prompts(target, tokenizer, synthesize, work_dir / f"{name}.jsonl", seed=sseed,
                                   openers=synthesize_openers, batch_size=synthesize_batch_size)
        if not regenerate_responses:  # the dataset's answers are kept, but synthesised prompts have none yet
            synth = regenerate(synth, target, tokenizer, work_dir / f"answers-{name}-{synthesize}-{max_new_tokens}.jsonl",
                               max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size)
            kept.append(synth)
        else:
            fresh.append(synth)
    if not fresh and not kept:
        raise DataError("No data: give `data.sources` and/or `data.synthesize` > 0 in the recipe.")
    patterns = [re.compile(p) for p in strip_patterns or []]

    def strip(ex):
        msgs = []
        for m in ex["messages"]:
            text = m["content"]
            for p in patterns:
                text = p.sub("", text)
            msgs.append({"role": m["role"], "content": text})
        return {"messages": msgs}

    def length_ok(ex):
        n = sum(len(m["content"]) for m in ex["messages"])
        return min_chars <= n <= max_chars

    def clean(parts: list) -> Dataset:
        ds = concatenate_datasets(parts)
        if patterns:
            ds = ds.map(strip, desc="strip patterns")
        before = len(ds)
        ds = dedupe(ds.filter(length_ok, desc="length filter")).shuffle(seed=seed).flatten_indices()
        print(f"[data] {before} samples, {len(ds)} after length filter and dedupe")
        return ds

    out = []
    if fresh:
        ds = clean(fresh)
        who = getattr(target, "name_or_path", None) or getattr(target.config, "_name_or_path", "")
        key = hashlib.sha1(f"{ds._fingerprint}:{who}:{max_new_tokens}:{temperature}:{max_turns}".encode()).hexdigest()[:10]
        out.append(regenerate(ds, target, tokenizer, work_dir / f"regen-{key}.jsonl", max_new_tokens=max_new_tokens,
                              temperature=temperature, batch_size=batch_size, max_turns=max_turns))
    if kept:
        out.append(clean(kept))
    ds = out[0] if len(out) == 1 else dedupe(concatenate_datasets(out)).shuffle(seed=seed).flatten_indices()
    return ds.add_column("eval_ok", [prompt_key(m) not in trained_before for m in ds["messages"]])


__all__ = ["PRESETS", "DataError", "normalise_example", "source_spec", "load_source", "dedupe", "regenerate", "synthesize_prompts", "prompt_key",
           "user_prefix", "render_with_mask", "tokenize_dataset", "build_conversations"]
