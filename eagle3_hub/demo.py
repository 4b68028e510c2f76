"""Side-by-side speed demo: plain decoding of a target next to EAGLE-3 tree decoding of the same target.

One prompt, two panes that stream together. The left pane is plain decoding (one target forward per token,
as ``target.generate`` does), the right pane is ``eagle3_hub.generation.tree.generate`` with an EAGLE-3 draft. Same
target, same settings; at greedy decoding both texts end identical (the method is lossless). Tokens that the
draft proposed and the target accepted are highlighted in the right pane.

Honest timing: one thread runs both decoders, so they never compete for the device. Tree decoding drives;
after each of its steps, plain decoding runs tokens until it has used as much compute time (fair share). Each
pane's clock counts only its own work, so its tokens/s is what that method gets alone on this machine, and at
any moment the two panes show what each method wrote in the same compute time. The speed-up is the ratio.

The UI lives here, in ``build_app``; ``eagle3-hub demo`` (``eagle3_hub.commands.demo``) and the Hugging Face
Space (``spaces/app.py``, exported with ``eagle3-hub demo --export-space DIR``) both launch it. Model pairs (target + draft) come from a small YAML file
(``spaces/pairs.yaml``); without one the embedded SmolLM2-135M-Instruct and its reference draft are used.
"""

from __future__ import annotations

import html
import inspect
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .devices import resolve_device, resolve_dtype
from .targets import EMBEDDED_TARGET, reference_draft

logger = logging.getLogger(__name__)

EMBEDDED_PAIR = EMBEDDED_TARGET

EXAMPLE_PROMPTS = [
    ["Write a Python function that checks whether a string is a palindrome."],
    ["What is 17 multiplied by 23? Explain step by step."],
    [("Summarize in two sentences: The Eiffel Tower was built for the 1889 World's Fair in Paris. It was first "
      "criticised by artists, but it became the symbol of France and one of the most visited monuments.")],
    ["Write a short poem about the ocean at night."],
    ["List five fruits that are rich in vitamin C."],
    ["Translate to French: Good morning, how are you today?"],
    ["Explain what a black hole is to a ten-year-old."],
]


class DemoError(ValueError):
    """An error whose message is shown in the page as is (bad input, a model that cannot load, ...)."""


# ----------------------------------------------------------------------------------------- model pairs
@dataclass(frozen=True)
class ModelPair:
    """A target and an EAGLE-3 draft made for it.

    target: Hub repo id, local folder, ``.gguf`` path, or ``smollm2-135m-instruct`` (the embedded default).
    draft: Hub repo id, local folder, or ``reference`` (the draft shipped in ``eagle3_hub/reference_draft/<name>``).
    dtype: ``float32``, ``bfloat16`` or ``float16``; device: ``auto`` (CUDA when present), ``cpu``, ``cuda``, ...
    """

    name: str
    target: str = EMBEDDED_PAIR
    draft: str = "reference"
    label: str = ""
    dtype: str = "float32"
    device: str = "auto"

    @property
    def title(self) -> str:
        return self.label or f"{self.target} + {self.draft}"


DEFAULT_PAIRS = {
    EMBEDDED_PAIR: ModelPair(
        name=EMBEDDED_PAIR,
        target=EMBEDDED_PAIR,
        draft="reference",
        label="SmolLM2-135M-Instruct (embedded) + reference EAGLE-3 draft",
    )
}


def load_pairs(path: str | Path) -> tuple[dict[str, ModelPair], str]:
    """Read a pairs file: ``{default: NAME, pairs: {NAME: {target, draft, label, dtype, device}}}``.
    Returns (pairs by name, default name)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as e:
        raise DemoError(f"Model pairs file {path} not found.") from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DemoError(f"Model pairs file {path} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise DemoError(f"{path} is not a mapping: write `pairs: {{NAME: {{target, draft}}}}` (see spaces/pairs.yaml).")
    raw = data.get("pairs")
    if not isinstance(raw, dict) or not raw:
        raise DemoError(f"{path} has no `pairs:` mapping (name -> {{target, draft}}).")
    known = {"target", "draft", "label", "dtype", "device"}
    pairs = {}
    for name, spec in raw.items():
        spec = spec or {}
        unknown = set(spec) - known
        if unknown:
            raise DemoError(f"{path}: pair {name!r} has unknown keys {sorted(unknown)}; allowed: {sorted(known)}.")
        if "target" not in spec or "draft" not in spec:
            raise DemoError(f"{path}: pair {name!r} needs both `target` and `draft`.")
        pairs[str(name)] = ModelPair(name=str(name), **{k: str(v) for k, v in spec.items()})
    default = str(data.get("default") or next(iter(pairs)))
    if default not in pairs:
        raise DemoError(f"{path}: default pair {default!r} is not one of {sorted(pairs)}.")
    return pairs, default


def resolve_draft(pair: ModelPair) -> str:
    """Folder or repo id of a pair's draft; a clear error when the reference draft is not installed."""
    if pair.draft in ("reference", "") or pair.draft.startswith("reference:"):
        name = pair.draft.partition(":")[2] or pair.target
        folder = reference_draft(name)
        if not (folder / "config.json").exists():
            raise DemoError(
                f"The reference EAGLE-3 draft for {name} is not in this install (looked in {folder}). "
                "Train one with `eagle3-hub train` and start the demo with `--draft PATH`, "
                "or choose another model pair."
            )
        return str(folder)
    path = Path(pair.draft).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise DemoError(f"Draft folder {path} has no config.json: is it a saved EAGLE-3 draft?")
        return str(path)
    return pair.draft


