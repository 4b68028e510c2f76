"""What the bench measures each run with: forward hooks that time groups of modules (``ForwardTimer``), record where
each target forward starts (``ForwardStarts``: the tokens each step committed), and the peak memory (``PeakMemory``)."""

from __future__ import annotations

import re
import sys
import time

import torch


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ForwardTimer:
    """Wall time spent inside a group of modules. Nested calls (a model calling its own decoder) count once."""

    def __init__(self, modules, device: torch.device):
        self.device = device
        self.total = 0.0
        self.calls = 0
        self._depth = 0
        self._t0 = 0.0
        self._handles = []
        for m in modules:
            if m is not None:
                self._handles.append(m.register_forward_pre_hook(self._pre))
                self._handles.append(m.register_forward_hook(self._post))

    def _pre(self, module, args):
        if self._depth == 0:
            sync(self.device)
            self._t0 = time.perf_counter()
        self._depth += 1

    def _post(self, module, args, output):
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            sync(self.device)
            self.total += time.perf_counter() - self._t0
            self.calls += 1

    def reset(self):
        self.total, self.calls, self._depth = 0.0, 0, 0

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []


class ForwardStarts:
    """Position of the first token of every target forward (a pre-hook on the target's decoder).

    For ``generate`` with or without an assistant, forward ``i`` starts at the last committed token, so
    consecutive starts give the tokens each step committed (accepted draft tokens + 1)."""

    def __init__(self, decoder):
        self.starts: list[int] = []
        self._handle = decoder.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        pos = kwargs.get("position_ids")
        if pos is not None:
            self.starts.append(int(pos.reshape(-1)[0]))
            return
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self.starts.append(int(cache.get_seq_length()) if cache is not None else 0)

    def accepted_per_step(self, prompt_len: int, final_len: int) -> list[int] | None:
        """Accepted draft tokens per target forward; ``None`` when the starts do not describe linear decoding."""
        if not self.starts:
            return None
        # committed[i]: sequence length before forward i (its first input is the last committed token)
        committed = [prompt_len] + [s + 1 for s in self.starts[1:]] + [final_len]
        accepted = [committed[i + 1] - committed[i] - 1 for i in range(len(self.starts))]
        if any(a < 0 for a in accepted[:-1]):
            return None  # not linear decoding (e.g. extra target forwards): no per-step figures
        return [max(a, 0) for a in accepted]  # the last step may be cut short by an end token

    def reset(self):
        self.starts = []

    def close(self):
        self._handle.remove()


class PeakMemory:
    """Peak memory of one run, cheaply: CUDA's allocator peak, or the process's resident-set high-water mark
    (reset through /proc/self/clear_refs on Linux; otherwise ``getrusage``'s lifetime peak)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kind = "cuda_max_allocated" if device.type == "cuda" else "rss_high_water_mark"
        self._can_reset = device.type == "cuda"
        if device.type != "cuda":
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self._can_reset = self._read_status_kb() is not None
            except OSError:
                self._can_reset = False
            if not self._can_reset:
                self.kind = "process_max_rss"

    @staticmethod
    def _read_status_kb(field: str = "VmHWM") -> int | None:
        try:
            with open("/proc/self/status") as f:
                m = re.search(field + r":\s+(\d+)\s+kB", f.read())
            return int(m.group(1)) if m else None
        except OSError:
            return None

    def reset(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._can_reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            hwm, rss = self._read_status_kb(), self._read_status_kb("VmRSS")
            if hwm is None or rss is None or hwm > rss + 4096:  # the kernel ignored the reset (e.g. gVisor)
                self._can_reset, self.kind = False, "process_max_rss"

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self._can_reset:
            return (self._read_status_kb() or 0) / 1024
        try:
            import resource  # Unix only
        except ImportError:
            return float("nan")
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
        return kb / (2**20 if sys.platform == "darwin" else 1024)
