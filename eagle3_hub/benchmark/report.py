"""Rendering bench results: a Markdown table, the JSON file, and a PNG chart (matplotlib)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..atomic import atomic_path, atomic_write_text
from ..extras import missing_extra
from ..repetition import LOOP_NGRAM, LOOP_SHARE_FLAG
from .machine import describe_machine

METHOD_ORDER = ("plain", "same_forward", "lookup", "assistant", "assisted", "tree", "oracle")


def _fmt(x, spec: str, missing: str = "–") -> str:
    return missing if x is None else format(x, spec)


def row_sort_key(row: dict) -> tuple:
    """Suites in name order, 'all suites' last; greedy first; methods from plain to tree."""
    kind = re.split(r"[\[@]", row["method"])[0]  # tree[depth=3], tree@other-draft: tree
    return (
        row["suite"] == "_all",
        row["suite"],
        row["mode"] != "greedy",
        row["mode"],
        row.get("batch", 1),
        METHOD_ORDER.index(kind) if kind in METHOD_ORDER else len(METHOD_ORDER),
        row["method"],
    )


def acceptance_text(by_pos: list[float] | None, max_positions: int = 5) -> str:
    if not by_pos:
        return "–"
    return " / ".join(f"{p:.2f}" for p in by_pos[:max_positions])


def lossless_text(entry: dict, suite: str = "_all") -> str:
    """The greedy check of one method (``records.lossless_check``), over all suites or one of them: identical to
    plain greedy, or (reduced precision) parted from it only at near-ties, or not."""
    e = entry["by_suite"].get(suite, entry) if suite != "_all" else entry
    differ = e["turns"] - e["identical"]
    if not differ:
        return "yes"
    near = entry.get("near_ties")
    if entry["lossless"] and near:
        plain = entry.get("plain_near_ties") or {}
        if suite != "_all":  # the suite's own figures where the check kept them
            near = near.get("by_suite", {}).get(suite, near)
            plain = plain.get("by_suite", {}).get(suite, plain)
        return (
            f"yes, up to near-ties ({differ} of {e['turns']} turns part at one; largest float32 gap "
            f"{near['max_gap']:.2f}, plain's {plain.get('max_gap', float('nan')):.2f})"
        )
    return f"NO ({differ} of {e['turns']} turns differ)"


def loop_text(share: float | None) -> str:
    """A row's loop share, flagged where its outputs loop (speed-ups there measure copying, not drafting)."""
    if share is None:
        return "–"
    return f"{share:.2f}" + (" LOOPS" if share > LOOP_SHARE_FLAG else "")


