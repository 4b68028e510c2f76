"""``eagle3-hub bench``: decoding methods side by side on question suites.

Methods (``--methods``):

- ``plain``: ``target.generate`` (greedy or sampling). Always run: every speed-up is measured against it, in
  the same run.
- ``lookup``: transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``).
- ``assisted``: our EAGLE-3 draft as a transformers assistant (``assistant_model=draft``).
- ``tree``: our EAGLE-3 tree decoding (``eagle3_hub.generation.tree_decoding.generate``).
- ``assistant``: any small causal LM as a classic assistant (``--assistant-model``).

Measurement: methods are interleaved per question (their order rotates from one question to the next) after a
warm-up, so machine drift and caching effects spread evenly over the methods. Forward hooks on the target and
the draft give the time split (draft / verify / the rest) and, from where each target forward starts, how many
draft tokens each step accepted. Greedy outputs of every method are compared token by token with plain greedy.
On CUDA every method runs on the same attention kernels, without cuDNN's (``attention_kernels``: its per-shape
plans made plain ``generate`` 3.2x slower on an H200, results/cuda-h200/).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..generation.tree_decoding import attention_kernels
from ..targets import cpu_has_bf16_units, default_dtype
from .near_ties import near_tie_check, reduced_precision
from .suites import STANDARD_SUITES, Suite, load_suites

METHOD_NAMES = ("plain", "lookup", "assisted", "tree", "assistant")
DRAFT_METHODS = ("assisted", "tree")
REFERENCE_DRAFT = Path(__file__).resolve().parent.parent / "reference_draft" / "smollm2-135m-instruct"


# ----------------------------------------------------------------------------------------- measuring
def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ForwardTimer:
    """Wall time spent inside a group of modules. Nested calls (a model calling its own decoder) count once."""

    def __init__(self, modules, device: torch.device):
        self.device = device
        self.active = True  # off for methods that time themselves: on GPU every timed forward costs two syncs
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
        if not self.active:
            return
        if self._depth == 0:
            _sync(self.device)
            self._t0 = time.perf_counter()
        self._depth += 1

    def _post(self, module, args, output):
        if not self.active:
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            _sync(self.device)
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
        self.active = True
        self._handle = decoder.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        if not self.active:
            return
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


def machine_info(device: torch.device, dtype: torch.dtype | None = None) -> dict:
    """What the figures were measured on."""
    import platform

    import transformers

    from .. import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
        cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "eagle3_hub": __version__,
        "device": str(device),
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "cpu_bf16_units": cpu_has_bf16_units(),  # AVX512-BF16 / AMX: bf16 matmuls of several rows in hardware
    }
    # thread settings change CPU timings a lot (OMP_WAIT_POLICY=PASSIVE: a 9-token forward ~1.7x slower here)
    threading_env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "MKL_", "GOMP_"))}
    if threading_env:
        info["threading_env"] = dict(sorted(threading_env.items()))
    try:
        info["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    return info


def describe_machine(machine: dict) -> str:
    """One line: 'NVIDIA H100 80GB HBM3, bfloat16' or 'AMD EPYC (2 cores), float32'."""
    if machine.get("gpu"):
        where = machine["gpu"]
    else:
        n = machine.get("torch_threads") or machine.get("cpu_cores")
        where = f"{machine.get('cpu', 'CPU')} ({n} thread{'s' if n != 1 else ''}"
        where += ", bf16 units)" if machine.get("cpu_bf16_units") else ")"
    policy = (machine.get("threading_env") or {}).get("OMP_WAIT_POLICY")
    where += f", OMP_WAIT_POLICY={policy}" if policy and not machine.get("gpu") else ""
    return f"{where}, {machine.get('dtype')}, torch {machine.get('torch')}, transformers {machine.get('transformers')}"


# ----------------------------------------------------------------------------------------- methods
@dataclass
class Mode:
    """Greedy (temperature 0) or sampling."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def name(self) -> str:
        return "greedy" if self.greedy else f"T={self.temperature:g}"


@dataclass
class Method:
    """``run(input_ids, attention_mask, generation_config) -> (sequences (1, L), stats or None)``."""

    name: str
    kind: str  # plain, lookup, assisted, tree, assistant
    run: Callable
    tree_params: dict | None = None


@dataclass
class BenchContext:
    target: torch.nn.Module
    tokenizer: object
    draft: torch.nn.Module | None = None
    assistant: torch.nn.Module | None = None
    assistant_tokenizer: object = None
    lookup_tokens: int = 10


