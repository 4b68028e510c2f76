"""The cost model of a tree-decoding step on this machine: the target's verification time as a function of (rows,
slots per row, context) and the draft's time per tree (its read of the accepted tokens, then each further level),
measured once per (target, draft, tree width, device, dtype, torch version, thread count) through the decoder's own
``Verifier`` and ``Drafter`` and cached on disk as JSON.

Each is measured after a short context and after a long one, and read in between (and past the long one) along the
line through the two: attention over the context grows with rows x slots, so a step's time grows as a sequence does
(docs/tree-decoding.md), and it grows more for a tree's slots than for one token per row.

The controller (``controller.py``) weighs the expected tokens of each tree shape against these costs. A
measurement takes a few seconds: each grid point is timed after a warm-up, its fastest of three runs kept (noise on
a shared machine only adds time). Rows and slots are measured at powers of two; past the first ``MIN_SLOT_POINTS``
slot counts, those after a forward slower than ``SLOW_FORWARD_S``, and rows past ``MAX_MEASURED_ROWS``, are
extrapolated along the last measured slope (a forward that large is compute-bound: linear in its tokens).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import TreeConfig
from .drafting import Drafter
from .outputs import PhaseClock, TreeDecodingStats
from .paused_hooks import PausedFeatureHooks
from .verification import Tree, Verifier

COSTS_FORMAT = 4  # bump when what is measured changes (2: packed projections, 3: two contexts, 4: the dtype
# recorded and every file checked on read): older files are measured again
CONTEXT_TOKENS = 64  # context of the measured forwards (a short prompt)
LONG_CONTEXT_TOKENS = 512  # context of the second measurement (a prompt and an answer)
SLOW_FORWARD_S = 0.25  # past a forward this slow, larger slot counts are extrapolated, not measured
MIN_SLOT_POINTS = 4  # slot counts always measured (1, 2, 4, 8): where a forward's cost starts to grow
MAX_MEASURED_ROWS = 64  # larger batches: extrapolated
ACCEPTED_READ = 4  # accepted tokens the draft reads per step in the measurement

_memo: dict[str, StepCosts] = {}
_unwritable: set[Path] = set()  # cache folders already warned about in this process
logger = logging.getLogger(__name__)


def cache_root() -> Path:
    """``$EAGLE3_HUB_CACHE``, else ``$XDG_CACHE_HOME/eagle3_hub`` (``~/.cache/eagle3_hub``): the rule of
    ``eagle3_hub.targets.cache_dir``, restated because this package is also copied into a draft's
    ``custom_generate/`` without eagle3_hub (a test keeps the two equal)."""
    root = os.environ.get("EAGLE3_HUB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "eagle3_hub"
    )
    return Path(root)


def _interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through ``points`` {x: y}, extended along the last (first) segment's slope, never
    below the smallest slope's start (a cost does not fall with more work)."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]] * max(x, 1) / xs[0] if x > xs[0] else points[xs[0]]
    if x <= xs[0]:
        return points[xs[0]]
    for lo, hi in zip(xs, xs[1:]):  # noqa: B007 (the segment the loop stops at is read below)
        if x <= hi:
            break
    slope = max((points[hi] - points[lo]) / (hi - lo), 0.0)
    return points[lo] + slope * (x - lo)


@dataclass
class StepCosts:
    """Measured seconds after ``context`` tokens: ``verify[rows][slots]`` one target forward over ``slots`` tree
    slots per row (root included), ``draft_read[rows]`` the draft's first forward of a step (the accepted tokens)
    with the tree's selection, ``draft_level[rows]`` each further level (``top_k`` frontier nodes per row);
    ``longer``: the same after ``LONG_CONTEXT_TOKENS`` (None: every context costs the same)."""

    key: str
    top_k: int
    device: str
    dtype: str = ""  # the target's, as measured (``str(torch.dtype)``)
    verify: dict[int, dict[int, float]] = field(default_factory=dict)
    draft_read: dict[int, float] = field(default_factory=dict)
    draft_level: dict[int, float] = field(default_factory=dict)
    # rows whose slot grid stopped at a slow forward (larger slot counts extrapolated): kept apart from the readings,
    # which the monotone pass may lower afterwards
    slow_rows: set[int] = field(default_factory=set)
    fresh: bool = False  # measured by this process from nothing (not read from the disk cache, even in part)
    context: int = CONTEXT_TOKENS
    longer: StepCosts | None = None

    def verify_s(self, rows: int, slots: int, context: int | None = None) -> float:
        """One verification of ``rows`` rows with ``slots`` slots each after ``context`` tokens (None: the
        table's own)."""
        per_rows = {r: _interpolate(by_slots, slots) for r, by_slots in self.verify.items()}
        short = _interpolate(per_rows, rows)
        return self._at(short, context, lambda longer: longer.verify_s(rows, slots))

    def draft_s(self, rows: int, depth: int, context: int | None = None) -> float:
        """Drafting a tree of ``depth`` levels for ``rows`` rows (0 levels: no draft forward)."""
        if depth < 1:
            return 0.0
        short = _interpolate(self.draft_read, rows) + (depth - 1) * _interpolate(self.draft_level, rows)
        return self._at(short, context, lambda longer: longer.draft_s(rows, depth))

    def _at(self, short: float, context: int | None, of_longer) -> float:
        """``short`` (this table's time) moved to ``context`` along the line to the longer table's, never below
        ``short`` (a longer context does not cost less)."""
        if self.longer is None or context is None or context <= self.context:
            return short
        slope = max(of_longer(self.longer) - short, 0.0) / (self.longer.context - self.context)
        return short + slope * (context - self.context)

    def covers(self, rows: int, slots: int) -> bool:
        """Whether the table (and the longer one) holds every rows and slots count ``measure`` would for these (or
        knows them slow)."""
        if self.context < LONG_CONTEXT_TOKENS and (self.longer is None or not self.longer.covers(rows, slots)):
            return False
        top = measured_grid(slots)[-1]
        for r in measured_grid(rows, MAX_MEASURED_ROWS):
            by_slots = self.verify.get(r)
            if not by_slots or r not in self.draft_level:
                return False
            slow = r in self.slow_rows or by_slots[max(by_slots)] > SLOW_FORWARD_S
            if max(by_slots) < top and (len(by_slots) < MIN_SLOT_POINTS or not slow):
                return False
        return True

    def table(self) -> str:
        """A markdown table: milliseconds per verification by rows and slots, and the draft's per step."""
        slots = sorted({s for by in self.verify.values() for s in by})
        lines = [
            f"Verification (target forward) in ms, by rows x slots per row ({self.device}):",
            "",
            "| rows | " + " | ".join(str(s) for s in slots) + " | draft read | draft level |",
            "|---" * (len(slots) + 3) + "|",
        ]
        for r in sorted(self.verify):
            cells = [f"{1e3 * self.verify[r][s]:.2f}" if s in self.verify[r] else "" for s in slots]
            lines.append(
                f"| {r} | "
                + " | ".join(cells)
                + f" | {1e3 * self.draft_read.get(r, float('nan')):.2f}"
                + f" | {1e3 * self.draft_level.get(r, float('nan')):.2f} |"
            )
        lines += [
            "",
            f"(after {self.context} tokens of context; empty cells: extrapolated linearly; draft level: "
            f"{self.top_k} frontier nodes per row; cached in {cost_file(self.key)})",
        ]
        if self.longer is not None:
            lines += ["", self.longer.table()]
        return "\n".join(lines)

    def zero_times(self) -> str | None:
        """What of a measured table took no time, which no forward does (a zero verification would make the deepest
        tree free, every step); None when nothing. The draft's per-level time may be 0: measured within noise."""
        for name, table in (
            ("verify", {(r, s): t for r, by in self.verify.items() for s, t in by.items()}),
            ("draft_read", self.draft_read),
        ):
            if any(t <= 0 for t in table.values()):
                return f"has a {name} time of 0 seconds"
        return None if self.longer is None else self.longer.zero_times()

    def to_json(self) -> dict:
        return {
            "format": COSTS_FORMAT,
            "key": self.key,
            "top_k": self.top_k,
            "device": self.device,
            "dtype": self.dtype,
            "verify": {str(r): {str(s): t for s, t in by.items()} for r, by in self.verify.items()},
            "draft_read": {str(r): t for r, t in self.draft_read.items()},
            "draft_level": {str(r): t for r, t in self.draft_level.items()},
            "slow_rows": sorted(self.slow_rows),
            "context": self.context,
            "longer": None if self.longer is None else self.longer.to_json(),
        }

    @classmethod
    def from_json(cls, data, context: int = CONTEXT_TOKENS) -> StepCosts:
        """The table ``to_json`` wrote, checked: a ValueError says what is wrong with it (a cache file edited, cut,
        or written by something else), so it is measured again rather than steering every step."""
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        for name, kind in (("key", str), ("device", str), ("dtype", str), ("top_k", int), ("context", int)):
            if not isinstance(data.get(name), kind) or isinstance(data.get(name), bool):
                raise ValueError(f"{name!r} is {data.get(name)!r}, not a {kind.__name__}")
        if data["context"] != context:
            raise ValueError(f"a table after {data['context']} tokens where one after {context} belongs")
        rows = _rows_of(data.get("verify"), "verify", lambda by: _times_of(by, "verify"))
        if not rows or any(not by for by in rows.values()):
            raise ValueError("'verify' holds no timings")
        slow = data.get("slow_rows", [])
        if not isinstance(slow, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in slow):
            raise ValueError(f"'slow_rows' is {slow!r}, not a list of row counts")
        longer = data.get("longer")
        return cls(
            key=data["key"],
            top_k=data["top_k"],
            device=data["device"],
            dtype=data["dtype"],
            verify=rows,
            draft_read=_times_of(data.get("draft_read"), "draft_read"),
            draft_level=_times_of(data.get("draft_level"), "draft_level"),
            slow_rows=set(slow),
            context=data["context"],
            longer=None if longer is None else cls.from_json(longer, LONG_CONTEXT_TOKENS),
        )


def _rows_of(value, name: str, each) -> dict:
    """``{count: each(value)}`` from a JSON object whose keys are counts (rows or slots) from 1."""
    if not isinstance(value, dict):
        raise ValueError(f"{name!r} is a JSON {type(value).__name__}, not an object of counts")
    out = {}
    for k, v in value.items():
        if not (k.isdigit() and int(k) >= 1):
            raise ValueError(f"{name!r} has the key {k!r}, not a count")
        out[int(k)] = each(v)
    return out


def _times_of(value, name: str) -> dict[int, float]:
    """``{count: seconds}``, every time a finite number, at least 0."""

    def time_of(t):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"{name!r} holds {t!r}, not a finite time in seconds")
        return float(t)

    return _rows_of(value, name, time_of)