def markdown_table(results: dict) -> str:
    """One row per suite, mode and method; 'all suites' rows pool every suite when there are several."""
    lossless = results.get("lossless", {})
    rows = sorted(results["results"], key=row_sort_key)
    if len({r["suite"] for r in rows}) <= 2:  # a single suite: the '_all' rows repeat it
        rows = [r for r in rows if r["suite"] != "_all"]
    # a second baseline when the run has it: plain decoding through tree decoding's own forward
    with_same = any(r.get("speedup_same_forward") is not None for r in rows)
    batched = any(r.get("batch", 1) > 1 for r in rows)
    with_oracle = any(r.get("oracle_share") is not None for r in rows)
    header = (
        ["Suite", "Mode"]
        + (["Batch"] if batched else [])
        + ["Method", "Tokens/s", "Speed-up"]
        + (["vs same forward"] if with_same else [])
        + ["Accept. length"]
        + (["Of perfect draft"] if with_oracle else [])
        + ["Accepted at draft pos. 1/2/3/…", "Draft / verify / other", "Peak MB", "Loop share", "Lossless"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        split = r["time_split"]
        if r["mode"] != "greedy" or r["method"] == "plain" or r["method"] not in lossless:
            same = "–"
        else:
            same = lossless_text(lossless[r["method"]], r["suite"])
        cells = [
            "all suites" if r["suite"] == "_all" else r["suite"],
            r["mode"],
            *([str(r.get("batch", 1))] if batched else []),
            r["method"],
            "–" if r["method"].startswith("oracle") else _fmt(r["tokens_per_s"], ".1f"),
            _fmt(r["speedup"], ".2f") + ("×" if r["speedup"] is not None else ""),
            *(
                [_fmt(r.get("speedup_same_forward"), ".2f") + ("×" if r.get("speedup_same_forward") is not None else "")]
                if with_same
                else []
            ),
            _fmt(r["mean_acceptance_length"], ".2f"),
            *([_fmt(r.get("oracle_share"), ".0%")] if with_oracle else []),
            acceptance_text(r["acceptance_by_position"]),
            "–"
            if split["verify"] is None
            else f"{100 * split['draft']:.0f}% / {100 * split['verify']:.0f}% / {100 * split['overhead']:.0f}%",
            _fmt(r["peak_memory_mb"], ".0f"),
            loop_text(r.get("loop_share")),
            same,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


SWEEP_COLUMNS = ("depth", "tree_top_k", "total_tokens", "lookup_tokens", "min_node_prob", "grow_min_prob", "draft_sampling")


def sweep_table(results: dict, limit: int = 10) -> str:
    lines = []
    for mode, sweep in (results.get("sweep") or {}).items():
        lines.append(f"Tree settings, {mode}, best first:\n")
        lines.append("| " + " | ".join(SWEEP_COLUMNS) + " | Speed-up | Tokens/s | Accept. length |")
        lines.append("|" + "---|" * (len(SWEEP_COLUMNS) + 3))
        for r in sweep["ranking"][:limit]:
            lines.append(
                "| "
                + " | ".join(str(r.get(k, "default")) for k in SWEEP_COLUMNS)
                + f" | {_fmt(r['speedup'], '.2f')}× | {_fmt(r['tokens_per_s'], '.1f')} | {_fmt(r['mean_acceptance_length'], '.2f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def markdown_report(results: dict) -> str:
    s = results["settings"]
    parts = [
        "# eagle3-hub bench",
        "",
        f"Target: `{s.get('target')}`  Draft: `{s.get('draft')}`  ",
        f"Machine: {describe_machine(results['machine'])}  ",
        "Suites: " + ", ".join(f"{x['name']} ({x['questions']} questions)" for x in s["suites"]) + "; "
        f"{'every row' if s.get('ignore_eos') else 'max'} {s['max_new_tokens']} new tokens per turn"
        + (" (past the end-of-sequence token)" if s.get("ignore_eos") else "")
        + (f", first {s['max_turns']} turn(s) of each question" if s.get("max_turns") else "")
        + "; speed-up over plain decoding (transformers' `generate`) in the same run"
        + (
            "; 'vs same forward': over plain decoding through the target forward and head that tree decoding "
            "verifies with (what speculation alone buys)."
            if any(r.get("speedup_same_forward") for r in results["results"])
            else "."
        ),
        "",
        markdown_table(results),
        "",
    ]
    parts += [
        f"Loop share: the share of each output's {LOOP_NGRAM}-grams that repeat an earlier one of the same "
        f"output; LOOPS above {LOOP_SHARE_FLAG:g}: the outputs loop, and a speed-up there measures copying the "
        "loop (prompt lookup and the tree's lookup branch do), not drafting.",
        "",
    ]
    adaptive = [r for r in sorted(results["results"], key=row_sort_key) if r.get("tree_steps") and r["suite"] != "_all"]
    if adaptive:
        parts += [
            "Adaptive tree: steps per shape it chose (depth/children/nodes; none: one token per row through the same forward):",
            "",
        ]
        parts += [
            f"- {r['suite']}, {r['mode']}"
            + (f", batch {r['batch']}" if r.get("batch", 1) > 1 else "")
            + f", {r['method']}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["tree_steps"].items(), key=lambda kv: -kv[1]))
            for r in adaptive
        ]
        parts += [""]
    if any(r["method"].startswith("oracle") for r in results["results"]):
        parts += [
            "`oracle`: the target proposes each node's children itself (its own most probable tokens), in the "
            "same tree shape and walk: the acceptance a perfect draft would reach. It measures acceptance only; "
            "its speed means nothing (each tree level runs the target). 'Of perfect draft': a tree method's "
            "acceptance length over the oracle's with the same shape.",
            "",
        ]
    if results.get("sweep"):
        parts += [sweep_table(results), ""]
    return "\n".join(parts)


def plot_chart(results: dict, path: str | Path) -> Path:
    """Left: speed-up per suite and method. Right: acceptance rate by draft position."""
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise missing_extra("bench", e) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smallest = min(r.get("batch", 1) for r in results["results"])
    rows = [r for r in results["results"] if r.get("batch", 1) == smallest]
    rows = [r for r in rows if r["mode"] == "greedy"] or rows
    mode = rows[0]["mode"]
    suites = sorted({r["suite"] for r in rows}, key=lambda s: (s == "_all", s))
    if len(suites) == 2:
        suites = [s for s in suites if s != "_all"]
    methods = sorted(
        {r["method"] for r in rows if r["method"] != "plain"}, key=lambda m: row_sort_key({"suite": "", "mode": "", "method": m})
    )
    by_key = {(r["suite"], r["method"]): r for r in rows}

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(suites))]
        ys = [(by_key.get((s, m)) or {}).get("speedup") or 0 for s in suites]
        bars = ax1.bar(xs, ys, width, label=m)
        ax1.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax1.axhline(1.0, color="grey", lw=1, ls="--")
    ax1.set_xticks(range(len(suites)), ["all suites" if s == "_all" else s for s in suites], rotation=20)
    ax1.set_ylabel(f"speed-up over plain ({mode})")
    ax1.set_title("Speed-up per suite")
    ax1.legend(fontsize=8)

    drawn = False
    for m in methods:
        r = by_key.get(("_all", m)) or by_key.get((suites[0], m))
        pos = r and r.get("acceptance_by_position")
        if pos:
            ax2.plot(range(1, len(pos) + 1), pos, marker="o", label=f"{m} (τ={r['mean_acceptance_length']:.2f})")
            drawn = True
    ax2.set_xlabel("draft position k")
    ax2.set_ylabel("fraction of steps accepting ≥ k draft tokens")
    ax2.set_ylim(0, 1.02)
    ax2.set_title("Acceptance by draft position")
    if drawn:
        ax2.legend(fontsize=8)
    fig.suptitle(describe_machine(results["machine"]), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path, suffix=path.suffix) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path


def write_report(results: dict, out_dir: str | Path, chart: bool = True) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "markdown": out / "bench.md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=1, default=str) + "\n")
    atomic_write_text(paths["markdown"], markdown_report(results))
    if chart:
        paths["chart"] = plot_chart(results, out / "bench.png")
    return paths


def print_report(results: dict, paths: dict | None = None, file=None):
    file = file or sys.stdout
    print(markdown_report(results), file=file)
    bad = {m: e for m, e in results.get("lossless", {}).items() if not e["lossless"]}
    for method, e in bad.items():
        banner = (
            f"LOSSLESS CHECK FAILED: greedy '{method}' differs from plain greedy on "
            f"{e['turns'] - e['identical']} of {e['turns']} turns."
        )
        first = e["mismatches"][0]
        near = e.get("near_ties")
        if near:
            w = near["worst"] or {}
            banner += (
                f" {near['over_tolerance']} of {near['tokens']} tokens are the target's choice up to a near-tie in "
                f"neither float32 nor its own dtype (largest float32 gap {near['max_gap']:.3f} at suite {w.get('suite')}, "
                f"question {w.get('question_id')}, turn {w.get('turn')}, token {w.get('token')}; tolerance "
                f"{w.get('tolerance', 0):.3f}; its gap in the target's dtype {w.get('own_gap', float('nan')):.3f}, "
                f"tolerance {w.get('own_tolerance', float('nan')):.3f})."
            )
        detail = (
            f"  first: suite {first['suite']}, question {first['question_id']}, turn {first['turn']}, token "
            f"{first['first_difference']}:\n    plain : {first['plain']!r}\n    {method:6s}: {first['method']!r}\n"
            f"  In float32 outputs must be identical; in bfloat16/float16 verifying several tokens at once can round "
            f"near-ties differently."
        )
        print("\n" + "!" * len(banner) + f"\n{banner}\n" + "!" * len(banner) + "\n" + detail, file=file)
    if paths:
        print("\nWrote " + ", ".join(str(p) for p in paths.values()), file=file)
