"""What a tree-decoding run returns: the sequences and its counters, and the clock that times its phases."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers.utils import ModelOutput


@dataclass
class TreeDecodingStats:
    """Counters of one ``generate`` call.

    accepted_per_step: one entry per (target verification, active row): tokens that row committed in that
        step (accepted draft tokens + the target's bonus token; fewer when a stop condition cut the block).
    mean_acceptance_length: new tokens per target forward (prefill included), over all rows.
    lookup_accepted: accepted draft tokens that came from the lookup branch (the rest: from the draft model).
    draft_time_s / verify_time_s: time in draft forwards (tree building included) / target verification
        forwards (prefill included); overhead_time_s: everything else (acceptance, cache compaction, host
        bookkeeping, streaming).
    """

    target_forwards: int = 0
    draft_forwards: int = 0
    steps: int = 0
    new_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    lookup_accepted: int = 0
    mean_acceptance_length: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    overhead_time_s: float = 0.0
    total_time_s: float = 0.0
    tree: dict[str, int] = field(default_factory=dict)  # the shape (adaptive: the largest the controller may choose)
    lean_forward: bool = False  # verifications ran through LeanTargetForward, not transformers' forward
    tree_steps: dict[str, int] = field(default_factory=dict)  # adaptive: steps per chosen shape ("d/k/n", "none")
    costs_measured_again: bool = False  # adaptive: the cached cost table disagreed with the run and was measured again

    def per_step_ms(self) -> dict[str, float]:
        """Average milliseconds per decoding step: draft / verify / overhead."""
        n = max(self.steps, 1)
        return {
            "draft": 1e3 * self.draft_time_s / n,
            "verify": 1e3 * self.verify_time_s / n,
            "overhead": 1e3 * self.overhead_time_s / n,
        }

    def __str__(self) -> str:
        ms = self.per_step_ms()
        tps = self.new_tokens / self.total_time_s if self.total_time_s > 0 else float("nan")
        return (
            f"{self.new_tokens} new tokens in {self.total_time_s:.2f} s ({tps:.1f} tok/s), {self.target_forwards} "
            f"target forwards, mean acceptance length {self.mean_acceptance_length:.2f}; per step: draft "
            f"{ms['draft']:.1f} ms, verify {ms['verify']:.1f} ms, overhead {ms['overhead']:.1f} ms; tree {self.tree}"
            + (f", steps by shape {self.tree_steps}" if self.tree_steps else "")
            + (", cost table measured again (the cached one was slower than this run)" if self.costs_measured_again else "")
        )


@dataclass
class TreeDecodingOutput(ModelOutput):
    """sequences: (b, prompt_len + new) prompt (as given, left padding included) + new tokens, right-padded
    with the pad id after a row stopped. stats: ``TreeDecodingStats``."""

    sequences: torch.LongTensor | None = None
    stats: TreeDecodingStats | None = None


class PhaseClock:
    """Adds the time of the draft / verify phases to ``stats``. On CUDA with events, read once at the end, so that
    timing costs no host sync per step; elsewhere with ``perf_counter``."""

    def __init__(self, stats: TreeDecodingStats, device: torch.device):
        self.stats = stats
        self.cuda = device.type == "cuda"
        self.events: list = []

    def now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, phase: str, start, stop):
        if self.cuda:
            self.events.append((phase, start, stop))
        else:
            setattr(self.stats, phase, getattr(self.stats, phase) + stop - start)

    def finish(self):
        if self.cuda:
            torch.cuda.synchronize()
            for phase, start, stop in self.events:
                setattr(self.stats, phase, getattr(self.stats, phase) + start.elapsed_time(stop) / 1e3)
            self.events.clear()
