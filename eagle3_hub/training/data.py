"""The recipe's training conversations, assembled: every source read (``sources``) and synthesised prompts, cleaned
(patterns stripped, lengths bounded, duplicates dropped), shuffled, and answered by the target (``generation``);
``tokenise`` turns them into training samples.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..extras import missing_extra

try:
    from datasets import Dataset, concatenate_datasets
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from ..atomic import atomic_write_json
from ..benchmark.options import SAME_FORWARD
from .generation import answer_settings, fitting_draft, regenerate, regeneration_draft, synthesize_prompts
from .sources import DataError, dedupe, load_source, prompt_key

GENERATION_REPORT = "generation_report.json"  # in build_conversations' work_dir, next to the data report


def build_conversations(sources: list, target, tokenizer, work_dir: str | Path, seed: int = 0,
                        synthesize: int = 0, regenerate_responses: bool = True, max_new_tokens: int = 384,
                        temperature: float = 0.0, batch_size: int = 16, max_turns: int = 1,
                        min_chars: int = 1, max_chars: int = 20000, strip_patterns: list[str] | None = None,
                        synthesize_seed: int | None = None, synthesize_openers: list[str] | None = None,
                        synthesize_batch_size: int = 16, regenerate_with: str = "generate",
                        regenerate_draft: str | None = None, target_name: str | None = None,
                        answer_sampling: list[dict] | None = None) -> Dataset:
    """All sources (+ synthesised prompts), filtered, deduplicated, shuffled with ``seed`` and (by default)
    answered by the target. Intermediate results live in ``work_dir`` so an interrupted run resumes.

    ``regenerate_with`` / ``regenerate_draft`` / ``target_name``: the recipe's ``data.regenerate_with``,
    ``data.regenerate_draft`` and ``target.name`` (see ``regeneration_draft``). ``tree`` decodes every call with
    the draft; ``auto`` the greedy ones only (answers at temperature 0), where it writes the same tokens as
    ``generate``, and on a CPU as ``same_forward`` (faster for batches); sampled calls (prompt synthesis) stay on
    ``generate``, so that a seed keeps its prompts. The decoder
    and speed of every call that generated something are appended to ``work_dir/generation_report.json``.

    A source given as ``{path, regenerate: false}`` keeps its answers whatever ``regenerate_responses`` says:
    for data this target has already answered (an earlier run's ``regen-*.jsonl``). One given with ``eval: false``
    never goes to the held-out split (data an earlier stage trained on): the returned ``eval_ok`` column says
    which samples may.

    ``answer_sampling`` (``data.answer_sampling``): the target answers each prompt at one of these settings (greedy
    or sampled, by ``share``; see ``regenerate``), every setting through the same decoder (sampling by tree
    decoding or the same forward keeps the target's distribution). A sampled answer of a prompt that another
    source answers too is kept beside it: two answers of one prompt are dropped only when they are the same."""
    work_dir = Path(work_dir)
    settings = answer_settings(answer_sampling)
    draft_path = regeneration_draft(regenerate_with, regenerate_draft, target_name)
    setting = regenerate_with  # what the report names; each call records the decoder it ran
    if regenerate_with == "auto" and target.device.type == "cpu":
        # batched data on a CPU: a tree verifies rows x nodes tokens per step, slower than one token per row
        # (benchmarks/smollm2-135m-instruct/regeneration); the same forward writes the same greedy tokens fastest
        regenerate_with, draft_path = SAME_FORWARD, None
    loaded: dict = {}
    calls: dict[str, dict] = {}  # cache file name -> its call's decoder and speed

    def draft_for(temperature: float):
        if regenerate_with == SAME_FORWARD:  # sampled calls stay on generate: a seed keeps its prompts
            return SAME_FORWARD if temperature == 0 else None
        if draft_path is None or (regenerate_with == "auto" and temperature > 0):
            return None
        if "draft" not in loaded:
            # a reference draft that `auto` picked and that does not fit (another aux layer choice, ...): generate
            loaded["draft"] = fitting_draft(draft_path, target, quiet=regenerate_with == "auto" and regenerate_draft is None)
        return loaded["draft"]

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
                                   openers=synthesize_openers, batch_size=synthesize_batch_size,
                                   draft=draft_for(1.0), report=calls.setdefault(f"{name}.jsonl", {}))
        if not regenerate_responses:  # the dataset's answers are kept, but synthesised prompts have none yet
            cache = f"answers-{name}-{synthesize}-{max_new_tokens}.jsonl"
            synth = regenerate(synth, target, tokenizer, work_dir / cache, max_new_tokens=max_new_tokens,
                               temperature=temperature, batch_size=batch_size, draft=draft_for(temperature),
                               report=calls.setdefault(cache, {}))
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
        # the key names no decoder: both write the target's own answers (greedy: the same tokens), so a cache
        # outlives a change of decoder
        how = f"{temperature}" if not settings else f"{[st.tag + ':' + str(st.share) for st in settings]}:{seed}"
        key = hashlib.sha1(f"{ds._fingerprint}:{who}:{max_new_tokens}:{how}:{max_turns}".encode()).hexdigest()[:10]
        out.append(regenerate(ds, target, tokenizer, work_dir / f"regen-{key}.jsonl", max_new_tokens=max_new_tokens,
                              temperature=temperature, batch_size=batch_size, max_turns=max_turns,
                              draft=draft_for(0.0 if settings else temperature), settings=settings, seed=seed,
                              report=calls.setdefault(f"regen-{key}.jsonl", {})))
    if kept:
        out.append(clean(kept))
    _record_calls(work_dir / GENERATION_REPORT, calls, setting, draft_path)
    both = any(st.temperature > 0 for st in settings)  # sampled answers of prompts a kept source answers too
    ds = out[0] if len(out) == 1 else dedupe(concatenate_datasets(out), whole=both).shuffle(seed=seed).flatten_indices()
    return ds.add_column("eval_ok", [prompt_key(m) not in trained_before for m in ds["messages"]])


def _record_calls(path: Path, calls: dict[str, dict], regenerate_with: str, draft: str | None) -> None:
    """Append the calls that generated something to the generation report. A rerun from the caches, or data that
    needed no generation, adds nothing: the report names a decoder only when it wrote something."""
    new = {cache: call for cache, call in calls.items() if call.get("samples")}
    if not new:
        return
    try:
        log = json.loads(path.read_text())
    except (OSError, ValueError):
        log = {}
    log.update({"regenerate_with": regenerate_with, "draft": draft})
    for cache, call in new.items():
        log.setdefault("calls", {}).setdefault(cache, []).append(call)
    atomic_write_json(path, log)

