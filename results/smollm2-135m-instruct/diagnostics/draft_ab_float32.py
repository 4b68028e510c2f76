"""Two drafts on the same text: tree decoding in float32 (output token for token plain greedy's, so both drafts are
scored on the very same answers), MT-bench first turns, the first ``--per-category`` questions of each category.

In bf16 a draft changes the text it is scored on (outputs part from plain greedy at near-ties), so two drafts'
acceptance on a bf16 bench compares different answers; this one does not. Speed is not measured here (no plain run).

    python results/smollm2-135m-instruct/diagnostics/draft_ab_float32.py NEW_DRAFT OLD_DRAFT --bench-dir ../shared/benchmarks --out DIR

Tree settings: the CPU bf16 default (depth 3, top-k 8, 6 nodes, lookup 20, min_node_prob 0). Writes ab.json and ab.md.
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

TREE = dict(depth=3, tree_top_k=8, total_tokens=6, lookup_tokens=20, min_node_prob=0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new")
    ap.add_argument("old")
    ap.add_argument("--bench-dir", required=True)
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target, tok = load_target(None, dtype=torch.float32)
    drafts = {name: Eagle3DraftModel.from_pretrained(path, target=target).float()
              for name, path in (("new", args.new), ("old", args.old))}
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
            out = generate(target, draft, ids, max_new_tokens=args.max_new_tokens, tokenizer=tok, **TREE)
            outs[name] = out.sequences[0, ids.shape[1]:].tolist()
            row[name] = {"new_tokens": out.stats.new_tokens, "target_forwards": out.stats.target_forwards}
        row["same_text"] = outs["new"] == outs["old"]
        rows.append(row)
    by = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        for key in ("all", r["category"]):
            for name in drafts:
                by[key][name + "_tok"] += r[name]["new_tokens"]
                by[key][name + "_fwd"] += r[name]["target_forwards"]
    table = {k: {name: v[name + "_tok"] / v[name + "_fwd"] for name in drafts} for k, v in by.items()}
    same = sum(r["same_text"] for r in rows)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ab.json").write_text(json.dumps({"new": args.new, "old": args.old, "tree": TREE, "rows": rows,
                                                 "acceptance": table, "same_text": same}, indent=1))
    lines = [f"Mean acceptance length, tree decoding in float32, MT-bench first turns ({len(rows)} questions, "
             f"{args.per_category} per category); identical output for both drafts in {same} of {len(rows)} turns.",
             "", "| | new | old | new - old |", "|---|---|---|---|"]
    for k in ["all"] + sorted(k for k in table if k != "all"):
        lines.append(f"| {k} | {table[k]['new']:.2f} | {table[k]['old']:.2f} | {table[k]['new'] - table[k]['old']:+.2f} |")
    (out_dir / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