def monotone(verify: dict[int, dict[int, float]]):
    """Make the table non-decreasing in slots and in rows, in place, by lowering a reading to the smallest one of
    more work: noise on a shared machine only adds time, so the lower reading is the truer one."""
    for by_slots in verify.values():
        low = float("inf")
        for s in sorted(by_slots, reverse=True):
            low = by_slots[s] = min(by_slots[s], low)
    rows = sorted(verify, reverse=True)
    for big, small in zip(rows, rows[1:]):
        for s in verify[small]:
            if s in verify[big]:
                verify[small][s] = min(verify[small][s], verify[big][s])


def measured_grid(n: int, cap: int | None = None) -> list[int]:
    """Powers of two from 1 up to the first one >= ``n`` (and up to ``cap``): the rows (or slots) a cost table
    measures."""
    out, x = [1], 1
    while x < n and (cap is None or 2 * x <= cap):
        x *= 2
        out.append(x)
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"{device.type}:{platform.machine()}:{platform.processor() or _cpu_model()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cost_key(target, draft, top_k: int, draft_graph: bool, draft_int8: bool = False) -> str:
    """The identity of a cost table: both models' configs, the tree width, the device, dtype, torch version and
    thread count (a config's hash, not its weights: random weights of one config cost the same)."""
    weight = target.get_input_embeddings().weight
    parts = [
        target.config.to_json_string(use_diff=False),
        draft.config.to_json_string(use_diff=False),
        str(top_k),
        str(draft_graph),
        device_name(weight.device),
        str(weight.dtype),
        torch.__version__,
        str(torch.get_num_threads()),
        str(COSTS_FORMAT),
    ]
    if draft_int8:  # another draft forward (the tables of float32 drafts keep their keys)
        parts.append("draft_int8")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def step_costs(target, draft, config: TreeConfig, rows: int, slots: int, cache: bool = True, refresh: bool = False) -> StepCosts:
    """The cost table for ``config``'s tree width, covering up to ``rows`` rows and ``slots`` slots per row: from
    memory, else from the disk cache, else measured now (and saved). ``cache=False`` measures anew and saves
    nothing; ``refresh=True`` measures anew and replaces what memory and the disk held (a table the run's own step
    times contradict, see ``TreeController.stale``)."""
    key = cost_key(target, draft, config.tree_top_k, config.draft_graph, bool(config.draft_int8))
    path = cost_file(key)
    weight = target.get_input_embeddings().weight
    device, dtype = device_name(weight.device), str(weight.dtype)
    cached = cache and not refresh
    found = _memo.get(key) if cached else None
    if cached and found is None:
        found = _read(path, key, config.tree_top_k, device, dtype)
    if found is not None and found.covers(rows, slots):
        _memo[key] = found
        return found
    costs = found or StepCosts(key=key, top_k=config.tree_top_k, device=device, dtype=dtype, fresh=True)
    if costs.longer is None:
        costs.longer = StepCosts(key=key, top_k=costs.top_k, device=device, dtype=dtype, context=LONG_CONTEXT_TOKENS)
    for table in (costs, costs.longer):
        measure(table, target, draft, config, rows, slots)
    if cache:
        _memo[key] = costs
        _save(costs, path)
    return costs