def build_methods(
    names: list[str],
    ctx: BenchContext,
    tree_grid: list[dict] | None = None,
) -> list[Method]:
    """``names`` in METHOD_NAMES; ``tree_grid``: tree settings (``TREE_KEYS``) for ``tree``;
    several settings give one method each (the sweep)."""
    target = ctx.target
    methods: list[Method] = []
    for name in names:
        if name == "plain":
            methods.append(Method("plain", "plain", lambda ids, mask, gc: (target.generate(ids, attention_mask=mask, generation_config=gc), None)))
        elif name == "lookup":
            n = ctx.lookup_tokens

            def run_lookup(ids, mask, gc, n=n):
                gc = copy.copy(gc)
                gc.prompt_lookup_num_tokens = n
                return target.generate(ids, attention_mask=mask, generation_config=gc), None

            methods.append(Method("lookup", "lookup", run_lookup))
        elif name == "assisted":
            draft = ctx.draft

            def run_assisted(ids, mask, gc, draft=draft):
                return target.generate(ids, attention_mask=mask, generation_config=gc, assistant_model=draft), None

            methods.append(Method("assisted", "assisted", run_assisted))
        elif name == "assistant":
            assistant = ctx.assistant
            extra = {}
            if ctx.assistant_tokenizer is not None:  # different vocabularies: universal assisted decoding
                extra = dict(tokenizer=ctx.tokenizer, assistant_tokenizer=ctx.assistant_tokenizer)

            def run_assistant(ids, mask, gc, assistant=assistant, extra=extra):
                return target.generate(ids, attention_mask=mask, generation_config=gc, assistant_model=assistant, **extra), None

            methods.append(Method("assistant", "assistant", run_assistant))
        elif name == "tree":
            from ..generation.tree_decoding import generate as tree_generate

            grid = tree_grid or [{}]
            for params in grid:
                label = "tree" if len(grid) == 1 else tree_label(params)

                def run_tree(ids, mask, gc, params=params):
                    out = tree_generate(
                        target, ctx.draft, ids, attention_mask=mask, max_new_tokens=gc.max_new_tokens,
                        do_sample=gc.do_sample, temperature=gc.temperature if gc.do_sample else 1.0,
                        top_k=(gc.top_k or 0) if gc.do_sample else 0, top_p=gc.top_p if gc.do_sample else 1.0,
                        eos_token_id=gc.eos_token_id, tokenizer=ctx.tokenizer,
                        depth=params.get("depth"), tree_top_k=params.get("tree_top_k"),
                        total_tokens=params.get("total_tokens"), lookup_tokens=params.get("lookup_tokens"),
                        min_node_prob=params.get("min_node_prob"), grow_min_prob=params.get("grow_min_prob"),
                    )
                    return out.sequences, out.stats

                methods.append(Method(label, "tree", run_tree, tree_params=dict(params)))
        else:
            raise ValueError(f"Unknown method '{name}': choose from {', '.join(METHOD_NAMES)}")
    return methods


TREE_KEY_TYPES = {"depth": int, "tree_top_k": int, "total_tokens": int, "lookup_tokens": int,
                  "min_node_prob": float, "grow_min_prob": float}
TREE_KEYS = tuple(TREE_KEY_TYPES)


def tree_label(params: dict) -> str:
    parts = [f"{k}={params[k]}" for k in TREE_KEYS if params.get(k) is not None]
    return "tree[" + ",".join(parts) + "]"


# ----------------------------------------------------------------------------------------- one turn
@dataclass
class TurnRecord:
    suite: str
    question_id: int | str
    category: str
    turn: int
    mode: str
    method: str
    prompt_tokens: int
    new_tokens: int
    time_s: float
    draft_time_s: float
    verify_time_s: float
    target_forwards: int
    accept_hist: list[int] | None  # accept_hist[k] = steps that accepted exactly k draft tokens
    peak_memory_mb: float
    output_ids: list[int] = field(default_factory=list, repr=False)
    prompt_ids: list[int] = field(default_factory=list, repr=False)

    def to_json(self, with_outputs: bool = False) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("output_ids", "prompt_ids")}
        if with_outputs:
            d["output_ids"] = self.output_ids
        return d


def _histogram(accepted: list[int]) -> list[int]:
    hist = [0] * (max(accepted) + 1 if accepted else 1)
    for a in accepted:
        hist[a] += 1
    return hist


