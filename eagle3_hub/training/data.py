"""The recipe's training conversations, assembled: every source read (``sources``) and synthesised prompts, cleaned
(patterns stripped, lengths bounded, duplicates dropped), shuffled, answered by the target (``generation``), and
answers that loop cut where the loop begins (``cut_loops``); ``tokenise`` turns them into training samples.
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
from ..repetition import LOOP_NGRAM, loop_start, repeated_ngram_share
from .generation import answer_settings, fitting_draft, regenerate, regeneration_draft, synthesize_prompts
from .recipe_schema import greedy_repeats, validate_key
from .sources import DataError, dedupe, load_source, prompt_key

GENERATION_REPORT = "generation_report.json"  # in build_conversations' work_dir, next to the data report


def build_conversations(
    sources: list,
    target,
    tokenizer,
    work_dir: str | Path,
    seed: int = 0,
    synthesize: int = 0,
    regenerate_responses: bool = True,
    max_new_tokens: int = 384,
    temperature: float = 0.0,
    batch_size: int = 16,
    max_turns: int = 1,
    min_chars: int = 1,
    max_chars: int = 20000,
    strip_patterns: list[str] | None = None,
    synthesize_seed: int | None = None,
    synthesize_openers: list[str] | None = None,
    synthesize_batch_size: int = 16,
    regenerate_with: str = "generate",
    regenerate_draft: str | None = None,
    target_name: str | None = None,
    answer_sampling: list[dict] | None = None,
    max_repeat_share: float | None = None,
    answers_per_prompt: int = 1,
) -> Dataset:
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
    source answers too is kept beside it: two answers of one prompt are dropped only when they are the same.

    A source given as ``{path, kind: text}`` holds documents: opening/continuation samples (``sources.text_samples``),
    kept as written unless the source says ``regenerate: true`` (then the target continues each opening); two
    pieces that open alike are both kept.

    ``answers_per_prompt`` (``data.answers_per_prompt``): the target answers each prompt it answers this many times,
    sampled (greedy answers would be the same); the returned ``prompt`` column groups a prompt's samples, so the
    held-out split can keep its other answers out of training (``splits.held_out_split``).

    ``max_repeat_share`` (``data.max_repeat_share``): see ``cut_loops``, applied to the assembled data, so the caches
    keep the target's raw answers and another value needs no generation. The answers' loop share, and what was cut
    or dropped, go to the generation report's ``loops``."""
    try:
        validate_key("data.max_repeat_share", max_repeat_share)
        validate_key("data.answers_per_prompt", answers_per_prompt)
    except ValueError as e:
        raise DataError(str(e)) from None
    work_dir = Path(work_dir)
    settings = answer_settings(answer_sampling)
    problem = greedy_repeats(answers_per_prompt, temperature, [st.temperature for st in settings])
    if problem:
        raise DataError(f"data: {problem}")
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

    fresh, kept, texts = [], [], []  # answered by the target here / kept as they are / documents kept as they are
    trained_before = set()  # prompt keys of the `eval: false` sources
    for src in sources:
        spec = {"path": src} if isinstance(src, str) else dict(src)
        n = spec.pop("max_samples", None)
        text = spec.get("kind") == "text"
        own = spec.pop("regenerate", False if text else None)  # natural text is what it is: not rewritten
        eval_ok = spec.pop("eval", True)
        ds = load_source(spec)
        if n:
            ds = ds.shuffle(seed=seed).select(range(min(n, len(ds))))
        if eval_ok is False:
            trained_before.update(prompt_key(m) for m in ds["messages"])
        if own is False or (own is None and not regenerate_responses):
            (texts if text else kept).append(ds)
        else:
            fresh.append(ds)
    if synthesize:
        sseed = seed if synthesize_seed is None else synthesize_seed
        name = f"synth-seed{sseed}"
        if synthesize_openers:  # other openers, other prompts: their own cache
            name += "-openers-" + hashlib.sha1(json.dumps(synthesize_openers).encode()).hexdigest()[:8]
        synth = synthesize_prompts(
            target,
            tokenizer,
            synthesize,
            work_dir / f"{name}.jsonl",
            seed=sseed,
            openers=synthesize_openers,
            batch_size=synthesize_batch_size,
            draft=draft_for(1.0),
            report=calls.setdefault(f"{name}.jsonl", {}),
        )
        if not regenerate_responses:  # the dataset's answers are kept, but synthesised prompts have none yet
            cache = f"answers-{name}-{synthesize}-{max_new_tokens}{_times(answers_per_prompt)}.jsonl"
            synth = regenerate(
                _repeat(synth, answers_per_prompt),
                target,
                tokenizer,
                work_dir / cache,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                batch_size=batch_size,
                draft=draft_for(temperature),
                report=calls.setdefault(cache, {}),
            )
            kept.append(synth)
        else:
            fresh.append(synth)
    if not fresh and not kept and not texts:
        raise DataError("No data: give `data.sources` and/or `data.synthesize` > 0 in the recipe.")
    if answers_per_prompt > 1 and not fresh and not synthesize:
        raise DataError(
            f"data.answers_per_prompt: {answers_per_prompt}, but the target answers no prompt here (every source is "
            "kept as written): set `regenerate: true` on a source, or answers_per_prompt to 1"
        )
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

    def clean(parts: list, whole: bool = False) -> Dataset:
        ds = concatenate_datasets(parts)
        if patterns:
            ds = ds.map(strip, desc="strip patterns")
        before = len(ds)
        ds = dedupe(ds.filter(length_ok, desc="length filter"), whole=whole).shuffle(seed=seed).flatten_indices()
        print(f"[data] {before} samples, {len(ds)} after length filter and dedupe")
        return ds

    out = []
    if fresh:
        ds = clean(fresh)
        who = getattr(target, "name_or_path", None) or getattr(target.config, "_name_or_path", "")
        # the key names no decoder: both write the target's own answers (greedy: the same tokens), so a cache
        # outlives a change of decoder
        how = f"{temperature}" if not settings else f"{[st.tag + ':' + str(st.share) for st in settings]}:{seed}"
        how += _times(answers_per_prompt)
        key = hashlib.sha1(f"{ds._fingerprint}:{who}:{max_new_tokens}:{how}:{max_turns}".encode()).hexdigest()[:10]
        answered = regenerate(
            _repeat(ds, answers_per_prompt),
            target,
            tokenizer,
            work_dir / f"regen-{key}.jsonl",
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            batch_size=batch_size,
            max_turns=max_turns,
            draft=draft_for(0.0 if settings else temperature),
            settings=settings,
            seed=seed,
            report=calls.setdefault(f"regen-{key}.jsonl", {}),
        )
        # a prompt's answers that came out the same are one sample
        out.append(dedupe(answered, whole=True) if answers_per_prompt > 1 else answered)
    if kept:  # several answers of a synthesised prompt are kept too: only answers that came out the same are one
        out.append(clean(kept, whole=answers_per_prompt > 1))
    # sampled answers of prompts a kept source answers too, or several answers of one prompt
    both = any(st.temperature > 0 for st in settings) or answers_per_prompt > 1
    if len(out) > 1:
        out = [dedupe(concatenate_datasets(out), whole=both).shuffle(seed=seed).flatten_indices()]
    out = [_grouped(part, whole=False) for part in out]
    if texts:  # documents whose pieces open alike (a licence header, "Chapter 1") are still different samples
        out.append(_grouped(clean(texts, whole=True), whole=True))
    ds = out[0] if len(out) == 1 else concatenate_datasets(out).shuffle(seed=seed).flatten_indices()
    ds, loops = cut_loops(ds, tokenizer, max_repeat_share, min_chars)
    _record_calls(work_dir / GENERATION_REPORT, calls, setting, draft_path, loops)
    return ds.add_column("eval_ok", [prompt_key(m) not in trained_before for m in ds["messages"]])


