"""The learning curve of a draft: held-out step-1 accuracy and expected acceptance length (greedy, T=0.7, T=1)
against the tokens trained on, read from the ``eval_metrics.json`` that training writes in each work_dir.

Several work_dirs, in order (the stages of a chain), make one curve: each run's tokens continue from the last
evaluation of the run before it. A history written before evaluations recorded their tokens is placed with
``tokens_per_step`` (its step times that number)."""

from __future__ import annotations

import json
from pathlib import Path

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
            points.append(
                {
                    "run": str(path),
                    "tokens": offset + tokens,
                    "step": h["step"],
                    "step1_accuracy": h["step_accuracy"][0],
                    "greedy": h["expected_acceptance_length"],
                    "T=0.7": (h.get("expected_acceptance_length_at") or {}).get("0.7"),
                    "T=1": h.get("expected_acceptance_length_sampled"),
                }
            )
        if points:
            offset = points[-1]["tokens"]
    return points


def plot_curve(points: list[dict], path: str | Path, title: str = "") -> Path:
    """Two panels against training tokens (log axis): step-1 accuracy, and expected acceptance length."""
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise missing_extra("bench", e) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in points if p["tokens"] > 0]  # a log axis has no 0 (a continued draft's score before training)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    x = [p["tokens"] for p in shown]
    left.plot(x, [p["step1_accuracy"] for p in shown], marker="o")
    left.set_ylabel("held-out step-1 accuracy")
    for key in ("greedy", "T=0.7", "T=1"):
        if any(p[key] is not None for p in shown):
            right.plot(x, [p[key] for p in shown], marker="o", label=key)
    right.set_ylabel("expected acceptance length (chain)")
    right.legend()
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def curve_table(points: list[dict]) -> str:
    """A Markdown table of the points."""

    def cell(v):
        return "" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(p[c]) for c in COLUMNS) + " |" for p in points]
    return "\n".join(lines)