def _accepted_from_tree_stats(stats) -> list[int]:
    """Accepted draft tokens per target forward from tree decoding's stats, whose ``accepted_per_step`` counts
    the tokens each forward committed (accepted draft tokens + the bonus token; the prefill commits one)."""
    return [max(int(n) - 1, 0) for n in stats.accepted_per_step]


class TurnRunner:
    """Runs one method on one prompt under hooks and returns a TurnRecord."""

    def __init__(self, ctx: BenchContext, device: torch.device):
        from ..eagle3_assistant import decoder_layers

        self.ctx = ctx
        self.device = device
        target = ctx.target
        decoder = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        self.verify_timer = ForwardTimer([target, decoder, target.get_output_embeddings()], device)
        drafts = [m for m in (ctx.draft, ctx.assistant) if m is not None]
        self.draft_timer = ForwardTimer(drafts, device)
        self.starts = ForwardStarts(decoder_layers(target)[0])
        self.memory = PeakMemory(device)

    def close(self):
        self.verify_timer.close()
        self.draft_timer.close()
        self.starts.close()

    def run(self, method: Method, input_ids, attention_mask, gc, meta: dict) -> TurnRecord:
        prompt_len = input_ids.shape[1]
        for hook in (self.verify_timer, self.draft_timer, self.starts):
            hook.reset()
            hook.active = method.kind != "tree"  # tree decoding counts and times its own steps
        self.memory.reset()
        _sync(self.device)
        t0 = time.perf_counter()
        with torch.inference_mode(), attention_kernels(self.device):  # every method on the same attention kernels
            sequences, stats = method.run(input_ids, attention_mask, gc)
        _sync(self.device)
        elapsed = time.perf_counter() - t0
        new_ids = sequences[0, prompt_len:].tolist()
        new_ids = _strip_padding(new_ids, gc.pad_token_id, gc.eos_token_id)

        if method.kind == "tree":
            accepted = _accepted_from_tree_stats(stats)
            forwards, draft_t, verify_t = stats.target_forwards, stats.draft_time_s, stats.verify_time_s
            if not method.tree_params:  # record the shape it chose by default
                tree = stats.tree
                method.tree_params = {"depth": tree.get("depth"), "tree_top_k": tree.get("top_k"),
                                      "total_tokens": tree.get("total_tokens"), "lookup_tokens": tree.get("lookup_tokens"),
                                      "min_node_prob": tree.get("min_node_prob"),
                                      "grow_min_prob": tree.get("grow_min_prob")}
        else:  # generate with or without an assistant: from where each target forward started
            accepted = self.starts.accepted_per_step(prompt_len, prompt_len + len(new_ids))
            forwards, draft_t, verify_t = len(self.starts.starts), self.draft_timer.total, self.verify_timer.total
        return TurnRecord(
            prompt_tokens=prompt_len, new_tokens=len(new_ids), time_s=elapsed, draft_time_s=float(draft_t),
            verify_time_s=float(verify_t), target_forwards=int(forwards),
            accept_hist=_histogram(accepted) if accepted is not None else None,
            peak_memory_mb=round(self.memory.peak_mb(), 1), output_ids=new_ids, prompt_ids=input_ids[0].tolist(),
            mode=meta["mode"],
            method=method.name, suite=meta["suite"], question_id=meta["question_id"],
            category=meta["category"], turn=meta["turn"],
        )


def _strip_padding(ids: list[int], pad_id, eos_id) -> list[int]:
    """Drop padding after an end-of-sequence token (batch-1 outputs normally have none)."""
    eos = set(eos_id if isinstance(eos_id, (list, tuple)) else [eos_id]) - {None}
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


