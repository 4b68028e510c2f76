"""What a bench run measured, turn by turn (``TurnRecord``), and its summaries: rows per suite, mode, batch size
and method (``summarize``), the greedy outputs checked against plain greedy (``lossless_check``), and tree settings
ranked (``sweep_summary``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..repetition import repeated_ngrams
from .options import SAME_FORWARD


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
    batch: int = 1  # prompts run together; a batch's time goes to its rows in equal shares
    tree: dict | None = None  # tree decoding's shape in this run (defaults differ by mode and batch size)
    tree_steps: dict | None = None  # adaptive tree: steps per shape the controller chose (first row of a batch)

    def to_json(self, with_outputs: bool = False) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("output_ids", "prompt_ids")}
        if with_outputs:
            d["output_ids"] = self.output_ids
        return d


def histogram(accepted: list[int]) -> list[int]:
    hist = [0] * (max(accepted) + 1 if accepted else 1)
    for a in accepted:
        hist[a] += 1
    return hist


def _summed_steps(rs: list[TurnRecord]) -> dict[str, int] | None:
    """The adaptive tree's steps per chosen shape over ``rs`` (None: a fixed shape, or no tree)."""
    total: dict[str, int] = {}
    for r in rs:
        for label, n in (r.tree_steps or {}).items():
            total[label] = total.get(label, 0) + n
    return total or None


def summarize(records: list[TurnRecord], plain_name: str = "plain") -> list[dict]:
    """Per (suite, mode, batch size, method), and per (mode, batch size, method) over all suites as suite '_all'."""
    groups: dict[tuple, list[TurnRecord]] = {}
    for r in records:
        groups.setdefault((r.suite, r.mode, r.batch, r.method), []).append(r)
        groups.setdefault(("_all", r.mode, r.batch, r.method), []).append(r)
    rows = []
    for (suite, mode, batch, method), rs in groups.items():
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
            by_pos = (
                None if method in (plain_name, SAME_FORWARD) else [sum(hist[k:]) / steps for k in range(1, max(len(hist), 2))]
            )
        else:
            forwards = sum(r.target_forwards for r in rs)
            tau = tokens / forwards if forwards else None
            by_pos = None
        rows.append(
            {
                "suite": suite,
                "mode": mode,
                "batch": batch,
                "method": method,
                "turns": len(rs),
                "questions": len({(r.suite, r.question_id) for r in rs}),
                "new_tokens": tokens,
                "time_s": round(t, 4),
                "tokens_per_s": tokens / t if t > 0 else None,
                "mean_acceptance_length": tau,
                "acceptance_by_position": by_pos,
                "time_split": {
                    "draft": draft_t / t if t else None,
                    "verify": verify_t / t if t else None,
                    "overhead": max(t - draft_t - verify_t, 0.0) / t if t else None,
                },
                "peak_memory_mb": max(r.peak_memory_mb for r in rs),
                "tree": rs[0].tree,
                "tree_steps": _summed_steps(rs),
                "target_forwards": sum(r.target_forwards for r in rs),
                # the share of the outputs' 8-grams that repeat an earlier one of the same output: text that loops
                "loop_share": _loop_share(rs),
            }
        )
    by_key = {(r["suite"], r["mode"], r["batch"], r["method"]): r for r in rows}

    def ratio(r, base_name):
        base = by_key.get((r["suite"], r["mode"], r["batch"], base_name))
        return r["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] and r["tokens_per_s"] else None

    for r in rows:
        r["speedup"] = ratio(r, plain_name)  # over transformers' generate
        r["speedup_same_forward"] = ratio(r, SAME_FORWARD)  # over the same forward without speculation
        kind, shape = re.match(r"(tree|oracle)?(\[[^\]]*\])?", r["method"]).groups()
        if kind == "oracle":  # its speed means nothing: each tree level runs the target
            r["speedup"] = r["speedup_same_forward"] = None
        elif kind == "tree":  # the draft's share of what a perfect draft reaches with the same tree shape
            oracle = by_key.get((r["suite"], r["mode"], r["batch"], "oracle" + (shape or "")))
            if oracle and oracle["mean_acceptance_length"] and r["mean_acceptance_length"]:
                r["oracle_share"] = r["mean_acceptance_length"] / oracle["mean_acceptance_length"]
    return rows


def _loop_share(records: list[TurnRecord]) -> float | None:
    repeated, total = repeated_ngrams([r.output_ids for r in records if r.output_ids])
    return repeated / total if total else None


def lossless_check(records: list[TurnRecord], tokenizer, plain_name: str = "plain", near_ties: dict | None = None) -> dict:
    """Greedy outputs of every method against plain greedy, turn by turn. ``near_ties`` (reduced precision:
    ``near_ties.near_tie_check``): a method whose outputs differ is still lossless where every token it emitted
    is the float32 target's choice up to a near-tie; each entry then carries its own and plain's scores."""
    plain = {(r.suite, r.question_id, r.turn, r.batch): r for r in records if r.mode == "greedy" and r.method == plain_name}
    report: dict[str, dict] = {}
    for r in records:
        if r.mode != "greedy" or r.method == plain_name:
            continue
        p = plain.get((r.suite, r.question_id, r.turn, r.batch))
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
                "suite": r.suite,
                "question_id": r.question_id,
                "turn": r.turn,
                "batch": r.batch,
                "first_difference": first,
                "plain": tokenizer.decode(p.output_ids[max(0, first - 8) : first + 12]),
                "method": tokenizer.decode(r.output_ids[max(0, first - 8) : first + 12]),
            }
        )
    for method, entry in report.items():
        entry["lossless"] = entry["identical"] == entry["turns"]
        if near_ties is not None and method in near_ties:
            entry["near_ties"] = near_ties[method]
            entry["plain_near_ties"] = near_ties.get(plain_name)
            entry["lossless"] = entry["lossless"] or near_ties[method]["within_tolerance"]
    return report


def sweep_summary(rows: list[dict], methods: list) -> dict:
    """Tree settings ranked by overall speed-up (all suites), per mode."""
    params = {m.name: m.tree_params for m in methods if m.kind == "tree"}
    out = {}
    for mode, batch in sorted({(r["mode"], r.get("batch", 1)) for r in rows}):
        ranked = sorted(
            (
                r
                for r in rows
                if r["suite"] == "_all" and r["mode"] == mode and r.get("batch", 1) == batch and r["method"] in params
            ),
            key=lambda r: -(r["speedup"] or 0),
        )
        out[mode if batch == 1 else f"{mode}, batch {batch}"] = {
            "ranking": [
                {
                    **params[r["method"]],
                    "method": r["method"],
                    "speedup": r["speedup"],
                    "tokens_per_s": r["tokens_per_s"],
                    "mean_acceptance_length": r["mean_acceptance_length"],
                }
                for r in ranked
            ],
            "best": {**params[ranked[0]["method"]], "speedup": ranked[0]["speedup"]} if ranked else None,
        }
    return out
