"""Training data for a draft: load chat datasets of the common shapes, regenerate responses with the target,
self-synthesise prompts (Magpie style), and tokenise with the chat template and an assistant-only loss mask.

Every sample is normalised to ``{"messages": [{"role": ..., "content": ...}, ...]}``.

The target writes with plain ``target.generate`` or, given an EAGLE-3 draft for it, with lossless tree decoding
(``data.regenerate_with``): greedy tree decoding writes plain greedy's tokens (float32; bfloat16 may part at
near-ties, as any change of kernels or batch may), in fewer target forwards.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..extras import missing_extra

try:
    from datasets import Dataset, concatenate_datasets, load_dataset
    from datasets.fingerprint import Hasher
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from ..atomic import atomic_write_json
from ..generation.tree import generate as tree_decode
from ..generation.tree import load_draft
from ..generation.tree.same_forward import same_forward_generate
from ..targets import reference_draft
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


# ---------------------------------------------------------------------------------------------- generation
REGENERATE_WITH = ("auto", "tree", "generate", "same_forward")
# `draft` of the generation calls for plain decoding through tree decoding's verifier, one token per step
# (`same_forward_generate`): greedy, it writes plain greedy's tokens, with the lean forward and packed head
SAME_FORWARD = "same_forward"
GENERATION_REPORT = "generation_report.json"  # in build_conversations' work_dir, next to the data report


def regeneration_draft(regenerate_with: str = "auto", regenerate_draft: str | None = None,
                       target_name: str | None = None) -> str | None:
    """The draft that decodes the target's answers and prompts (``data.regenerate_with``, ``data.regenerate_draft``),
    or None for plain ``target.generate``. Reads no model: a recipe check may call it before anything is loaded.

    ``generate`` and ``same_forward``: None. ``tree``: ``regenerate_draft``, else the reference draft shipped for ``target_name`` (the
    recipe's ``target.name``; None is the embedded target), else a ValueError. ``auto``: the same, None where
    neither exists."""
    if regenerate_with not in REGENERATE_WITH:
        raise ValueError(f"data.regenerate_with must be one of {', '.join(REGENERATE_WITH)}, got {regenerate_with!r}")
    if regenerate_with in ("generate", SAME_FORWARD):
        return None
    if regenerate_draft is not None:
        if not isinstance(regenerate_draft, (str, Path)) or not str(regenerate_draft).strip():
            raise ValueError(f"data.regenerate_draft must be a draft folder or Hub id, got {regenerate_draft!r}")
        path = Path(regenerate_draft)
        if path.exists() and not (path / "config.json").is_file():
            raise FileNotFoundError(f"data.regenerate_draft {path}: no config.json there; give an EAGLE-3 draft folder "
                                    "(e.g. an `eagle3-hub train` output) or a Hub id.")
        if not path.exists() and not re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", str(regenerate_draft)):
            raise FileNotFoundError(f"data.regenerate_draft {regenerate_draft} does not exist: give an EAGLE-3 draft "
                                    "folder or a Hub id (owner/name).")
        return str(regenerate_draft)
    folder = reference_draft(target_name)
    if (folder / "config.json").is_file():
        return str(folder)
    if regenerate_with == "tree":
        raise ValueError(f"data.regenerate_with: tree needs an EAGLE-3 draft for {target_name or 'the embedded target'} "
                         f"and none is shipped for it ({folder} has no config.json): set data.regenerate_draft to a "
                         "draft folder or Hub id, or use data.regenerate_with: generate.")
    return None


@dataclass
class GenerationSpeed:
    """What one regeneration or synthesis call wrote and how fast: the data report says which decoder made the
    data, and CPU time (all threads of this process) makes runs that shared the machine comparable."""

    decoder: str
    draft: str | None = None
    samples: int = 0
    new_tokens: int = 0
    target_forwards: int = 0  # batched forwards, prefill included
    wall_s: float = 0.0
    cpu_s: float = 0.0
    row_steps: int = 0  # tree decoding: (forward, active row) pairs after the prefill, and the tokens they committed
    row_step_tokens: int = 0

    def add(self, samples: int, new_tokens: int, target_forwards: int, wall_s: float, cpu_s: float, stats=None) -> None:
        self.samples += samples
        self.new_tokens += new_tokens
        self.target_forwards += target_forwards
        self.wall_s += wall_s
        self.cpu_s += cpu_s
        if stats is not None:
            self.row_steps += len(stats.accepted_per_step)
            self.row_step_tokens += sum(stats.accepted_per_step)

    def as_dict(self) -> dict:
        out = {"decoder": self.decoder, "draft": self.draft, "samples": self.samples, "new_tokens": self.new_tokens,
               "target_forwards": self.target_forwards, "wall_s": round(self.wall_s, 2), "cpu_s": round(self.cpu_s, 2),
               "tokens_per_s": round(self.new_tokens / self.wall_s, 2) if self.wall_s else None,
               "tokens_per_cpu_minute": round(60 * self.new_tokens / self.cpu_s, 1) if self.cpu_s else None}
        if self.decoder == "tree":  # tokens a row commits per target forward: the draft's acceptance on this data
            out["acceptance_length"] = round(self.row_step_tokens / self.row_steps, 3) if self.row_steps else None
        return out

    def line(self, what: str) -> str:
        d = self.as_dict()
        by = {"tree": "tree decoding" + (f" (draft {self.draft})" if self.draft else ""),
              SAME_FORWARD: "plain decoding through the tree verifier"}.get(self.decoder, "plain generate")
        accepted = f", acceptance length {d['acceptance_length']}" if d.get("acceptance_length") else ""
        return (f"[data] {what}: {by}, {d['new_tokens']} new tokens for {d['samples']} samples in {d['wall_s']} s, "
                f"{d['target_forwards']} target forwards ({d['tokens_per_s']} tokens/s, {d['tokens_per_cpu_minute']} "
                f"tokens per CPU-minute{accepted})")


def _speed(draft) -> GenerationSpeed:
    if draft is None or draft == SAME_FORWARD:
        return GenerationSpeed("generate" if draft is None else SAME_FORWARD)
    name = str(draft) if isinstance(draft, (str, Path)) else getattr(draft, "name_or_path", None)
    return GenerationSpeed("tree", name or None)


def _eos_ids(target, tokenizer) -> set[int]:
    ids = getattr(target.generation_config, "eos_token_id", None)
    ids = set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


@contextmanager
def contiguous_head_input(target):
    """``generate``'s batched prefill gives the head a strided (b, 1, H) slice of the prompt's hidden states; for a
    frozen head torch runs that as a batched product with a copy of the head's weight per row (seconds for a 262k
    vocabulary). A contiguous copy of the slice makes it one matrix product, with the same result."""
    handle = target.get_output_embeddings().register_forward_pre_hook(lambda _, args: (args[0].contiguous(),))
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def _generate_batch(target, tokenizer, conversations: list[list[dict]], max_new_tokens: int, temperature: float,
                    add_generation_prompt: bool = True, raw_prefixes: list[str] | None = None, draft=None,
                    speed: GenerationSpeed | None = None, top_p: float = 0.95, seed: int | None = None) -> list[str]:
    """The target's continuations of a batch (left-padded): plain ``generate``, tree decoding with ``draft``, or
    plain decoding through tree decoding's verifier (``draft=SAME_FORWARD``). ``seed``: the draws of a sampled
    batch (torch's global generator otherwise)."""
    if raw_prefixes is not None:
        texts = raw_prefixes
    else:
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=False) for c in conversations]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
    sample = temperature > 0
    generator = None
    if sample and seed is not None:
        torch.manual_seed(seed)  # generate and tree decoding draw from the global generator
        generator = torch.Generator(device=target.device).manual_seed(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    if draft is None:
        with contiguous_head_input(target):
            out = target.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature or None,
                top_p=top_p if sample else None, pad_token_id=tokenizer.pad_token_id,
            )
        stats, forwards = None, out.shape[1] - enc.input_ids.shape[1]
    elif draft == SAME_FORWARD:
        out, sf = same_forward_generate(target, enc.input_ids, max_new_tokens, attention_mask=enc.attention_mask,
                                        do_sample=sample, temperature=temperature if sample else 1.0,
                                        top_p=top_p if sample else 1.0, eos_token_id=sorted(_eos_ids(target, tokenizer)),
                                        pad_token_id=tokenizer.pad_token_id, generator=generator)
        stats, forwards = None, sf.target_forwards
    else:  # sampling draws from the same distribution as generate (with other draws for the same seed)
        res = tree_decode(target, draft, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=max_new_tokens,
                          do_sample=sample, temperature=temperature if sample else 1.0, top_p=top_p if sample else 1.0)
        out, stats = res.sequences, res.stats
        forwards = stats.target_forwards
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # a row ends at its first stop token: the two decoders pad finished rows differently
    eos, rows = _eos_ids(target, tokenizer), []
    for row in out[:, enc.input_ids.shape[1]:].tolist():
        stop = next((n for n, t in enumerate(row) if t in eos), None)
        rows.append(row if stop is None else row[: stop + 1])
    if speed is not None:
        speed.add(len(rows), sum(len(r) for r in rows), forwards, wall, cpu, stats)
    return [tokenizer.decode(r, skip_special_tokens=True).strip() for r in rows]