# ----------------------------------------------------------------------------------------- prompts
def build_prompt(tokenizer, turns: list[str], answers: list[str]) -> torch.Tensor:
    """Token ids (1, L) of a conversation: user turns with the assistant's earlier answers between them."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:  # a base model: a plain transcript
        text = "".join(
            f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}\n" for m in messages
        ) + "Assistant:"
        ids = tokenizer(text, return_tensors="pt").input_ids
    return ids


def generation_config_for(target, mode: Mode, max_new_tokens: int, tokenizer):
    gc = copy.deepcopy(target.generation_config)
    gc.max_new_tokens = max_new_tokens
    gc.max_length = None
    gc.min_new_tokens = None
    gc.do_sample = not mode.greedy
    gc.num_beams = 1
    if mode.greedy:
        gc.temperature, gc.top_p, gc.top_k = 1.0, 1.0, 50
    else:
        gc.temperature, gc.top_p, gc.top_k = mode.temperature, mode.top_p, (mode.top_k or None)
    gc.repetition_penalty = None
    if gc.pad_token_id is None:
        gc.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if gc.eos_token_id is None:
        gc.eos_token_id = tokenizer.eos_token_id
    gc.return_dict_in_generate = False
    return gc


# ----------------------------------------------------------------------------------------- the run
def summarize(records: list[TurnRecord], plain_name: str = "plain") -> list[dict]:
    """Per (suite, mode, method), and per (mode, method) over all suites as suite '_all'."""
    groups: dict[tuple, list[TurnRecord]] = {}
    for r in records:
        groups.setdefault((r.suite, r.mode, r.method), []).append(r)
        groups.setdefault(("_all", r.mode, r.method), []).append(r)
    rows = []
    for (suite, mode, method), rs in groups.items():
        tokens = sum(r.new_tokens for r in rs)
        t = sum(r.time_s for r in rs)
        draft_t = sum(r.draft_time_s for r in rs)
        verify_t = sum(r.verify_time_s for r in rs)
        hist: list[int] = []
        have_hist = all(r.accept_hist is not None for r in rs)
        for r in rs:
            for k, c in enumerate(r.accept_hist or []):
                hist.extend([0] * (k + 1 - len(hist)))
                hist[k] += c
        steps = sum(hist)
        if have_hist and steps:
            accepted_total = sum(k * c for k, c in enumerate(hist))
            tau = 1 + accepted_total / steps
            # fraction of forwards that accepted >= k draft tokens; plain decoding drafts nothing
            by_pos = None if method == plain_name else [sum(hist[k:]) / steps for k in range(1, max(len(hist), 2))]
        else:
            forwards = sum(r.target_forwards for r in rs)
            tau = tokens / forwards if forwards else None
            by_pos = None
        rows.append(
            {
                "suite": suite, "mode": mode, "method": method, "turns": len(rs),
                "questions": len({(r.suite, r.question_id) for r in rs}),
                "new_tokens": tokens, "time_s": round(t, 4),
                "tokens_per_s": tokens / t if t > 0 else None,
                "mean_acceptance_length": tau,
                "acceptance_by_position": by_pos,
                "time_split": {
                    "draft": draft_t / t if t else None,
                    "verify": verify_t / t if t else None,
                    "overhead": max(t - draft_t - verify_t, 0.0) / t if t else None,
                },
                "peak_memory_mb": max(r.peak_memory_mb for r in rs),
                "target_forwards": sum(r.target_forwards for r in rs),
            }
        )
    by_key = {(r["suite"], r["mode"], r["method"]): r for r in rows}
    for r in rows:
        base = by_key.get((r["suite"], r["mode"], plain_name))
        r["speedup"] = (
            r["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] and r["tokens_per_s"] else None
        )
    return rows


def lossless_check(
    records: list[TurnRecord], tokenizer, plain_name: str = "plain", near_ties: dict | None = None
) -> dict:
    """Greedy outputs of every method against plain greedy, turn by turn. ``near_ties`` (reduced precision:
    ``near_ties.near_tie_check``): a method whose outputs differ is still lossless where every token it emitted
    is the float32 target's choice up to a near-tie; each entry then carries its own and plain's scores."""
    plain = {(r.suite, r.question_id, r.turn): r for r in records if r.mode == "greedy" and r.method == plain_name}
    report: dict[str, dict] = {}
    for r in records:
        if r.mode != "greedy" or r.method == plain_name:
            continue
        p = plain.get((r.suite, r.question_id, r.turn))
        if p is None:
            continue
        entry = report.setdefault(r.method, {"turns": 0, "identical": 0, "by_suite": {}, "mismatches": []})
        per_suite = entry["by_suite"].setdefault(r.suite, {"turns": 0, "identical": 0})
        entry["turns"] += 1
        per_suite["turns"] += 1
        if r.output_ids == p.output_ids:
            entry["identical"] += 1
            per_suite["identical"] += 1
            continue
        n = min(len(r.output_ids), len(p.output_ids))
        first = next((i for i in range(n) if r.output_ids[i] != p.output_ids[i]), n)
        entry["mismatches"].append(
            {
                "suite": r.suite, "question_id": r.question_id, "turn": r.turn, "first_difference": first,
                "plain": tokenizer.decode(p.output_ids[max(0, first - 8): first + 12]),
                "method": tokenizer.decode(r.output_ids[max(0, first - 8): first + 12]),
            }
        )
    for method, entry in report.items():
        entry["lossless"] = entry["identical"] == entry["turns"]
        if near_ties is not None and method in near_ties:
            entry["near_ties"] = near_ties[method]
            entry["plain_near_ties"] = near_ties.get(plain_name)
            entry["lossless"] = entry["lossless"] or near_ties[method]["within_tolerance"]
    return report


def run_benchmark(
    target,
    tokenizer,
    suites: list[Suite],
    methods: list[str] = ("plain", "lookup", "assisted", "tree"),
    draft=None,
    assistant=None,
    assistant_tokenizer=None,
    modes: list[Mode] | None = None,
    max_new_tokens: int = 256,
    tree_grid: list[dict] | None = None,
    lookup_tokens: int = 10,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = True,
    keep_outputs: bool = False,
    max_turns: int | None = None,
    float32_check: bool = True,
) -> dict:
    """Run every method on every question of every suite (interleaved) and return the results dict that
    ``report.write_report`` renders. ``target``/``draft`` must already sit on their device and dtype.
    ``float32_check``: in bf16/fp16, score every greedy output with a float32 copy of the target (``near_ties``),
    which needs memory for that copy once the runs are done."""
    methods = list(dict.fromkeys(methods))
    if "plain" not in methods:
        methods.insert(0, "plain")  # speed-ups are relative to plain decoding in the same run
    if any(m in DRAFT_METHODS for m in methods) and draft is None:
        raise ValueError(f"Methods {[m for m in methods if m in DRAFT_METHODS]} need a draft (--draft).")
    if "assistant" in methods and assistant is None:
        raise ValueError("Method 'assistant' needs --assistant-model.")
    modes = modes or [Mode()]
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    ctx = BenchContext(target, tokenizer, draft, assistant, assistant_tokenizer, lookup_tokens)
    method_objs = build_methods(methods, ctx, tree_grid)
    runner = TurnRunner(ctx, device)
    records: list[TurnRecord] = []
    bar = None
    total = sum(len(s) for s in suites) * len(method_objs) * len(modes)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True)
    try:
        for mode in modes:
            gc = generation_config_for(target, mode, max_new_tokens, tokenizer)
            _warm_up(runner, method_objs, suites, tokenizer, gc, warmup, device)
            for suite in suites:
                for qi, q in enumerate(suite.questions):
                    order = method_objs[qi % len(method_objs):] + method_objs[: qi % len(method_objs)]
                    for method in order:
                        answers: list[str] = []
                        for ti in range(min(len(q.turns), max_turns or len(q.turns))):  # max_turns=1: first turns
                            ids = build_prompt(tokenizer, q.turns[: ti + 1], answers).to(device)
                            if not mode.greedy:
                                torch.manual_seed(seed + 1000 * qi + ti)
                            meta = dict(suite=suite.name, question_id=q.question_id, category=q.category, turn=ti + 1, mode=mode.name)
                            rec = runner.run(method, ids, torch.ones_like(ids), gc, meta)
                            records.append(rec)
                            answers.append(tokenizer.decode(rec.output_ids, skip_special_tokens=True).strip())
                        if bar is not None:
                            bar.set_postfix_str(f"{suite.name} {method.name}", refresh=False)
                            bar.update(1)
    finally:
        runner.close()
        if bar is not None:
            bar.close()

    near, near_skipped = None, None
    if reduced_precision(dtype) and any(r.mode == "greedy" for r in records):
        if not float32_check:
            near_skipped = "turned off (--no-float32-check)"
        else:
            try:  # float32 scores of every greedy output, by a float32 copy of the target
                near = near_tie_check(records, target, dtype)
            except (torch.cuda.OutOfMemoryError, MemoryError) as e:  # no room for the copy: keep the figures measured
                near_skipped = f"no memory for a float32 copy of the target ({type(e).__name__})"
                print(f"warning: the float32 greedy check was skipped: {near_skipped}", file=sys.stderr)
    results = {
        "format": "eagle3-hub-bench/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(device, dtype),
        "settings": {
            "methods": [m.name for m in method_objs],
            "modes": [m.__dict__ | {"name": m.name} for m in modes],
            "max_new_tokens": max_new_tokens,
            "max_turns": max_turns,
            "lookup_tokens": lookup_tokens if "lookup" in methods else None,
            "tree": [m.tree_params for m in method_objs if m.kind == "tree"] or None,
            "warmup": warmup,
            "seed": seed,
            "memory_measure": runner.memory.kind,
            "suites": [{"name": s.name, "source": s.source, "questions": len(s)} for s in suites],
        },
        "results": summarize(records),
        "lossless": lossless_check(records, tokenizer, near_ties=near),
        "float32_check_skipped": near_skipped,
        "records": [r.to_json(with_outputs=keep_outputs) for r in records],
    }
    if tree_grid and len(tree_grid) > 1:
        results["sweep"] = sweep_summary(results["results"], method_objs)
    return results


def _warm_up(runner: TurnRunner, methods: list[Method], suites: list[Suite], tokenizer, gc, warmup: int, device):
    if warmup <= 0 or not suites or not suites[0].questions:
        return
    q = suites[0].questions[0]
    ids = build_prompt(tokenizer, q.turns[:1], []).to(device)
    gc = copy.deepcopy(gc)
    gc.max_new_tokens = min(gc.max_new_tokens, 32)
    meta = dict(suite="warmup", question_id=q.question_id, category=q.category, turn=1, mode="warmup")
    for _ in range(warmup):
        for method in methods:
            runner.run(method, ids, torch.ones_like(ids), gc, meta)


def sweep_summary(rows: list[dict], methods: list[Method]) -> dict:
    """Tree settings ranked by overall speed-up (all suites), per mode."""
    params = {m.name: m.tree_params for m in methods if m.kind == "tree"}
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        ranked = sorted(
            (r for r in rows if r["suite"] == "_all" and r["mode"] == mode and r["method"] in params),
            key=lambda r: -(r["speedup"] or 0),
        )
        out[mode] = {
            "ranking": [
                {**params[r["method"]], "method": r["method"], "speedup": r["speedup"],
                 "tokens_per_s": r["tokens_per_s"], "mean_acceptance_length": r["mean_acceptance_length"]}
                for r in ranked
            ],
            "best": {**params[ranked[0]["method"]], "speedup": ranked[0]["speedup"]} if ranked else None,
        }
    return out


# ----------------------------------------------------------------------------------------- CLI
def _number_list(text: str | None, kind: type = int) -> list[int | float | None]:
    """A comma-separated list of numbers of type ``kind`` (``[None]`` when not given: the default setting)."""
    if text is None:
        return [None]
    return [kind(x) for x in str(text).split(",") if x.strip()]


def tree_settings(text: str) -> list[dict]:
    """``--trees``: settings separated by ``;``, each ``key=value,...`` over ``TREE_KEYS`` (unset keys: the device
    default), e.g. ``"depth=3;depth=8,grow_min_prob=0.3"``."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        setting = {}
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, eq, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or key not in TREE_KEY_TYPES:
                raise SystemExit(f"--trees: {pair!r} is not key=value with a key among {', '.join(TREE_KEYS)}")
            try:
                setting[key] = TREE_KEY_TYPES[key](value.strip())
            except ValueError:
                raise SystemExit(f"--trees: {key} takes a{'n integer' if TREE_KEY_TYPES[key] is int else ' number'}, "
                                 f"got {value.strip()!r}") from None
        out.append(setting)
    if not out:
        raise SystemExit("--trees: give at least one tree setting, e.g. --trees 'depth=3;depth=8,grow_min_prob=0.3'")
    return out


