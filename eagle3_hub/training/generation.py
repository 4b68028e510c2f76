"""Text the target writes for its draft's training data: answers to the prompts (``regenerate``, at the settings of
``data.answer_sampling``) and self-synthesised prompts (``synthesize_prompts``, Magpie style), each resumable from a
jsonl cache, with the decoder that writes them and its speed.

The target writes with plain ``target.generate`` or, given an EAGLE-3 draft for it, with lossless tree decoding
(``data.regenerate_with``): greedy tree decoding writes plain greedy's tokens (float32; bfloat16 may part at
near-ties, as any change of kernels or batch may), in fewer target forwards. ``SAME_FORWARD``: plain decoding
through tree decoding's verifier, one token per step (``same_forward_generate``): greedy, it writes plain greedy's
tokens, with the lean forward and packed head.
"""

from __future__ import annotations

import hashlib
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
    from datasets import Dataset
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from ..benchmark.options import SAME_FORWARD
from ..generation.tree import generate, load_draft
from ..generation.tree.same_forward import same_forward_generate
from ..targets import reference_draft
from .recipe_schema import validate_key
from .sources import DataError, prompt_key
from .tokenise import user_prefix


def regeneration_draft(
    regenerate_with: str = "auto", regenerate_draft: str | None = None, target_name: str | None = None
) -> str | None:
    """The draft that decodes the target's answers and prompts (``data.regenerate_with``, ``data.regenerate_draft``),
    or None for plain ``target.generate``. Reads no model: a recipe check may call it before anything is loaded.

    ``generate`` and ``same_forward``: None. ``tree``: ``regenerate_draft``, else the reference draft shipped for ``target_name`` (the
    recipe's ``target.name``; None is the embedded target), else a ValueError. ``auto``: the same, None where
    neither exists."""
    validate_key("data.regenerate_with", regenerate_with)
    if regenerate_with in ("generate", SAME_FORWARD):
        return None
    if regenerate_draft is not None:
        if not isinstance(regenerate_draft, (str, Path)) or not str(regenerate_draft).strip():
            raise ValueError(f"data.regenerate_draft must be a draft folder or Hub id, got {regenerate_draft!r}")
        path = Path(regenerate_draft)
        if path.exists() and not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"data.regenerate_draft {path}: no config.json there; give an EAGLE-3 draft folder "
                "(e.g. an `eagle3-hub train` output) or a Hub id."
            )
        if not path.exists() and not re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", str(regenerate_draft)):
            raise FileNotFoundError(
                f"data.regenerate_draft {regenerate_draft} does not exist: give an EAGLE-3 draft folder or a Hub id (owner/name)."
            )
        return str(regenerate_draft)
    folder = reference_draft(target_name)
    if (folder / "config.json").is_file():
        return str(folder)
    if regenerate_with == "tree":
        raise ValueError(
            f"data.regenerate_with: tree needs an EAGLE-3 draft for {target_name or 'the embedded target'} "
            f"and none is shipped for it ({folder} has no config.json): set data.regenerate_draft to a "
            "draft folder or Hub id, or use data.regenerate_with: generate."
        )
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
        out = {
            "decoder": self.decoder,
            "draft": self.draft,
            "samples": self.samples,
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "tokens_per_s": round(self.new_tokens / self.wall_s, 2) if self.wall_s else None,
            "tokens_per_cpu_minute": round(60 * self.new_tokens / self.cpu_s, 1) if self.cpu_s else None,
        }
        if self.decoder == "tree":  # tokens a row commits per target forward: the draft's acceptance on this data
            out["acceptance_length"] = round(self.row_step_tokens / self.row_steps, 3) if self.row_steps else None
        return out

    def line(self, what: str) -> str:
        d = self.as_dict()
        by = {
            "tree": "tree decoding" + (f" (draft {self.draft})" if self.draft else ""),
            SAME_FORWARD: "plain decoding through the tree verifier",
        }.get(self.decoder, "plain generate")
        accepted = f", acceptance length {d['acceptance_length']}" if d.get("acceptance_length") else ""
        return (
            f"[data] {what}: {by}, {d['new_tokens']} new tokens for {d['samples']} samples in {d['wall_s']} s, "
            f"{d['target_forwards']} target forwards ({d['tokens_per_s']} tokens/s, {d['tokens_per_cpu_minute']} "
            f"tokens per CPU-minute{accepted})"
        )