@dataclass(frozen=True)
class AnswerSetting:
    """How the target answers a share of the prompts (``data.answer_sampling``): greedy (``temperature: 0``) or
    sampled with ``temperature`` and ``top_p``; ``share`` weighs how many prompts get it."""

    temperature: float = 0.0
    top_p: float = 1.0
    share: float = 1.0

    @property
    def tag(self) -> str:
        return "greedy" if self.temperature == 0 else f"T={self.temperature:g},top_p={self.top_p:g}"


def answer_settings(spec) -> list[AnswerSetting]:
    """``data.answer_sampling`` (a list of ``{temperature, top_p, share}``) -> settings; one line names a bad entry."""
    if spec is None:
        return []
    if not isinstance(spec, (list, tuple)):
        raise DataError(f"data.answer_sampling must be a list of {{temperature, top_p, share}}, got {spec!r}")
    out = []
    for n, entry in enumerate(spec):
        if not isinstance(entry, dict) or set(entry) - {"temperature", "top_p", "share"}:
            raise DataError(f"data.answer_sampling[{n}] must be a mapping of temperature, top_p and share, got {entry!r}")
        t, top_p, share = entry.get("temperature", 0.0), entry.get("top_p", 1.0), entry.get("share", 1.0)
        for name, v in (("temperature", t), ("top_p", top_p), ("share", share)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise DataError(f"data.answer_sampling[{n}].{name} must be a number, got {v!r}")
        if t < 0 or not 0 < top_p <= 1 or share <= 0:
            raise DataError(f"data.answer_sampling[{n}]: temperature >= 0, 0 < top_p <= 1 and share > 0 wanted, "
                            f"got {entry!r}")
        out.append(AnswerSetting(float(t), float(top_p) if t > 0 else 1.0, float(share)))
    return out


def assign_setting(settings: list[AnswerSetting], key: str, seed: int) -> int:
    """The setting a prompt is answered with: drawn by its ``prompt_key`` and the seed, so a prompt keeps its
    setting whatever the order, the batch or a resume."""
    x = random.Random(f"{seed}:{key}").random() * sum(st.share for st in settings)
    for n, st in enumerate(settings):
        x -= st.share
        if x < 0:
            return n
    return len(settings) - 1


def _batch_seed(seed: int, setting: int, first: int) -> int:
    return int(hashlib.sha1(f"{seed}:{setting}:{first}".encode()).hexdigest()[:8], 16)


def regenerate(ds: Dataset, target, tokenizer, cache_path: str | Path, max_new_tokens: int = 384,
               temperature: float = 0.0, batch_size: int = 16, max_turns: int = 1, draft=None,
               report: dict | None = None, settings: list[AnswerSetting] | None = None, seed: int = 0) -> Dataset:
    """Replace every assistant turn by the target's own answer (turn by turn, batched).

    Resumable: finished batches are appended to ``cache_path`` (jsonl keyed by sample index, with the decoder and
    the sampling that wrote them), a rerun skips them. A draft must learn the target's distribution, so this is the
    default for training data.

    ``settings`` (``data.answer_sampling``): each prompt is answered at one of them (``assign_setting``), greedy or
    sampled; a sampled batch draws from a seed of (``seed``, its setting, its first sample), so a resumed run writes
    what an uninterrupted one would. Without them every answer is at ``temperature`` (top-p 0.95 when sampled).

    ``draft``: an EAGLE-3 draft for ``target`` (a loaded model, a folder or a Hub id): the answers come from tree
    decoding, greedy ones token for token as from ``generate`` (float32), sampled ones from the same distribution;
    ``SAME_FORWARD``: plain decoding through tree decoding's verifier, the same tokens in fewer CPU-seconds on CPUs.
    ``report``: a dict this call fills with its decoder and speed (``GenerationSpeed.as_dict``).
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
    settings = list(settings or [AnswerSetting(temperature, 0.95 if temperature > 0 else 1.0)])
    which = {i: assign_setting(settings, prompt_key(ds[i]["messages"]), seed) if len(settings) > 1 else 0
             for i in range(len(ds)) if i not in done}
    todo = sorted(which)
    speed = _speed(draft)
    bar = tqdm(total=len(ds), initial=len(ds) - len(todo), desc="regenerate responses", unit="sample")
    batches = []  # one setting per batch; a resumed run cuts the rest of each setting's prompts as before
    for k in sorted(set(which.values())):
        ids = [i for i in todo if which[i] == k]
        batches += [ids[a:a + batch_size] for a in range(0, len(ids), batch_size)]
    with open(cache_path, "a") as f:
        for idx in batches:
            k = which[idx[0]]
            setting = settings[k]
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
                answers = _generate_batch(target, tokenizer, [convs[j] for j in active], max_new_tokens,
                                          setting.temperature, draft=draft, speed=speed, top_p=setting.top_p,
                                          seed=_batch_seed(seed, k, idx[0]) + turn if setting.temperature > 0 else None)
                for j, a in zip(active, answers):
                    convs[j].append({"role": "assistant", "content": a})
            for i, c in zip(idx, convs):
                f.write(json.dumps({"i": i, "messages": c, "by": speed.decoder, "sampling": setting.tag}) + "\n")
                done[i] = c
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(idx))
    bar.close()
    _finish(speed, "regenerate", report)
    return Dataset.from_list([{"messages": done[i]} for i in range(len(ds))])


def synthesize_prompts(target, tokenizer, num_prompts: int, cache_path: str | Path, seed: int = 0,
                       max_new_tokens: int = 96, temperature: float = 1.0, batch_size: int = 16,
                       openers: list[str] | None = None, draft=None, report: dict | None = None) -> Dataset:
    """Magpie-style self-synthesis: feed the chat template's *user prefix* alone and let the target write
    the user's message. Resumable through ``cache_path`` (jsonl).

    ``openers`` (e.g. ``["Write", "Explain", "Pretend you are"]``) start the user's message, in turn: a small
    target left alone mostly asks for advice, an opener steers it to other kinds of request.

    ``draft`` / ``report``: as in ``regenerate``. Sampled with a draft, tree decoding's lossless sampling draws from
    the target's distribution, seeded like ``generate``, but other prompts than ``generate`` for the same seed."""
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
    speed = _speed(draft)
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
                                   raw_prefixes=[prefix + start for start in starts], draft=draft, speed=speed)
            for start, text in zip(starts, outs):
                text = (start + " " + text.split("<|im_end|>")[0]).strip()
                if 10 <= len(text) <= 2000 and len(prompts) < num_prompts:
                    prompts.append(text)
                    f.write(json.dumps({"prompt": text, "by": speed.decoder}) + "\n")
                    bar.update(1)
            f.flush()
    bar.close()
    _finish(speed, "synthesise prompts", report)
    return Dataset.from_list([{"messages": [{"role": "user", "content": p}]} for p in prompts[:num_prompts]])