def tree_grid_from_args(args) -> list[dict]:
    """The tree settings to run: ``--trees`` as listed, else every combination of the per-key lists."""
    if getattr(args, "trees", None):
        grid = tree_settings(args.trees)
    else:
        grid = _product_grid(args)
    # a tree of depth d and top-k k proposes k + (d - 1) * k^2 nodes: larger total_tokens is not a tree shape
    fits = [g for g in grid if not {"depth", "tree_top_k", "total_tokens"} <= g.keys()
            or g["total_tokens"] <= g["tree_top_k"] + (g["depth"] - 1) * g["tree_top_k"] ** 2]
    if grid and not fits:
        raise SystemExit("No tree shape in the sweep is valid: total_tokens must be <= top_k + (depth - 1) * top_k**2.")
    return fits


def _product_grid(args) -> list[dict]:
    grid = [
        dict(zip(TREE_KEYS, values))
        for values in itertools.product(_number_list(args.depth), _number_list(args.tree_top_k), _number_list(args.total_tokens),
                                        _number_list(getattr(args, "tree_lookup_tokens", None)),
                                        _number_list(getattr(args, "min_node_prob", None), float),
                                        _number_list(getattr(args, "grow_min_prob", None), float))
    ]
    return [{k: v for k, v in g.items() if v is not None} for g in grid]


