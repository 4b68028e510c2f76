"""Two drafts on the same text: tree decoding in float32 (output token for token plain greedy's, so both drafts are
scored on the very same answers), MT-bench first turns, the first ``--per-category`` questions of each category.

In bf16 a draft changes the text it is scored on (outputs part from plain greedy at near-ties), so two drafts'
acceptance on a bf16 bench compares different answers; this one does not. Speed is not measured here (no plain run).

    python results/smollm2-135m-instruct/diagnostics/draft_ab_float32.py NEW_DRAFT OLD_DRAFT --bench-dir ../shared/benchmarks --out DIR

Tree settings: the CPU bf16 default of session 13 (depth 3, top-k 8, 6 nodes, lookup 20, min_node_prob 0,
grow_min_prob 0); ``--tree key=value,...`` changes it for every arm. ``--arm NAME=DRAFT[:key=value,...]`` (repeatable) adds a further arm: a draft with other tree settings
(for example ``--arm deep=NEW_DRAFT:depth=6,grow_min_prob=0.4`` compares tree shapes on the same text: the output is
plain greedy's whatever the tree). Writes ab.json and ab.md (acceptance per category; draft forwards and float32 ms
per target forward).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
from tqdm import tqdm

from eagle3_hub import Eagle3DraftModel, generate
from eagle3_hub.benchmark.suites import load_suite
from eagle3_hub.targets import load_target

TREE = dict(depth=3, tree_top_k=8, total_tokens=6, lookup_tokens=20, min_node_prob=0.0, grow_min_prob=0.0)


def parse_tree(settings: str, base: dict, where: str) -> dict:
    """``key=value,...`` over ``base`` -> tree settings."""
    tree = dict(base)
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        if key not in TREE:
            raise SystemExit(f"{where}: unknown tree setting {key!r} (one of {', '.join(TREE)})")
        tree[key] = type(TREE[key])(float(value)) if isinstance(TREE[key], int) else float(value)
    return tree


def parse_arm(text: str, base: dict) -> tuple[str, str, dict]:
    """``NAME=DRAFT[:key=value,...]`` -> (name, draft path, tree settings)."""
    name, _, rest = text.partition("=")
    path, _, settings = rest.partition(":")
    return name, path, parse_tree(settings, base, f"--arm {text}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new")
    ap.add_argument("old")
    ap.add_argument("--bench-dir", required=True)
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arm", action="append", default=[], help="NAME=DRAFT[:key=value,...] (repeatable)")
    ap.add_argument("--tree", default="", help="key=value,... over the default tree, for every arm")
    args = ap.parse_args()
    base = parse_tree(args.tree, TREE, f"--tree {args.tree}")
    arms = [("new", args.new, base), ("old", args.old, dict(base))] + [parse_arm(a, base) for a in args.arm]
    torch.set_num_threads(2)
    target, tok = load_target(None, dtype=torch.float32)
    loaded = {path: Eagle3DraftModel.from_pretrained(path, target=target).float() for _, path, _ in arms}
    drafts = {name: loaded[path] for name, path, _ in arms}
    trees = {name: tree for name, _, tree in arms}
    (suite,) = load_suite("mt_bench", args.bench_dir)
    taken = collections.Counter()
    questions = []
    for q in suite.questions:
        if taken[q.category] < args.per_category:
            taken[q.category] += 1
            questions.append(q)
    rows = []
    for q in tqdm(questions, desc="questions"):
        ids = tok.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        row = {"question_id": q.question_id, "category": q.category}
        outs = {}
        for name, draft in drafts.items():
            out = generate(target, draft, ids, max_new_tokens=args.max_new_tokens, tokenizer=tok, **trees[name])
            outs[name] = out.sequences[0, ids.shape[1]:].tolist()
            st = out.stats
            row[name] = {"new_tokens": st.new_tokens, "target_forwards": st.target_forwards,
                         "draft_forwards": st.draft_forwards, "steps": st.steps, "time_s": st.total_time_s}
        row["same_text"] = all(o == outs["old"] for o in outs.values())
        rows.append(row)
    by = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        for key in ("all", r["category"]):
            for name in drafts:
                for field in ("new_tokens", "target_forwards", "draft_forwards", "steps", "time_s"):
                    by[key][name, field] += r[name][field]
    table = {k: {name: v[name, "new_tokens"] / v[name, "target_forwards"] for name in drafts} for k, v in by.items()}
    cost = {name: {"draft_forwards_per_step": by["all"][name, "draft_forwards"] / max(by["all"][name, "steps"], 1),
                   "ms_per_target_forward": 1e3 * by["all"][name, "time_s"] / by["all"][name, "target_forwards"]}
            for name in drafts}
    same = sum(r["same_text"] for r in rows)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ab.json").write_text(json.dumps({"arms": {n: {"draft": p, "tree": t} for n, p, t in arms},
                                                 "new": args.new, "old": args.old, "tree": base, "rows": rows,
                                                 "acceptance": table, "cost": cost, "same_text": same}, indent=1))
    names = list(drafts)
    lines = [f"Mean acceptance length, tree decoding in float32, MT-bench first turns ({len(rows)} questions, "
             f"{args.per_category} per category); identical output in every arm in {same} of {len(rows)} turns.", ""]
    for n, p, t in arms:
        lines.append(f"- {n}: `{p}`, " + ", ".join(f"{k}={v}" for k, v in t.items()))
    lines += ["", "| | " + " | ".join(names) + " | " + " | ".join(f"{n} - old" for n in names if n != "old") + " |",
              "|---|" + "---|" * (2 * len(names) - 1)]
    for k in ["all"] + sorted(k for k in table if k != "all"):
        lines.append(f"| {k} | " + " | ".join(f"{table[k][n]:.2f}" for n in names) + " | "
                     + " | ".join(f"{table[k][n] - table[k]['old']:+.2f}" for n in names if n != "old") + " |")
    lines += ["", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
              "| draft forwards per step | " + " | ".join(f"{cost[n]['draft_forwards_per_step']:.2f}" for n in names) + " |",
              "| float32 ms per target forward | " + " | ".join(f"{cost[n]['ms_per_target_forward']:.1f}" for n in names) + " |"]
    (out_dir / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