def _finish(speed: GenerationSpeed, what: str, report: dict | None) -> None:
    if speed.samples:
        print(speed.line(what))
    if report is not None:
        report.update(speed.as_dict())


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
            loaded["draft"] = _fitting_draft(draft_path, target, quiet=regenerate_with == "auto" and regenerate_draft is None)
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


def _fitting_draft(path: str, target, quiet: bool):
    """The draft at ``path`` loaded for ``target`` (once per target); with ``quiet``, None and a warning where it
    does not fit the target."""
    draft = load_draft(path, target)
    try:
        draft.check_fits(target)
    except ValueError as e:
        if not quiet:
            raise ValueError(f"The regeneration draft {path} (data.regenerate_draft): {e}") from None
        print(f"[data] warn: the reference draft {path} does not fit this target ({e}): the target writes with plain "
              "generate")
        return None
    return draft


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


__all__ = ["PRESETS", "DataError", "normalise_example", "source_spec", "load_source", "dedupe", "regenerate", "synthesize_prompts", "prompt_key",
           "user_prefix", "render_with_mask", "tokenize_dataset", "build_conversations", "REGENERATE_WITH",
           "GENERATION_REPORT", "GenerationSpeed", "regeneration_draft", "AnswerSetting", "answer_settings",
           "assign_setting"]