def add_arguments(parser: argparse.ArgumentParser):
    g = parser.add_argument_group("models")
    g.add_argument("--target", default=None, help="target: Hub id, folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--draft", default=None, help="EAGLE-3 draft: Hub id or folder (default with the embedded target: the reference draft)")
    g.add_argument("--assistant-model", default=None, help="also run any small causal LM (Hub id or folder) as a classic assistant")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="auto: bfloat16 on GPU and on CPUs with bf16 units (AVX512-BF16, AMX), float32 on other CPUs")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    g = parser.add_argument_group("what to run")
    g.add_argument("--suite", default="mt_bench", help=f"comma-separated: question.jsonl files or folders, names ({', '.join(STANDARD_SUITES)}, all) or Hub dataset ids")
    g.add_argument("--bench-dir", default=None, help="folder with <suite>.jsonl or <suite>/question.jsonl files (also $EAGLE3_HUB_BENCH_DIR)")
    g.add_argument("--num-questions", type=int, default=None, help="first N questions of each suite")
    g.add_argument("--methods", default="plain,lookup,assisted,tree", help=f"comma-separated from {', '.join(METHOD_NAMES)}")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--max-turns", type=int, default=None, help="user turns per question (MT-bench has 2; 1 = first turns only)")
    g.add_argument("--temperature", default="0", help="comma-separated; 0 = greedy (with the lossless check). E.g. 0,0.7")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for 'lookup'")
    g.add_argument("--assistant-tokens", type=int, default=None, help="num_assistant_tokens for 'assisted' and 'assistant'")
    g.add_argument("--warmup", type=int, default=1, help="warm-up rounds (every method on the first question) before measuring")
    g = parser.add_argument_group("tree decoding")
    g.add_argument("--depth", default=None, help="draft depth (comma-separated list with --sweep)")
    g.add_argument("--tree-top-k", default=None, help="candidates per node (list with --sweep)")
    g.add_argument("--total-tokens", default=None, help="tree size verified per step (list with --sweep)")
    g.add_argument("--tree-lookup-tokens", default=None,
                   help="tokens copied from the text so far as one more branch of the tree, greedy only; 0 = none (list with --sweep)")
    g.add_argument("--min-node-prob", default=None,
                   help="keep only tree nodes whose cumulative draft probability reaches this; 0 = always --total-tokens (list with --sweep)")
    g.add_argument("--grow-min-prob", default=None,
                   help="draft a further tree level (up to --depth) only while a frontier node's cumulative draft probability "
                        "reaches this; 0 = always --depth levels (list with --sweep)")
    g.add_argument("--trees", default=None,
                   help="tree settings to compare in one run, ';'-separated, each key=value,... over "
                        f"{', '.join(TREE_KEYS)} (e.g. 'depth=3;depth=8,grow_min_prob=0.3'); replaces the per-key lists")
    g.add_argument("--sweep", action="store_true", help="try every combination of --depth/--tree-top-k/--total-tokens and report the best for this device")
    g = parser.add_argument_group("output")
    g.add_argument("--out", default="bench-results", help="folder for bench.json, bench.md and bench.png")
    g.add_argument("--no-chart", action="store_true")
    g.add_argument("--save-outputs", action="store_true", help="keep every generated token id in bench.json")
    g.add_argument("--no-float32-check", action="store_true", help="in bf16/fp16: skip scoring the greedy outputs with a float32 copy of the target (it needs memory for that copy)")
    g.add_argument("--strict", action="store_true", help="exit with status 1 when a greedy output differs from plain greedy")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