@dataclass
class LoadedPair:
    pair: ModelPair
    target: torch.nn.Module
    tokenizer: object
    draft: torch.nn.Module
    device: torch.device
    eos_token_ids: list[int]

    @property
    def context_length(self) -> int:
        return int(getattr(self.target.config.get_text_config(), "max_position_embeddings", 2048) or 2048)

    def encode(self, messages: list[dict]) -> torch.Tensor:
        """Chat messages -> (1, n) input ids, through the tokenizer's chat template when it has one."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tok(text, add_special_tokens=False).input_ids
        else:  # a base model: the turns one after the other
            ids = tok("\n\n".join(m["content"] for m in messages)).input_ids
        return torch.tensor([ids], dtype=torch.long, device=self.device)


def load_pair(pair: ModelPair) -> LoadedPair:
    """Load target and draft, bind them, and run one short warm-up race (so that first-call costs do not
    count against either pane)."""
    from .modeling_eagle3 import Eagle3DraftModel
    from .generation.tree import check_draft_fits_target
    from .targets import load_target

    draft_path = resolve_draft(pair)
    try:
        device = resolve_device(pair.device)
        dtype = resolve_dtype(pair.dtype, device)
    except ValueError as e:
        raise DemoError(f"Pair {pair.name!r}: {e}") from None
    try:
        target, tokenizer = load_target(pair.target, dtype=dtype, device=device)
    except Exception as e:
        raise DemoError(f"Could not load the target {pair.target!r}: {e}") from e
    try:
        draft = Eagle3DraftModel.from_pretrained(draft_path, dtype=dtype).to(device).eval()
    except Exception as e:
        raise DemoError(f"Could not load the draft {draft_path!r}: {e}") from e
    try:
        check_draft_fits_target(draft, target)
    except ValueError as e:
        raise DemoError(f"Pair {pair.name!r}: {e}") from e
    draft.bind(target)  # shares the target's embedding when the draft was saved without one
    # bind() also hooks the target's layers for assisted generation; tree decoding reads hidden states itself,
    # and the hooks would tax (and grow captures on) every forward of the plain side
    draft.unbind(keep_target=True)
    draft.requires_grad_(False)
    eos = target.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    loaded = LoadedPair(pair, target, tokenizer, draft, device, eos)
    warm = Settings(max_new_tokens=4)
    hello = [{"role": "user", "content": "Hi"}]
    try:
        for plain, eagle in race(loaded, hello, hello, warm):
            pass
    except Exception as e:
        raise DemoError(f"Pair {pair.name!r} loaded but the warm-up generation failed: {type(e).__name__}: {e}") from e
    for view in (plain, eagle):
        if view.state == "error":
            raise DemoError(f"Pair {pair.name!r} loaded but {_TITLES[view.kind].lower()} failed: {view.error}")
    return loaded


class PairCache:
    """Loads model pairs on demand and keeps the last one loaded (one at a time: targets can be large)."""

    def __init__(self, pairs: dict[str, ModelPair], default: str):
        self.pairs = pairs
        self.default = default
        self._loaded: LoadedPair | None = None
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._turn = threading.Lock()

    def turn(self) -> threading.Lock:
        """Held for a whole request (``with cache.turn(): ...``): one race at a time on the shared models. A plain
        lock, not an RLock: a generator holding it may be resumed by another worker thread."""
        return self._turn

    def get(self, name: str) -> LoadedPair:
        if name not in self.pairs:
            raise DemoError(f"Unknown model pair {name!r}; choose one of {sorted(self.pairs)}.")
        with self._lock:
            if self._loaded is not None and self._loaded.pair.name == name:
                return self._loaded
            self._loaded = None  # free the previous pair before loading the next one
            try:
                self._loaded = load_pair(self.pairs[name])
            except DemoError as e:
                self._errors[name] = str(e)
                raise
            self._errors.pop(name, None)
            return self._loaded

    def status(self, name: str) -> tuple[str, str]:
        """(kind, message) with kind in ``ready``, ``error``, ``idle``."""
        pair = self.pairs.get(name)
        if pair is None:
            return "error", f"Unknown model pair {name!r}."
        if self._loaded is not None and self._loaded.pair.name == name:
            ld = self._loaded
            return "ready", f"Ready: {pair.title} ({pair.dtype} on {ld.device.type})."
        if name in self._errors:
            return "error", self._errors[name]
        return "idle", f"{pair.title}: loads on the first Generate."


def pair_cache(pairs_file: str | Path | None = None, pair: str | None = None, **overrides) -> PairCache:
    """The demo's pairs: ``pairs_file`` (YAML, see ``load_pairs``) or the embedded pair; ``pair`` is selected when
    the page opens, and ``overrides`` (``target``, ``draft``, ``dtype``, ``device``; ``None`` = keep) change it."""
    pairs, default = load_pairs(pairs_file) if pairs_file else (dict(DEFAULT_PAIRS), EMBEDDED_PAIR)
    default = pair or default
    if default not in pairs:
        raise DemoError(f"--pair {default!r} is not one of {sorted(pairs)}.")
    unknown = set(overrides) - {"target", "draft", "dtype", "device"}
    if unknown:
        raise TypeError(f"unknown pair settings {sorted(unknown)}")
    overrides = {k: v for k, v in overrides.items() if v}
    if overrides:
        changed = replace(pairs[default], **overrides)
        if "draft" in overrides or "target" in overrides:
            changed = replace(changed, label=f"{changed.target} + {changed.draft}")
        pairs[default] = changed
    return PairCache(pairs, default)


# ----------------------------------------------------------------------------------------- settings
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


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    depth: int = 5
    tree_top_k: int = 8
    total_tokens: int = 24


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


def check_context(loaded: LoadedPair, *input_ids: torch.Tensor, settings: Settings, limits: Limits = Limits()):
    """The prompt (with the conversation so far) plus the new tokens must fit the model and the demo."""
    budget = min(limits.max_context_tokens, loaded.context_length)
    longest = max(ids.shape[-1] for ids in input_ids)
    if longest + settings.max_new_tokens + settings.total_tokens > budget:
        raise DemoError(
            f"The conversation is {longest} tokens long; with {settings.max_new_tokens} new tokens it does not fit "
            f"the {budget}-token window of this demo. Clear the conversation or ask for fewer new tokens."
        )


# ----------------------------------------------------------------------------------------- plain decoding
class Stopped(Exception):
    """Raised inside the decoding thread when the race is cancelled."""


class PlainDecoder:
    """Plain decoding of the target, one token per ``step``: what ``target.generate`` does in its loop (one
    forward over the new token with the KV cache, then argmax, or a sample at ``temperature``), without its
    per-step bookkeeping, so the baseline is not slowed by anything but the forward itself."""

    def __init__(self, target, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool, temperature: float,
                 eos_token_ids: list[int]):
        from transformers.cache_utils import DynamicCache

        self.target = target
        self.cache = DynamicCache(config=target.config)
        self.cache_kwarg = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"
        self.next_ids = input_ids  # (1, n) prompt, then (1, 1) the latest token
        self.max_new_tokens = max_new_tokens
        self.do_sample = do_sample
        self.temperature = temperature
        self.eos_token_ids = set(eos_token_ids)
        self.new_tokens = 0
        self.done = max_new_tokens <= 0

    @torch.inference_mode()
    def step(self) -> int:
        out = self.target(input_ids=self.next_ids, use_cache=True, logits_to_keep=1, **{self.cache_kwarg: self.cache})
        logits = out.logits[:, -1].float()  # (1, V)
        if self.do_sample:
            token = torch.multinomial(torch.softmax(logits / self.temperature, dim=-1), 1)  # (1, 1)
        else:
            token = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
        self.next_ids = token
        tok = int(token)
        self.new_tokens += 1
        self.done = tok in self.eos_token_ids or self.new_tokens >= self.max_new_tokens
        return tok


# ----------------------------------------------------------------------------------------- panes
class Detokenizer:
    """Token ids -> text pieces, one per token, each flagged ``drafted`` or not. A token whose bytes end in
    the middle of a character is held back and joined to the next one (the piece is ``drafted`` only when all
    its tokens were)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.pieces: list[tuple[str, bool]] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens up to here are already in `pieces`
        self._held: list[bool] = []

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int, drafted: bool):
        self.ids.append(int(token_id))
        self._held.append(bool(drafted))
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.pieces.append((after[len(before) :], all(self._held)))
            self._prefix, self._read, self._held = self._read, len(self.ids), []

    def flush(self):
        """At the end: whatever is held back, even an incomplete character."""
        if self._held:
            before = self._decode(self.ids[self._prefix : self._read])
            after = self._decode(self.ids[self._prefix :])
            if len(after) > len(before):
                self.pieces.append((after[len(before) :], all(self._held)))
            self._prefix, self._read, self._held = self._read, len(self.ids), []

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)