def _grouped(ds: Dataset, whole: bool) -> Dataset:
    """The ``prompt`` column the held-out split groups by: a prompt's answers share it; a document's pieces that
    open alike (``whole``) do not."""
    key = (lambda m: hashlib.sha1(json.dumps(m).encode()).hexdigest()) if whole else prompt_key
    return ds.add_column("prompt", [key(m) for m in ds["messages"]])


def _repeat(ds: Dataset, times: int) -> Dataset:
    """Each prompt ``times`` over, to be answered once per copy (``data.answers_per_prompt``)."""
    return ds if times == 1 else concatenate_datasets([ds] * times).flatten_indices()


def _times(answers_per_prompt: int) -> str:
    """The cache-name part of ``answers_per_prompt``: none for one answer, so existing caches keep their names."""
    return "" if answers_per_prompt == 1 else f"x{answers_per_prompt}"


def cut_loops(ds: Dataset, tokenizer, max_share: float | None, min_chars: int = 1) -> tuple[Dataset, dict]:
    """Measure every answer's loop share (``repetition.repeated_ngram_share`` of its token ids under ``tokenizer``,
    the bench's measure) and, with ``max_share``, cut the loops out of the data:

    - an answer whose share is above it is cut where its loop begins (``repetition.loop_start``: the text before
      it says the looping sentence once) and the turns after it are dropped (they follow the loop);
    - a sample is dropped when a cut answer keeps fewer than ``LOOP_NGRAM`` tokens (it looped from its start) or
      the sample falls under ``min_chars``, and when its first user turn loops above ``max_share`` (a synthesised
      opening that loops: its answer continues that loop, and a cut prompt is not what the target answered).

    The training labels of a cut answer stay the target's: the loss reads the target's own distribution at every
    position, so only the tokens after the loop's first time leave the data. Returns the data (``ds`` itself when
    nothing changed) and counts for the generation report."""
    rows = ds["messages"]
    where = [
        (r, t)
        for r, msgs in enumerate(rows)
        for t, m in enumerate(msgs)
        if m["role"] == "assistant" or (max_share is not None and t == _first_user(msgs))
    ]
    measured = _measure([rows[r][t]["content"] for r, t in where], tokenizer, max_share)
    by = dict(zip(where, measured))  # (share, tokens, ids, offsets): ids and offsets of the texts to cut only
    answers = [m for rt, m in by.items() if rows[rt[0]][rt[1]]["role"] == "assistant"]
    report = {"max_repeat_share": max_share, "answers": len(answers), "loop_share": _pooled_share(answers)}
    line = f"[data] loops: {len(answers)} answers, {report['loop_share']:.1%} of their {LOOP_NGRAM}-grams repeat"
    if max_share is None:
        print(line)
        return ds, report
    counts, out, kept_answers, rows_kept = {"cut": 0, "dropped": 0, "dropped_prompts": 0}, [], [], []
    for r, msgs in enumerate(rows):
        first = _first_user(msgs)
        if first is not None and by[(r, first)][0] > max_share:
            counts["dropped_prompts"] += 1
            continue
        kept, mine, cut = [], [], False
        for t, m in enumerate(msgs):
            if m["role"] != "assistant" or by[(r, t)][0] <= max_share:
                kept.append(m)
                mine += [by[(r, t)]] if m["role"] == "assistant" else []
                continue
            _, _, ids, offsets = by[(r, t)]
            start, cut = loop_start(ids), True
            if start < LOOP_NGRAM:
                kept = []
                break
            text = m["content"][: offsets[start][0]] if offsets is not None else tokenizer.decode(ids[:start])
            kept.append({"role": "assistant", "content": text.rstrip()})
            mine.append((repeated_ngram_share(ids[:start]), start))
            break  # later turns follow a looping answer
        if not kept or sum(len(m["content"]) for m in kept) < min_chars:
            counts["dropped"] += 1
            continue
        counts["cut"] += cut
        kept_answers += mine
        out.append(kept)
        rows_kept.append(r)
    report.update(counts, loop_share_kept=_pooled_share(kept_answers))
    print(
        f"{line}; above {max_share}: {counts['cut']} cut where the loop begins, {counts['dropped']} samples dropped "
        f"(looping from the start), {counts['dropped_prompts']} for a looping prompt; {report['loop_share_kept']:.1%} "
        "of the kept answers' n-grams repeat"
    )
    if not any(counts.values()):
        return ds, report
    # the other columns (the held-out split's groups) stay with their rows
    others = ds.select(rows_kept).remove_columns("messages").to_list() if len(ds.column_names) > 1 else [{}] * len(out)
    return Dataset.from_list([{**o, "messages": m} for o, m in zip(others, out)]), report