SWEEP_DEFAULTS = {"depth": "3,5,7", "tree_top_k": "4,8", "total_tokens": "16,32,60"}


def _resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    dev = torch.device(device)
    if dtype == "auto":
        dt = default_dtype(dev)
    else:
        dt = getattr(torch, dtype)
    return dev, dt


def resolve_draft(args, methods: list[str]) -> str | None:
    """The draft to load, checked before any model is: ``--draft``, or the reference draft of the embedded
    target. ``None`` when no method needs one."""
    if not any(m in DRAFT_METHODS for m in methods):
        return None
    if args.draft is not None:
        return args.draft
    needs = ", ".join(m for m in methods if m in DRAFT_METHODS)
    if args.target not in (None, "", "smollm2-135m-instruct", "embedded"):
        raise SystemExit(
            f"Methods {needs} need an EAGLE-3 draft for {args.target}: pass --draft PATH_OR_REPO, train one "
            f"(`eagle3-hub train --target {args.target}`), or run only --methods plain,lookup."
        )
    if not (REFERENCE_DRAFT / "config.json").exists():
        raise SystemExit(
            f"Methods {needs} need an EAGLE-3 draft, and the reference draft for the embedded target is not in this "
            f"installation ({REFERENCE_DRAFT}). Pass --draft PATH_OR_REPO, train one with `eagle3-hub train`, or "
            "run only --methods plain,lookup."
        )
    return str(REFERENCE_DRAFT)