@dataclass
class PaneView:
    """A frozen copy of a pane for rendering."""

    kind: str
    state: str  # waiting | running | done | stopped | error
    pieces: list[tuple[str, bool]]
    new_tokens: int
    drafted_tokens: int
    steps: int  # target forwards
    seconds: float  # compute time of this side only
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target forward (1.0 for plain decoding)."""
        return self.new_tokens / self.steps if self.steps else 0.0


class Pane:
    """One side of the race, written by the decoding thread and read by the UI thread."""

    def __init__(self, kind: str, tokenizer):
        self.kind = kind
        self._detok = Detokenizer(tokenizer)
        self._lock = threading.Lock()
        self.state = "waiting"
        self.new_tokens = 0
        self.drafted_tokens = 0
        self.steps = 0
        self.seconds = 0.0
        self.error: str | None = None

    def add_step(self, token_ids: list[int], num_from_draft: int, seconds: float):
        """One target forward's tokens (the first ``num_from_draft`` came from the draft) and its compute time."""
        with self._lock:
            self.state = "running"
            self.steps += 1
            self.seconds += seconds
            for i, t in enumerate(token_ids):
                self._detok.add(t, i < num_from_draft)
            self.new_tokens += len(token_ids)
            self.drafted_tokens += min(num_from_draft, len(token_ids))

    def add_seconds(self, seconds: float):
        with self._lock:
            self.seconds += seconds

    def set_state(self, state: str, error: str | None = None):
        with self._lock:
            if state != "running":
                self._detok.flush()
            self.state, self.error = state, error

    def replace_tokens(self, token_ids: list[int]):
        """Authoritative final tokens when the streamed ones disagree (highlighting is then dropped)."""
        with self._lock:
            detok = Detokenizer(self._detok.tokenizer)
            for t in token_ids:
                detok.add(t, False)
            detok.flush()
            self._detok, self.new_tokens, self.drafted_tokens = detok, len(token_ids), 0

    @property
    def token_ids(self) -> list[int]:
        return list(self._detok.ids)

    def view(self) -> PaneView:
        with self._lock:
            return PaneView(self.kind, self.state, list(self._detok.pieces), self.new_tokens, self.drafted_tokens,
                            self.steps, self.seconds, self.error)