def cost_file(key: str) -> Path:
    return cache_root() / "tree-costs" / f"{key}.json"


def profile(target, draft, rows: int = 1, do_sample: bool = False) -> StepCosts:
    """The cost table a default (adaptive) run of ``rows`` rows uses on this machine: from the cache, else measured
    now and saved (``eagle3-hub bench --profile`` prints it)."""
    weight = target.get_input_embeddings().weight
    config = TreeConfig().resolve(weight.device, weight.dtype, do_sample, draft.config.draft_vocab_size, batch=rows)
    with PausedFeatureHooks(draft):  # as in a run: hooks of assisted generation would tax every target forward
        return step_costs(target, draft, config, rows, config.total_tokens + config.lookup_tokens + 1)


def _where() -> str:
    return f"the cache folder is $EAGLE3_HUB_CACHE, else $XDG_CACHE_HOME/eagle3_hub; now {cache_root()}"


def _read(path: Path, key: str, top_k: int, device: str, dtype: str) -> StepCosts | None:
    """The table cached at ``path``, or None: missing, or (said in one line) unreadable, of the wrong shape, or
    measured on another device, dtype or tree width; such a table is measured again and replaced."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing cached (a cache folder that cannot be made is said when the table is saved)
    except (OSError, ValueError) as e:
        return _measure_again(path, f"cannot be read ({type(e).__name__}: {e})")
    try:
        if not isinstance(data, dict) or data.get("format") != COSTS_FORMAT:
            raise ValueError(f"not a cost table of format {COSTS_FORMAT}")
        table = StepCosts.from_json(data)
    except ValueError as e:
        return _measure_again(path, str(e))
    if table.zero_times() is not None:
        return _measure_again(path, table.zero_times())
    for name, want in (("key", key), ("top_k", top_k), ("device", device), ("dtype", dtype)):
        for part in (table, table.longer):
            if part is not None and getattr(part, name) != want:
                return _measure_again(path, f"was measured for {name} {getattr(part, name)!r}, not this run's {want!r}")
    return table


def _measure_again(path: Path, why: str) -> None:
    logger.warning("The tree's cost table %s %s: measuring it again and replacing it (%s).", path, why, _where())
    return None


def _save(costs: StepCosts, path: Path):
    """Atomically. A cache that cannot be written is not an error: the table stays in memory for this process
    (measured again by the next one), said once per folder."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            try:
                json.dump(costs.to_json(), f, indent=1)
            except BaseException:
                os.unlink(f.name)
                raise
        os.replace(f.name, path)
    except OSError as e:
        if path.parent not in _unwritable:
            _unwritable.add(path.parent)
            logger.warning(
                "Cannot write the tree's cost table to %s (%s: %s): it is kept in memory for this "
                "process and measured again by the next one; point EAGLE3_HUB_CACHE at a folder you can "
                "write (%s).",
                path,
                type(e).__name__,
                e.strerror or e,
                _where(),
            )