def load_models(args, device: torch.device, dtype: torch.dtype, draft_path: str | None):
    """(target, tokenizer, draft or None, assistant or None, assistant_tokenizer or None)."""
    from ..targets import load_target

    target, tokenizer = load_target(args.target, dtype=dtype, device=device)
    draft = None
    if draft_path is not None:
        from ..modeling_eagle3 import Eagle3DraftModel

        draft = Eagle3DraftModel.from_pretrained(draft_path, dtype=dtype).to(device)
        draft.eval().requires_grad_(False)
        draft.bind(target)
        if args.assistant_tokens:
            draft.generation_config.num_assistant_tokens = args.assistant_tokens
    assistant = assistant_tok = None
    if args.assistant_model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        assistant = AutoModelForCausalLM.from_pretrained(args.assistant_model, dtype=dtype).to(device).eval()
        if assistant.config.get_text_config().vocab_size != target.config.get_text_config().vocab_size:
            assistant_tok = AutoTokenizer.from_pretrained(args.assistant_model)
        if args.assistant_tokens:
            assistant.generation_config.num_assistant_tokens = args.assistant_tokens
    return target, tokenizer, draft, assistant, assistant_tok


def run(args) -> int:
    from .report import print_report, write_report

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHOD_NAMES]
    if unknown:
        raise SystemExit(f"Unknown method(s) {unknown}: choose from {', '.join(METHOD_NAMES)}")
    if args.assistant_model and "assistant" not in methods:
        methods.append("assistant")
    if "assistant" in methods and not args.assistant_model:
        raise SystemExit("Method 'assistant' runs a small model as a classic assistant: pass --assistant-model ID_OR_FOLDER.")
    if args.trees and "tree" not in methods:
        methods.append("tree")
    if args.sweep and not args.trees:
        if "tree" not in methods:
            methods.append("tree")
        for key, default in SWEEP_DEFAULTS.items():
            if getattr(args, key) is None:
                setattr(args, key, default)
    modes = [Mode(float(t), args.top_p, args.top_k) for t in str(args.temperature).split(",") if t.strip()]
    draft_path = resolve_draft(args, methods)
    suites = load_suites(args.suite, bench_dir=args.bench_dir, num_questions=args.num_questions)
    device, dtype = _resolve_device_dtype(args.device, args.dtype)
    target, tokenizer, draft, assistant, assistant_tok = load_models(args, device, dtype, draft_path)
    results = run_benchmark(
        target, tokenizer, suites, methods=methods, draft=draft, assistant=assistant,
        assistant_tokenizer=assistant_tok, modes=modes, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
        tree_grid=tree_grid_from_args(args) if "tree" in methods else None, lookup_tokens=args.lookup_tokens,
        warmup=args.warmup, seed=args.seed, progress=not args.quiet, keep_outputs=args.save_outputs,
        float32_check=not args.no_float32_check,
    )
    results["settings"].update(
        target=args.target or "smollm2-135m-instruct",
        draft=draft_path,
        assistant_model=args.assistant_model,
    )
    paths = write_report(results, args.out, chart=not args.no_chart)
    print_report(results, paths)
    failed = any(not e["lossless"] for e in results["lossless"].values())
    return 1 if (failed and args.strict) else 0