def _strip_after_eos(ids: list[int], eos_token_ids: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos_token_ids:
            return ids[: i + 1]
    return ids


def race(loaded: LoadedPair, plain_messages: list[dict], eagle_messages: list[dict], settings: Settings,
         refresh_seconds: float = 0.1):
    """Run plain decoding and EAGLE-3 tree decoding side by side and measure each honestly.

    One decoding thread does both, so they never compete for the device (nor their thread pools for the CPU
    cores). Tree decoding drives; after each of its steps (``on_step``), plain decoding runs tokens until it
    has used as much compute time as tree decoding so far (fair share), then tree decoding continues. Each
    side's clock counts only its own work: its tokens/s is what it gets alone on this machine, and at any
    moment the two panes show what each method produced in the same compute time.

    Yields ``(plain: PaneView, eagle: PaneView)`` while they run (at most every ``refresh_seconds`` when
    something changed) and once more at the end. Closing the generator stops the decoding thread.
    """
    from .generation.tree import attention_kernels
    from .generation.tree import generate as tree_generate

    tok = loaded.tokenizer
    plain_ids = loaded.encode(plain_messages)  # (1, n)
    eagle_ids = loaded.encode(eagle_messages)  # (1, n')
    do_sample = settings.temperature > 0
    temperature = settings.temperature if do_sample else 1.0
    plain_pane, eagle_pane = Pane("plain", tok), Pane("eagle", tok)
    changed, stop = threading.Event(), threading.Event()
    eagle_result = {}

    def work():
        plain = PlainDecoder(loaded.target, plain_ids, settings.max_new_tokens, do_sample, temperature,
                             loaded.eos_token_ids)
        plain_ok = True

        def plain_until(budget: float | None):
            """Plain steps while its compute time is below ``budget`` (None: to the end)."""
            nonlocal plain_ok
            while plain_ok and not plain.done and (budget is None or plain_pane.seconds < budget):
                if stop.is_set():
                    raise Stopped()
                start = time.perf_counter()
                try:
                    token = plain.step()
                except Exception as e:  # shown in the pane; the other side keeps going
                    logger.exception("plain decoding failed")
                    plain_pane.set_state("error", f"{type(e).__name__}: {e}")
                    plain_ok = False
                    break
                plain_pane.add_step([token], 0, time.perf_counter() - start)
                changed.set()
            if plain_ok and plain.done and plain_pane.state != "done":
                plain_pane.set_state("done")
                changed.set()

        mark = time.perf_counter()

        def on_step(tokens, num_from_draft):
            nonlocal mark
            eagle_pane.add_step(list(tokens[0]), int(num_from_draft[0]), time.perf_counter() - mark)
            changed.set()
            if stop.is_set():
                raise Stopped()
            plain_until(eagle_pane.seconds)
            mark = time.perf_counter()

        try:
            eagle_pane.set_state("running")
            plain_pane.set_state("running")
            mark = time.perf_counter()
            eagle_result["out"] = tree_generate(
                loaded.target, loaded.draft, eagle_ids, attention_mask=torch.ones_like(eagle_ids),
                max_new_tokens=settings.max_new_tokens, do_sample=do_sample, temperature=temperature,
                eos_token_id=loaded.eos_token_ids, tokenizer=tok, depth=settings.depth,
                tree_top_k=settings.tree_top_k, total_tokens=settings.total_tokens, on_step=on_step,
            )
            eagle_pane.add_seconds(time.perf_counter() - mark)
            eagle_pane.set_state("done")
        except Stopped:
            for pane in (plain_pane, eagle_pane):
                if pane.state == "running":
                    pane.set_state("stopped")
            return
        except Exception as e:  # shown in the pane; plain decoding still finishes
            logger.exception("EAGLE-3 decoding failed")
            eagle_pane.set_state("error", f"{type(e).__name__}: {e}")
        changed.set()
        try:
            plain_until(None)
        except Stopped:
            plain_pane.set_state("stopped")

    def guarded_work():
        try:
            with attention_kernels(loaded.device):  # both panes on the same attention kernels
                work()
        finally:
            changed.set()

    thread = threading.Thread(target=guarded_work, name="eagle3-demo-race", daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            if changed.wait(refresh_seconds):
                changed.clear()
                yield plain_pane.view(), eagle_pane.view()
        thread.join()
        out = eagle_result.get("out")
        if out is not None and eagle_pane.state == "done":
            final = _strip_after_eos(out.sequences[0, eagle_ids.shape[-1]:].tolist(), loaded.eos_token_ids)
            if final != eagle_pane.token_ids:
                logger.warning("streamed EAGLE-3 tokens differ from the returned sequence; showing the sequence")
                eagle_pane.replace_tokens(final)
        yield plain_pane.view(), eagle_pane.view()
    finally:
        stop.set()
        thread.join(timeout=60)


# ----------------------------------------------------------------------------------------- rendering
CSS = """
.e3-pane { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 10px 12px; min-height: 220px; }
.e3-head { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: baseline; margin-bottom: 8px; }
.e3-title { font-weight: 700; font-size: 1.05em; }
.e3-tps { font-weight: 700; font-size: 1.3em; font-variant-numeric: tabular-nums; }
.e3-meta { opacity: 0.75; font-size: 0.9em; font-variant-numeric: tabular-nums; }
.e3-user { white-space: pre-wrap; background: var(--background-fill-secondary); border-radius: 8px; padding: 6px 8px; margin: 8px 0 4px 20%; }
.e3-reply { white-space: pre-wrap; line-height: 1.55; padding: 2px 0; }
.e3-drafted { background: #b7f0c4; color: #0b3d17; border-radius: 3px; padding: 0 1px; }
.dark .e3-drafted { background: #1f6b35; color: #eafff0; }
.e3-cursor::after { content: "▍"; opacity: 0.6; }
.e3-error { color: #b00020; white-space: pre-wrap; }
.e3-stats { display: flex; flex-wrap: wrap; gap: 10px; }
.e3-stat { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 14px; min-width: 120px; }
.e3-stat b { display: block; font-size: 1.5em; font-variant-numeric: tabular-nums; }
.e3-note { opacity: 0.8; font-size: 0.9em; }
.e3-status-error { color: #b00020; font-weight: 600; white-space: pre-wrap; }
.e3-legend { font-size: 0.85em; opacity: 0.85; }
"""

_TITLES = {"plain": "Plain decoding", "eagle": "EAGLE-3 tree decoding"}
_SUBTITLES = {"plain": "target only, one forward per token", "eagle": "same target + EAGLE-3 draft"}


def _pieces_html(pieces: list[tuple[str, bool]]) -> str:
    out = []
    for text, drafted in pieces:
        text = html.escape(text)
        out.append(f'<mark class="e3-drafted">{text}</mark>' if drafted else text)
    return "".join(out)


def render_pane(kind: str, view: PaneView | None, history: list[dict] = (), user: str | None = None) -> str:
    """HTML of one pane: header with live numbers, past turns (chat mode), the current reply."""
    state = view.state if view is not None else "idle"
    head = [f'<span class="e3-title">{_TITLES[kind]}</span>', f'<span class="e3-meta">{_SUBTITLES[kind]}</span>']
    if view is not None:
        head.append(f'<span class="e3-tps" data-tps="{view.tokens_per_second:.3f}">{view.tokens_per_second:.1f} tok/s</span>')
        meta = f"{view.new_tokens} tokens · {view.seconds:.2f} s"
        if kind == "eagle":
            meta += (f' · mean acceptance <span class="e3-accept" data-accept="{view.mean_acceptance_length:.3f}">'
                     f"{view.mean_acceptance_length:.2f}</span> tokens/step · "
                     f'<span class="e3-drafted-count" data-drafted="{view.drafted_tokens}">{view.drafted_tokens}</span> from the draft')
        head.append(f'<span class="e3-meta">{meta}</span>')
    body = []
    for turn in history:
        body.append(f'<div class="e3-user">{html.escape(turn["user"])}</div>')
        body.append(f'<div class="e3-reply">{_pieces_html(turn[kind])}</div>')
    if user is not None:
        body.append(f'<div class="e3-user">{html.escape(user)}</div>')
    if view is not None:
        cursor = " e3-cursor" if view.state in ("waiting", "running") else ""
        body.append(f'<div class="e3-reply e3-current{cursor}">{_pieces_html(view.pieces)}</div>')
        if view.state == "error":
            body.append(f'<div class="e3-error">Decoding failed: {html.escape(view.error or "")}</div>')
        elif view.state == "stopped":
            body.append('<div class="e3-meta">stopped</div>')
    if kind == "eagle":
        body.append('<div class="e3-legend"><mark class="e3-drafted">highlighted</mark> = proposed by the draft and '
                    "accepted by the target; the rest come from the target's own verification step.</div>")
    return (f'<div class="e3-pane" data-kind="{kind}" data-state="{state}">'
            f'<div class="e3-head">{"".join(head)}</div>{"".join(body)}</div>')


def render_stats(plain: PaneView | None, eagle: PaneView | None, greedy: bool = True, message: str | None = None,
                 error: bool = False) -> str:
    """The summary row: speed-up, both speeds, mean acceptance length, the lossless check."""
    if message is not None:
        cls = "e3-status-error" if error else "e3-note"
        role = ' role="alert"' if error else ""
        return f'<div class="e3-stats" data-state="{"error" if error else "info"}"><div class="{cls}"{role}>{html.escape(message)}</div></div>'
    if plain is None or eagle is None:
        return '<div class="e3-stats" data-state="idle"><div class="e3-note">Type a prompt and press Generate.</div></div>'
    failed = [v for v in (plain, eagle) if v.state == "error"]
    if failed:
        return render_stats(None, None, message="; ".join(f"{_TITLES[v.kind]} failed: {v.error}" for v in failed), error=True)
    done = plain.state == "done" and eagle.state == "done"
    speedup = eagle.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second > 0 else 0.0
    cells = [
        f'<div class="e3-stat">Speed-up<b class="e3-speedup" data-speedup="{speedup:.3f}">×{speedup:.2f}</b></div>',
        f'<div class="e3-stat">Plain<b>{plain.tokens_per_second:.1f} tok/s</b></div>',
        f'<div class="e3-stat">EAGLE-3<b>{eagle.tokens_per_second:.1f} tok/s</b></div>',
        f'<div class="e3-stat">Mean acceptance length<b>{eagle.mean_acceptance_length:.2f}</b></div>',
    ]
    identical = done and plain.text == eagle.text
    if done and greedy:
        check = "identical ✓" if identical else "differ (see note)"
        cells.append(f'<div class="e3-stat">Greedy outputs<b class="e3-lossless" data-identical="{int(identical)}">{check}</b></div>')
    note = ""
    if done and greedy and not identical:
        note = ('<div class="e3-note">At greedy the two texts should match. In bfloat16/float16 a multi-token '
                "verification can round differently from one-token steps on near-ties; in float32 a difference is a bug.</div>")
    elif done and not greedy:
        note = '<div class="e3-note">Sampling (temperature &gt; 0): both follow the same distribution, the texts differ.</div>'
    state = "done" if done else "running"
    return f'<div class="e3-stats" data-state="{state}">{"".join(cells)}</div>{note}'


# ----------------------------------------------------------------------------------------- one request
def serve_request(cache: PairCache, pair_name, prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens,
                  chat_mode, history, limits: Limits = Limits(), keep=lambda: None):
    """One Generate press: yields ``(plain_html, eagle_html, stats_html, history, prompt_box)`` pages while the race
    runs. ``keep()`` is the value that leaves an output as it is (``gr.update`` in the app).

    Requests run one at a time (``cache.turn``): the models are shared, and a race measures each method on a machine
    that nothing else is using. A second user's request waits for the first; bad input is answered at once."""
    history = list(history or []) if chat_mode else []
    try:
        prompt, settings = validate_request(prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens, limits)
    except DemoError as e:
        yield (render_pane("plain", None, history), render_pane("eagle", None, history),
               render_stats(None, None, message=str(e), error=True), history, keep())
        return
    with cache.turn():
        yield from _serve(cache, pair_name, prompt, settings, chat_mode, history, limits, keep)


def _serve(cache, pair_name, prompt, settings, chat_mode, history, limits, keep):
    try:
        loaded = cache.get(pair_name)
        plain_messages, eagle_messages = [], []
        for turn in history:  # each pane continues its own conversation
            plain_messages += [{"role": "user", "content": turn["user"]},
                               {"role": "assistant", "content": "".join(p for p, _ in turn["plain"])}]
            eagle_messages += [{"role": "user", "content": turn["user"]},
                               {"role": "assistant", "content": "".join(p for p, _ in turn["eagle"])}]
        plain_messages.append({"role": "user", "content": prompt})
        eagle_messages.append({"role": "user", "content": prompt})
        check_context(loaded, loaded.encode(plain_messages), loaded.encode(eagle_messages), settings=settings, limits=limits)
    except Exception as e:  # a pair that cannot load, a conversation too long, ...: a message in the page
        message = str(e) if isinstance(e, DemoError) else f"Could not start: {type(e).__name__}: {e}"
        if not isinstance(e, DemoError):
            logger.exception("demo request failed")
        yield (render_pane("plain", None, history), render_pane("eagle", None, history),
               render_stats(None, None, message=message, error=True), history, keep())
        return
    greedy = settings.temperature == 0
    plain = eagle = None
    prompt_box = "" if chat_mode else keep()  # chat: empty the box once, for the next message
    try:
        for plain, eagle in race(loaded, plain_messages, eagle_messages, settings):
            page = (render_pane("plain", plain, history, prompt), render_pane("eagle", eagle, history, prompt),
                    render_stats(plain, eagle, greedy))
            yield (*page, history, prompt_box)
            prompt_box = keep()
    except Exception as e:  # never a stack trace in the page
        logger.exception("demo generation failed")
        yield (render_pane("plain", plain, history, prompt), render_pane("eagle", eagle, history, prompt),
               render_stats(None, None, message=f"Generation failed: {type(e).__name__}: {e}", error=True),
               history, keep())
        return
    if chat_mode and plain is not None and plain.state == eagle.state == "done":
        history = history + [{"user": prompt, "plain": plain.pieces, "eagle": eagle.pieces}]
        yield (*page, history, keep())  # the same page; the turn joins the conversation


# ----------------------------------------------------------------------------------------- the app
INTRO = """
# EAGLE-3: plain decoding vs. speculative tree decoding
One prompt, two decoders of the **same target model** with the same settings. Left: plain decoding, one target
forward per token. Right: **EAGLE-3** — a small draft proposes a tree of tokens, the target checks the whole tree in
one forward and keeps the longest match (lossless: at greedy both texts end identical).
**Timing:** both panes stream at once, but the two decoders never run at the same moment: they share this
machine in turns, each getting the same compute time. Each pane's clock counts only its own work, so its tokens/s
is what that method gets alone here, and the two texts grow at the methods' true relative speeds.
"""


def build_app(cache: PairCache, limits: Limits = Limits(), queue_size: int = 16):
    """The Gradio Blocks app. One generation runs at a time (the models are shared); others wait in the queue."""
    import gradio as gr

    def pair_status(name):
        kind, message = cache.status(name)
        return render_stats(None, None, message=message, error=kind == "error")

    def generate(pair_name, prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens, chat_mode, history):
        yield from serve_request(cache, pair_name, prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens,
                                 chat_mode, history, limits=limits, keep=gr.update)

    def clear():
        return render_pane("plain", None), render_pane("eagle", None), render_stats(None, None), []

    from .generation.tree import tree_defaults

    default_pair = cache.pairs[cache.default]
    try:
        device = resolve_device(default_pair.device)
        tree = tree_defaults(device, resolve_dtype(default_pair.dtype, device))
    except ValueError:  # the page shows the pair's error on its first request
        tree = tree_defaults(torch.device("cpu"), torch.float32)
    with gr.Blocks(title="EAGLE-3 side-by-side speed demo", analytics_enabled=False) as app:
        gr.Markdown(INTRO)
        history = gr.State([])
        with gr.Row():
            pair = gr.Dropdown(
                choices=[(p.title, name) for name, p in cache.pairs.items()], value=cache.default,
                label="Model pair (target + draft)", scale=3,
            )
            chat_mode = gr.Checkbox(value=False, label="Chat mode (keep the conversation)", scale=1)
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", placeholder="Ask something…", lines=3, max_lines=12, scale=5,
                                elem_id="prompt", max_length=limits.max_prompt_chars)
            with gr.Column(scale=1, min_width=160):
                run_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                stop_btn = gr.Button("Stop", elem_id="stop")
                clear_btn = gr.Button("Clear conversation", elem_id="clear")
        gr.Examples(examples=EXAMPLE_PROMPTS, inputs=[prompt], label="Example prompts (code, math, summary, poem, list, translation, explanation)")
        with gr.Accordion("Settings", open=False, elem_id="settings"):
            with gr.Row():
                max_new = gr.Slider(1, limits.max_new_tokens, value=min(96, limits.max_new_tokens), step=1, label="Max new tokens", elem_id="max-new-tokens")
                temperature = gr.Slider(0.0, limits.max_temperature, value=0.0, step=0.05, label="Temperature (0 = greedy)", elem_id="temperature")
            with gr.Row():
                depth = gr.Slider(1, limits.max_depth, value=min(tree["depth"], limits.max_depth), step=1, label="Tree depth (draft steps)", elem_id="depth")
                tree_top_k = gr.Slider(1, limits.max_tree_top_k, value=min(tree["top_k"], limits.max_tree_top_k), step=1, label="Tree top-k (branches per node)", elem_id="tree-top-k")
                total_tokens = gr.Slider(1, limits.max_total_tokens, value=min(tree["total_tokens"], limits.max_total_tokens), step=1, label="Tree total tokens (verified per step)", elem_id="total-tokens")
        stats = gr.HTML(render_stats(None, None), elem_id="stats")
        with gr.Row(equal_height=False):
            plain_pane = gr.HTML(render_pane("plain", None), elem_id="plain-pane")
            eagle_pane = gr.HTML(render_pane("eagle", None), elem_id="eagle-pane")

        outputs = [plain_pane, eagle_pane, stats, history, prompt]
        event = gr.on(
            triggers=[run_btn.click, prompt.submit], fn=generate,
            inputs=[pair, prompt, max_new, temperature, depth, tree_top_k, total_tokens, chat_mode, history],
            outputs=outputs, concurrency_limit=1, concurrency_id="decode", show_progress="minimal",
            show_progress_on=[stats], api_name="generate",
        )
        stop_btn.click(lambda: render_stats(None, None, message="Stopped. Press Generate to run again."), outputs=[stats],
                       cancels=[event], queue=False, api_name=False)
        clear_btn.click(clear, outputs=[plain_pane, eagle_pane, stats, history], api_name=False)
        chat_mode.change(clear, outputs=[plain_pane, eagle_pane, stats, history], api_name=False)
        pair.change(lambda name: (*clear()[:2], pair_status(name), []), inputs=[pair],
                    outputs=[plain_pane, eagle_pane, stats, history], api_name=False)
        app.load(pair_status, inputs=[pair], outputs=[stats], api_name=False, show_progress="hidden")
    app.queue(max_size=queue_size, default_concurrency_limit=1)
    return app