def _timed(fn, device: torch.device, repeats: int = 3) -> float:
    """The fastest of ``repeats`` runs of ``fn`` after one warm-up, synchronised on accelerators."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.inference_mode()
def measure(costs: StepCosts, target, draft, config: TreeConfig, rows: int, slots: int):
    """Fill in ``costs`` for the rows and slots of ``measured_grid(rows)`` x ``measured_grid(slots)`` it lacks,
    after ``costs.context`` tokens."""
    weight = target.get_input_embeddings().weight
    device = weight.device
    vocab = target.config.get_text_config().vocab_size
    k = config.tree_top_k
    gen = torch.Generator().manual_seed(0)
    shape = TreeConfig(
        depth=3,
        tree_top_k=k,
        total_tokens=k,
        lookup_tokens=0,
        min_node_prob=0.0,
        grow_min_prob=0.0,
        draft_graph=config.draft_graph,
        draft_int8=config.draft_int8,
    )
    was_training = (target.training, draft.training)
    target.eval()
    draft.eval()
    try:
        for b in measured_grid(rows, MAX_MEASURED_ROWS):
            by_slots = costs.verify.setdefault(b, {})
            stats = TreeDecodingStats()
            verifier = Verifier(target, draft.config.aux_layer_ids, stats, PhaseClock(stats, device))
            capacity = costs.context + max(measured_grid(slots)) + 8  # the caches grow if a forward needs more
            verifier.start(capacity)
            ids = torch.randint(3, vocab, (b, costs.context), generator=gen).to(device)
            mask = torch.ones_like(ids)
            _, feats, pos, valid = verifier.prefill(ids, mask, b > 1)
            next_pos = pos[:, -1] + 1
            root = ids[:, -1]
            for s in measured_grid(slots):
                if s in by_slots:
                    continue
                if len(by_slots) >= MIN_SLOT_POINTS and by_slots[max(by_slots)] > SLOW_FORWARD_S:
                    costs.slow_rows.add(b)
                    break  # compute-bound from here: extrapolated
                n = s - 1
                node = torch.arange(1, n + 1, device=device)
                tok = torch.randint(3, vocab, (b, n), generator=gen).to(device)
                parent = ((node - 1) // k).expand(b, n)  # a k-ary tree in breadth-first order, as trees are
                level = torch.zeros(n + 1, dtype=torch.long, device=device)
                for j in range(1, n + 1):
                    level[j] = level[(j - 1) // k] + 1
                tree = Tree.build(root, tok, parent, level[1:].expand(b, n), None, int(level.max()))

                def verify(tree=tree):
                    verifier.verify(tree, next_pos, verifier.logits_rows(tree))
                    verifier.cache.rollback()

                by_slots[s] = _timed(verify, device)
            if b in costs.draft_level:
                continue
            drafter = Drafter(draft, target, shape, stats)
            drafter.start(b, capacity + 8 * ACCEPTED_READ + 2 * k)
            drafter.queue(feats, torch.cat([ids[:, 1:], root[:, None]], dim=1), pos, valid)
            drafter.read(b > 1)  # the prompt into the draft's cache
            A = ACCEPTED_READ
            tail = (feats[:, -A:], ids[:, -A:], pos[:, -A:], valid[:, -A:])

            def tree_of(depth):
                drafter.queue(*tail)
                drafter.draft_tree(depth, next_pos, b > 1)

            one, three = _timed(lambda: tree_of(1), device), _timed(lambda: tree_of(3), device)
            costs.draft_read[b] = one
            costs.draft_level[b] = max((three - one) / 2, 0.0)
        monotone(costs.verify)
    finally:
        target.train(was_training[0])
        draft.train(was_training[1])
