"""The learning curve of a draft: held-out step-1 accuracy and expected acceptance length (greedy, T=0.7, T=1)
against the tokens trained on, read from the ``eval_metrics.json`` that training writes in each work_dir.

Several work_dirs, in order (the stages of a chain), make one curve: each run's tokens continue from the last
evaluation of the run before it. A history written before evaluations recorded their tokens is placed with
``tokens_per_step`` (its step times that number). A finished draft's ``training_metrics.json`` gives the curve of
the chain that made it (``chain_points``): one point per earlier stage, then its last stage's evaluations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..extras import missing_extra

COLUMNS = ("tokens", "step", "step1_accuracy", "greedy", "T=0.7", "T=1")


def read_history(path: str | Path) -> list[dict]:
    """The evaluations of a work_dir (or of an ``eval_metrics.json`` file)."""
    path = Path(path)
    file = path / "eval_metrics.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"{file} not found: give a training work_dir (it writes eval_metrics.json at each evaluation) or the file itself"
        )
    return json.loads(file.read_text())["eval_history"]


def evaluation_point(run: str, tokens: float, h: dict) -> dict:
    """One evaluation of ``eval_history`` as a curve row (a value the evaluation lacks is None)."""
    return {
        "run": run,
        "tokens": tokens,
        "step": h["step"],
        "step1_accuracy": h["step_accuracy"][0],
        "greedy": h["expected_acceptance_length"],
        "T=0.7": (h.get("expected_acceptance_length_at") or {}).get("0.7"),
        "T=1": h.get("expected_acceptance_length_sampled"),
    }


def curve_points(paths: list[str | Path], tokens_per_step: float | None = None) -> list[dict]:
    """One row per evaluation over the runs of ``paths`` in order: {run, tokens, step, step1_accuracy, greedy,
    "T=0.7", "T=1"} (a value the evaluation lacks is None)."""
    points, offset = [], 0
    for path in paths:
        history = read_history(path)
        for h in history:
            if "tokens" not in h and tokens_per_step is None:
                raise ValueError(
                    f"{path}: its evaluations do not record their tokens (an older run): pass "
                    "tokens_per_step (--tokens-per-step), e.g. batch_size x grad_accum x mean sample length"
                )
            tokens = h["tokens"] if "tokens" in h else h["step"] * tokens_per_step
            points.append(evaluation_point(str(path), offset + tokens, h))
        if points:
            offset = points[-1]["tokens"]
    return points


def chain_points(draft_dir: str | Path, tokens_per_step: float) -> list[dict]:
    """The chain of stages that made a draft, from its ``training_metrics.json``: each earlier stage's final greedy
    expected acceptance (the stages record no other metric), then the last stage's evaluations. Tokens are the
    steps so far times ``tokens_per_step`` (the metrics record steps and batch sizes, not tokens)."""
    file = Path(draft_dir) / "training_metrics.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: give a draft folder written by `eagle3-hub train`")
    metrics = json.loads(file.read_text())
    points, steps = [], 0
    for i, stage in enumerate(metrics.get("earlier_stages", []), 1):
        steps += stage["steps"]
        none = dict.fromkeys(("step1_accuracy", "T=0.7", "T=1"))
        points.append(
            {
                "run": f"stage {i}",
                "tokens": round(steps * tokens_per_step),
                "step": stage["steps"],
                "greedy": stage["expected_acceptance_length"],
                **none,
            }
        )
    last = len(points) + 1
    for h in metrics["eval_history"]:
        points.append(evaluation_point(f"stage {last}", round((steps + h["step"]) * tokens_per_step), h))
    return points


def log_fit(points: list[dict], key: str = "greedy", last: int = 4) -> tuple[float, float]:
    """(a, b) of ``key = a + b * log10(tokens)`` by least squares over the ``last`` points with a value: where the
    curve stands and how much each tenfold of tokens adds."""
    pts = [(math.log10(p["tokens"]), p[key]) for p in points if p["tokens"] > 0 and p[key] is not None][-last:]
    if len(pts) < 2:
        raise ValueError(f"a fit needs at least two points with {key!r}, got {len(pts)}")
    b, a = np.polyfit(*zip(*pts), deg=1)
    return float(a), float(b)


def _panels():
    """pyplot (headless), a figure and its two panels against training tokens on a log axis: step-1 accuracy, and
    expected acceptance length."""
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise missing_extra("bench", e) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, LogLocator, NullFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.set_ylabel("held-out step-1 accuracy")
    right.set_ylabel("expected acceptance length (chain)")
    for ax in (left, right):
        ax.set_xscale("log")
        # 10k, 20k, 50k, ...: a run of less than a decade gets labels, and minor labels never overlap
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("training tokens")
        ax.grid(True, which="both", alpha=0.3)
    return plt, fig, (left, right)


def _save(plt, fig, path: str | Path, title: str) -> Path:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_curve(
    points: list[dict], path: str | Path, title: str = "", others: dict[str, list[dict]] | None = None, label: str = ""
) -> Path:
    """Two panels against training tokens (log axis): step-1 accuracy, and expected acceptance length; ``others``:
    more curves by name, dashed (``label`` names ``points`` beside them)."""
    plt, fig, (left, right) = _panels()
    colors = {"greedy": "C0", "T=0.7": "C1", "T=1": "C2"}
    # the runs asked for in full lines, each other curve (e.g. the chain of a shipped draft) dashed, "+" markers
    for name, series, style in [(label, points, "o-")] + [(k, v, "+--") for k, v in (others or {}).items()]:
        shown = [p for p in series if p["tokens"] > 0]  # a log axis has no 0 (a continued draft before training)
        suffix = f" ({name})" if name else ""
        acc = [p for p in shown if p["step1_accuracy"] is not None]
        if acc:
            left.plot([p["tokens"] for p in acc], [p["step1_accuracy"] for p in acc], style, color="C0", label=name or None)
        for key in ("greedy", "T=0.7", "T=1"):
            with_key = [p for p in shown if p[key] is not None]
            if with_key:
                right.plot(
                    [p["tokens"] for p in with_key], [p[key] for p in with_key], style, color=colors[key], label=key + suffix
                )
    right.legend(fontsize="small")
    if others:
        left.legend(fontsize="small")
    return _save(plt, fig, path, title)


def plot_arms(arms: dict[str, list[dict]], path: str | Path, title: str = "") -> Path:
    """Training choices side by side against tokens (log axis), one colour per arm: step-1 accuracy, and expected
    acceptance length greedy (full) and at T=1 (dashed)."""
    plt, fig, (left, right) = _panels()
    for i, (name, series) in enumerate(arms.items()):
        shown = [p for p in series if p["tokens"] > 0]
        x = [p["tokens"] for p in shown]
        left.plot(x, [p["step1_accuracy"] for p in shown], "o-", color=f"C{i}", label=name)
        right.plot(x, [p["greedy"] for p in shown], "o-", color=f"C{i}", label=f"{name}, greedy")
        sampled = [p for p in shown if p["T=1"] is not None]
        right.plot([p["tokens"] for p in sampled], [p["T=1"] for p in sampled], "+--", color=f"C{i}", label=f"{name}, T=1")
    left.legend(fontsize="small")
    right.legend(fontsize="x-small")
    return _save(plt, fig, path, title)


def arms_table(arms: dict[str, list[dict]]) -> str:
    """A Markdown table of the arms at the steps every arm was evaluated at: step-1 accuracy / greedy / T=1."""
    steps = sorted(set.intersection(*({p["step"] for p in series} for series in arms.values())))
    lines = ["| step | " + " | ".join(arms) + " |", "|" + "---|" * (len(arms) + 1)]
    for step in steps:
        cells = []
        for series in arms.values():
            p = next(p for p in series if p["step"] == step)
            t1 = "-" if p["T=1"] is None else f"{p['T=1']:.3f}"
            cells.append(f"{p['step1_accuracy']:.3f} / {p['greedy']:.3f} / {t1}")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_table(points: list[dict]) -> str:
    """A Markdown table of the points."""

    def cell(v):
        return "" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(p[c]) for c in COLUMNS) + " |" for p in points]
    return "\n".join(lines)