def _measure(texts: list[str], tokenizer, max_share: float | None, chunk: int = 1024) -> list[tuple]:
    """(loop share, token count, token ids, character offsets) of each text, tokenised ``chunk`` at a time; the ids
    and offsets are kept for texts above ``max_share`` only (the ones to cut), else None."""
    offsets = max_share is not None and getattr(tokenizer, "is_fast", False)  # where each token starts in the text
    out = []
    for a in range(0, len(texts), chunk):
        enc = tokenizer(texts[a : a + chunk], add_special_tokens=False, return_offsets_mapping=offsets)
        for k, ids in enumerate(enc["input_ids"]):
            share = repeated_ngram_share(ids)
            above = max_share is not None and share > max_share
            out.append((share, len(ids), ids if above else None, enc["offset_mapping"][k] if above and offsets else None))
    return out


def _first_user(messages: list[dict]) -> int | None:
    return next((t for t, m in enumerate(messages) if m["role"] == "user"), None)


def _pooled_share(answers: list[tuple]) -> float:
    """The share of repeated n-grams over answers given as (their share, their token count, ...), each counted within
    itself (as ``repetition.repeated_ngrams``, from shares already measured)."""
    counts = [(m[0], m[1] - LOOP_NGRAM + 1) for m in answers if m[1] - LOOP_NGRAM + 1 >= 2]
    total = sum(n for _, n in counts)
    return round(sum(round(share * n) for share, n in counts) / total, 4) if total else 0.0


def _record_calls(path: Path, calls: dict[str, dict], regenerate_with: str, draft: str | None, loops: dict | None = None) -> None:
    """Append the calls that generated something to the generation report, with the assembled data's ``loops``
    (``cut_loops``). A rerun from the caches, or data that needed no generation, adds no call: the report names a
    decoder only when it wrote something; it is written for ``loops`` alone only where it exists or a
    ``max_repeat_share`` cut the data."""
    new = {cache: call for cache, call in calls.items() if call.get("samples")}
    if not new and not (loops and (loops["max_repeat_share"] is not None or path.exists())):
        return
    try:
        log = json.loads(path.read_text())
    except (OSError, ValueError):
        log = {}
    if new:
        log.update({"regenerate_with": regenerate_with, "draft": draft})
    for cache, call in new.items():
        log.setdefault("calls", {}).setdefault(cache, []).append(call)
    if loops:
        log["loops"] = loops
    atomic_write_json(path, log)
