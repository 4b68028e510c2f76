"""The race: plain decoding and EAGLE-3 tree decoding of one target side by side, each timed on its own compute.
Torch and transformers only: importable and testable without Gradio."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from dataclasses import dataclass

import torch

from .inputs import Settings

logger = logging.getLogger(__name__)


@dataclass
class LoadedPair:
    """A target and its draft, loaded and bound (``pairs.load_pair``): what a race runs on."""

    pair: object  # the pairs.ModelPair it was loaded from
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


PANE_TITLES = {"plain": "Plain decoding", "eagle": "EAGLE-3 tree decoding"}


class Stopped(Exception):
    """Raised inside the decoding thread when the race is cancelled."""


class PlainDecoder:
    """Plain decoding of the target, one token per ``step``: what ``target.generate`` does in its loop (one
    forward over the new token with the KV cache, then argmax, or a sample at ``temperature``), without its
    per-step bookkeeping, so the baseline is not slowed by anything but the forward itself."""

    def __init__(
        self, target, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool, temperature: float, eos_token_ids: list[int]
    ):
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
            return PaneView(
                self.kind,
                self.state,
                list(self._detok.pieces),
                self.new_tokens,
                self.drafted_tokens,
                self.steps,
                self.seconds,
                self.error,
            )


def _strip_after_eos(ids: list[int], eos_token_ids: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos_token_ids:
            return ids[: i + 1]
    return ids


def race(
    loaded: LoadedPair, plain_messages: list[dict], eagle_messages: list[dict], settings: Settings, refresh_seconds: float = 0.1
):
    """Run plain decoding and EAGLE-3 tree decoding side by side and measure each honestly.

    One decoding thread does both, so they never compete for the device (nor their thread pools for the CPU
    cores). Tree decoding drives; after each of its steps (``on_step``), plain decoding runs tokens until it
    has used as much compute time as tree decoding so far (fair share), then tree decoding continues. Each
    side's clock counts only its own work: its tokens/s is what it gets alone on this machine, and at any
    moment the two panes show what each method produced in the same compute time.

    Yields ``(plain: PaneView, eagle: PaneView)`` while they run (at most every ``refresh_seconds`` when
    something changed) and once more at the end. Closing the generator stops the decoding thread.
    """
    from ..generation.tree import attention_kernels, generate

    tok = loaded.tokenizer
    plain_ids = loaded.encode(plain_messages)  # (1, n)
    eagle_ids = loaded.encode(eagle_messages)  # (1, n')
    do_sample = settings.temperature > 0
    temperature = settings.temperature if do_sample else 1.0
    plain_pane, eagle_pane = Pane("plain", tok), Pane("eagle", tok)
    changed, stop = threading.Event(), threading.Event()
    eagle_result = {}

    def work():
        plain = PlainDecoder(loaded.target, plain_ids, settings.max_new_tokens, do_sample, temperature, loaded.eos_token_ids)
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
            eagle_result["out"] = generate(
                loaded.target,
                loaded.draft,
                eagle_ids,
                attention_mask=torch.ones_like(eagle_ids),
                max_new_tokens=settings.max_new_tokens,
                do_sample=do_sample,
                temperature=temperature,
                eos_token_id=loaded.eos_token_ids,
                tokenizer=tok,
                depth=settings.depth,
                tree_top_k=settings.tree_top_k,
                total_tokens=settings.total_tokens,
                on_step=on_step,
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
            final = _strip_after_eos(out.sequences[0, eagle_ids.shape[-1] :].tolist(), loaded.eos_token_ids)
            if final != eagle_pane.token_ids:
                logger.warning("streamed EAGLE-3 tokens differ from the returned sequence; showing the sequence")
                eagle_pane.replace_tokens(final)
        yield plain_pane.view(), eagle_pane.view()
    finally:
        stop.set()
        thread.join(timeout=60)