def decoder_speed(draft) -> GenerationSpeed:
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
def generate_batch(
    target,
    tokenizer,
    conversations: list[list[dict]],
    max_new_tokens: int,
    temperature: float,
    add_generation_prompt: bool = True,
    raw_prefixes: list[str] | None = None,
    draft=None,
    speed: GenerationSpeed | None = None,
    top_p: float = 0.95,
    seed: int | None = None,
) -> list[str]:
    """The target's continuations of a batch (left-padded): plain ``generate``, tree decoding with ``draft``, or
    plain decoding through tree decoding's verifier (``draft=SAME_FORWARD``). ``seed``: the draws of a sampled
    batch (torch's global generator otherwise)."""
    if raw_prefixes is not None:
        texts = raw_prefixes
    else:
        texts = [
            tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=False) for c in conversations
        ]
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
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=sample,
                temperature=temperature or None,
                top_p=top_p if sample else None,
                pad_token_id=tokenizer.pad_token_id,
            )
        stats, forwards = None, out.shape[1] - enc.input_ids.shape[1]
    elif draft == SAME_FORWARD:
        out, sf = same_forward_generate(
            target,
            enc.input_ids,
            max_new_tokens,
            attention_mask=enc.attention_mask,
            do_sample=sample,
            temperature=temperature if sample else 1.0,
            top_p=top_p if sample else 1.0,
            eos_token_id=sorted(_eos_ids(target, tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            generator=generator,
        )
        stats, forwards = None, sf.target_forwards
    else:  # sampling draws from the same distribution as generate (with other draws for the same seed)
        # a fixed tree: the run-time controller picks shapes from measured times, and a sampled batch's draws
        # depend on the shapes, so a seed would not write the same text again (nor a resumed run the same data)
        res = generate(
            target,
            draft,
            enc.input_ids,
            attention_mask=enc.attention_mask,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature if sample else 1.0,
            top_p=top_p if sample else 1.0,
            adaptive=False,
        )
        out, stats = res.sequences, res.stats
        forwards = stats.target_forwards
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # a row ends at its first stop token: the two decoders pad finished rows differently
    eos, rows = _eos_ids(target, tokenizer), []
    for row in out[:, enc.input_ids.shape[1] :].tolist():
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
    """``data.answer_sampling`` (a list of ``{temperature, top_p, share}``) -> settings; one line names a bad entry
    (the recipe schema's rule)."""
    if spec is None:
        return []
    try:
        validate_key("data.answer_sampling", spec)
    except ValueError as e:
        raise DataError(str(e)) from None
    out = []
    for entry in spec:
        t, top_p, share = entry.get("temperature", 0.0), entry.get("top_p", 1.0), entry.get("share", 1.0)
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


def read_cache(path: Path, keys: tuple[str, ...]) -> list[dict]:
    """The records of a jsonl cache that hold ``keys``. A last line cut by a kill (no newline at its end) is cut off
    the file, said in a line, so the next record appended starts a line of its own; its sample is written again."""
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1
    if whole < len(data):
        print(f"[data] {path}: its last line was cut (a run killed while writing it): removed; that sample is written again.")
        with open(path, "r+b") as f:
            f.truncate(whole)
    records = []
    for n, line in enumerate(data[:whole].decode("utf-8", errors="replace").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and all(k in rec for k in keys):
            records.append(rec)
        elif line.strip():
            print(f"[data] {path}: line {n} is not a record of this cache: skipped; that sample is written again.")
    return records


def regenerate(
    ds: Dataset,
    target,
    tokenizer,
    cache_path: str | Path,
    max_new_tokens: int = 384,
    temperature: float = 0.0,
    batch_size: int = 16,
    max_turns: int = 1,
    draft=None,
    report: dict | None = None,
    settings: list[AnswerSetting] | None = None,
    seed: int = 0,
) -> Dataset:
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
    done: dict[int, list] = {rec["i"]: rec["messages"] for rec in read_cache(cache_path, ("i", "messages"))}
    settings = list(settings or [AnswerSetting(temperature, 0.95 if temperature > 0 else 1.0)])
    which = {
        i: assign_setting(settings, prompt_key(ds[i]["messages"]), seed) if len(settings) > 1 else 0
        for i in range(len(ds))
        if i not in done
    }
    todo = sorted(which)
    speed = decoder_speed(draft)
    bar = tqdm(total=len(ds), initial=len(ds) - len(todo), desc="regenerate responses", unit="sample")
    batches = []  # one setting per batch; a resumed run cuts the rest of each setting's prompts as before
    for k in sorted(set(which.values())):
        ids = [i for i in todo if which[i] == k]
        batches += [ids[a : a + batch_size] for a in range(0, len(ids), batch_size)]
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
                answers = generate_batch(
                    target,
                    tokenizer,
                    [convs[j] for j in active],
                    max_new_tokens,
                    setting.temperature,
                    draft=draft,
                    speed=speed,
                    top_p=setting.top_p,
                    seed=_batch_seed(seed, k, idx[0]) + turn if setting.temperature > 0 else None,
                )
                for j, a in zip(active, answers):
                    convs[j].append({"role": "assistant", "content": a})
            for i, c in zip(idx, convs):
                f.write(json.dumps({"i": i, "messages": c, "by": speed.decoder, "sampling": setting.tag}) + "\n")
                done[i] = c
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(idx))
    bar.close()
    report_speed(speed, "regenerate", report)
    return Dataset.from_list([{"messages": done[i]} for i in range(len(ds))])


def synthesize_prompts(
    target,
    tokenizer,
    num_prompts: int,
    cache_path: str | Path,
    seed: int = 0,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    batch_size: int = 16,
    openers: list[str] | None = None,
    draft=None,
    report: dict | None = None,
) -> Dataset:
    """Magpie-style self-synthesis: feed the chat template's *user prefix* alone and let the target write
    the user's message. Resumable through ``cache_path`` (jsonl).

    ``openers`` (e.g. ``["Write", "Explain", "Pretend you are"]``) start the user's message, in turn: a small
    target left alone mostly asks for advice, an opener steers it to other kinds of request.

    ``draft`` / ``report``: as in ``regenerate``. Sampled with a draft, tree decoding's lossless sampling draws from
    the target's distribution, seeded like ``generate``, but other prompts than ``generate`` for the same seed."""
    prefix = user_prefix(tokenizer)
    cache_path = Path(cache_path)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    prompts = [rec["prompt"] for rec in read_cache(cache_path, ("prompt",))]
    speed = decoder_speed(draft)
    bar = tqdm(total=num_prompts, initial=min(len(prompts), num_prompts), desc="synthesise prompts", unit="prompt")
    torch.manual_seed(seed + len(prompts))
    attempts, max_attempts = 0, 10 * num_prompts + batch_size
    with open(cache_path, "a") as f:
        while len(prompts) < num_prompts:
            if attempts >= max_attempts:
                raise DataError(
                    f"The target wrote {len(prompts)} usable prompts in {attempts} tries (10..2000 characters "
                    f"wanted): it cannot self-synthesise; give `data.sources` instead."
                )
            starts = [openers[(len(prompts) + j) % len(openers)].strip() if openers else "" for j in range(batch_size)]
            attempts += batch_size
            outs = generate_batch(
                target,
                tokenizer,
                [None] * batch_size,
                max_new_tokens,
                temperature,
                raw_prefixes=[prefix + start for start in starts],
                draft=draft,
                speed=speed,
            )
            for start, text in zip(starts, outs):
                text = (start + " " + text.split("<|im_end|>")[0]).strip()
                if 10 <= len(text) <= 2000 and len(prompts) < num_prompts:
                    prompts.append(text)
                    f.write(json.dumps({"prompt": text, "by": speed.decoder}) + "\n")
                    bar.update(1)
            f.flush()
    bar.close()
    report_speed(speed, "synthesise prompts", report)
    return Dataset.from_list([{"messages": [{"role": "user", "content": p}]} for p in prompts[:num_prompts]])


def report_speed(speed: GenerationSpeed, what: str, report: dict | None) -> None:
    if speed.samples:
        print(speed.line(what))
    if report is not None:
        report.update(speed.as_dict())


def fitting_draft(path: str, target, quiet: bool):
    """The draft at ``path`` loaded for ``target`` (once per target); with ``quiet``, None and a warning where it
    does not fit the target."""
    draft = load_draft(path, target)
    try:
        draft.check_fits(target)
    except ValueError as e:
        if not quiet:
            raise ValueError(f"The regeneration draft {path} (data.regenerate_draft): {e}") from None
        print(f"[data] warn: the reference draft {path} does not fit this target ({e}): the target writes with plain generate")
        return None
    return draft
