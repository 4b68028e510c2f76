"""Training throughput: real (non-padding) tokens a second, and the share of the machine's matmul peak that the
model FLOPs of those tokens make.

The peak is measured per device, dtype, thread count and torch version (two seconds of square matmuls the first
time, then a short check that only raises it) and cached in ``<cache>/measurements/matmul_peak.json``. Model FLOPs count the linear layers only (attention's own
products and the optimizer left out): a training token costs ``6 x`` the draft's parameters (its embedding aside)
per TTT step, plus the target's ``2 x`` its parameters (its embedding aside) online, or its output head alone from
offline features.
"""

from __future__ import annotations

import json
import platform
import time

import torch

from ..atomic import atomic_write_json
from ..targets import cache_dir


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine()


def _timed_matmuls(device: torch.device, dtype: torch.dtype, n: int, seconds: float, rounds: int) -> float:
    """The best FLOP/s of ``rounds`` rounds of ``n x n`` products, each round ``seconds`` long (the best: other work
    on a shared machine only slows a round down)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up: thread pool, kernels
    sync()
    best = 0.0
    for _ in range(rounds):
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            count += 1
            if device.type == "cuda":
                sync()
        best = max(best, 2 * n**3 * count / (time.perf_counter() - t0))
    return best


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32) -> dict:
    """{"flops": FLOP/s, "device", "dtype", "threads", "torch", "matmul"}: measured (ten rounds) the first time, then
    read from the cache after a short check (three rounds) that keeps the higher of the two: on a shared machine the
    cached peak rises towards the machine's own with each quieter run."""
    key = {
        "device": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__,
    }
    path = cache_dir() / "measurements" / "matmul_peak.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = []
    old = next((e for e in known if all(e.get(k) == v for k, v in key.items())), None)
    n = 8192 if device.type == "cuda" else 1024
    flops = _timed_matmuls(device, dtype, n, 0.2, 3 if old is not None or device.type == "cuda" else 10)
    if old is not None and old["flops"] >= flops:
        return old
    entry = {**key, "flops": flops, "matmul": n}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, [e for e in known if e is not old] + [entry])
    return entry


def _params(module, leave_out=None) -> int:
    skip = {id(p) for p in leave_out.parameters()} if leave_out is not None else set()
    return sum(p.numel() for p in module.parameters() if id(p) not in skip)


def model_flops_per_token(draft, target, ttt_steps: int, online: bool) -> float:
    """Model FLOPs of one training token (module docstring)."""
    core = getattr(draft, "module", draft)
    flops = 6 * _params(core, core.get_input_embeddings()) * ttt_steps
    head = target.get_output_embeddings().weight.numel()
    if online:
        embed = target.get_input_embeddings()
        tied = embed.weight is target.get_output_embeddings().weight
        flops += 2 * (_params(target, embed) + (head if tied else 0))
    else:
        flops += 2 * head
    return float(flops)


class Throughput:
    """Real tokens and the seconds the training steps took (evaluations and checkpoints left out), since the run
    (re)started."""

    def __init__(self, flops_per_token: float, peak: dict):
        self.flops_per_token, self.peak = flops_per_token, peak
        self.tokens, self.seconds = 0, 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def peak_share(self) -> float:
        return self.tokens_per_s * self.flops_per_token / self.peak["flops"]

    def report(self) -> dict:
        """``training_metrics.json``'s ``throughput``."""
        return {
            "tokens": self.tokens,
            "train_seconds": round(self.seconds, 1),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "model_flops_per_token": self.flops_per_token,
            "peak_flops": self.peak["flops"],
            "peak_share": self.peak_share,
            "peak_measured_on": {k: self.peak.get(k) for k in ("device", "dtype", "threads", "torch")},
        }
