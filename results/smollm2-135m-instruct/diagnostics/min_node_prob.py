"""Tree decoding with and without ``min_node_prob`` (leave out the tree nodes whose cumulative draft probability is
below it): tokens/s, ms per step and tokens per step, on the same prompts, alternating the order per prompt so that
a drift of the machine's speed hits every setting. Behind ``TREE_DEFAULTS["cpu"]["min_node_prob"]``.

    python results/smollm2-135m-instruct/diagnostics/min_node_prob.py --prompts FILE --first N --skip S \
        --settings 0,0.05,0.1,0.2 [--draft FOLDER] [--out F]

A setting "P@D/K/N" uses tree depth D, top-k K and N nodes at most instead of the CPU defaults. A setting "P:all" drafts every level even where no deeper node could reach P (``_can_grow`` always true), to
measure what stopping early saves. FILE: a jsonl of {"prompt": ...} (the target's own synthesised prompts under data/) or of {"turns": [...]}
(MT-bench: the first turn). Greedy, 256 new tokens, CPU defaults otherwise (3/4/8, lookup branch 20); every
setting's output must be the same tokens. Results in the diagnostics README.
"""

import argparse
import json
import time
from pathlib import Path

import torch

torch.set_num_threads(2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--first", type=int, default=8)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--settings", default="0,0.05,0.1,0.2")
    ap.add_argument("--draft", default="eagle3_hub/reference_draft/smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from transformers import AutoModel

    from eagle3_hub import generate
    from eagle3_hub.generation import tree_decoding
    from eagle3_hub.targets import load_target

    target, tok = load_target(None)[:2]
    draft = AutoModel.from_pretrained(args.draft, target=target)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    rows = rows[args.skip : args.skip + args.first]
    settings = args.settings.split(",")
    can_grow = tree_decoding._TreeDecoder._can_grow
    totals = {p: {"new_tokens": 0, "time_s": 0.0, "steps": 0, "draft_forwards": 0} for p in settings}
    for i, row in enumerate(rows):
        text = row["prompt"] if "prompt" in row else row["turns"][0]
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        ref = None
        for p in settings if i % 2 == 0 else settings[::-1]:
            spec, _, shape = p.partition("@")
            prob, _, every = spec.partition(":")
            tree = dict(zip(("depth", "tree_top_k", "total_tokens"), map(int, shape.split("/")))) if shape else {}
            tree_decoding._TreeDecoder._can_grow = (lambda self, f_score: True) if every else can_grow
            t0 = time.perf_counter()
            out = generate(target, draft, ids, max_new_tokens=args.max_new_tokens, min_node_prob=float(prob), **tree)
            elapsed = time.perf_counter() - t0
            tree_decoding._TreeDecoder._can_grow = can_grow
            ref = out.sequences if ref is None else ref
            assert torch.equal(ref, out.sequences), f"prompt {i}: min_node_prob={p} changed the output"
            t = totals[p]
            t["new_tokens"] += out.stats.new_tokens
            t["time_s"] += elapsed
            t["steps"] += out.stats.steps
            t["draft_forwards"] += out.stats.draft_forwards
        print(f"prompt {i + 1}/{len(rows)} done", flush=True)
    base = totals[settings[0]]
    result = {}
    for p, t in totals.items():
        result[p] = {
            "tok_s": t["new_tokens"] / t["time_s"],
            "ms_per_step": 1e3 * t["time_s"] / t["steps"],
            "tokens_per_step": t["new_tokens"] / t["steps"],
            "draft_forwards_per_step": t["draft_forwards"] / t["steps"],
            "vs_first_setting": (t["new_tokens"] / t["time_s"]) / (base["new_tokens"] / base["time_s"]),
        }
        r = result[p]
        print(f"min_node_prob {p}: {r['tok_s']:.1f} tok/s ({r['vs_first_setting']:.3f}x), {r['ms_per_step']:.1f} ms/step, "
              f"{r['tokens_per_step']:.2f} tokens/step, {r['draft_forwards_per_step']:.2f} draft forwards/step")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "result": result}, indent=1))


if __name__ == "__main__":
    main()
