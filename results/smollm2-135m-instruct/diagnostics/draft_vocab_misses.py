"""How often the target's own tokens fall outside a draft vocabulary: tokens a draft can never propose.

Reads the target's greedy answers to the first benchmark turns cached by ``acceptance_by_stage.py``
(``acceptance_by_stage/target_answers.jsonl``; no draft trained on them) and, for the shipped draft and for
vocabularies of several sizes chosen from a training run's data the way the recipe chooses them
(``training.vocab.select_draft_vocab``, the shipped draft's tokens winning ties), prints the share of answer tokens
outside each, per suite, and a few of the missed tokens in context.

    python results/smollm2-135m-instruct/diagnostics/draft_vocab_misses.py --work-dir runs/smollm2-135m-instruct-stage11
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import datasets
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from eagle3_hub.targets import resolve_target
from eagle3_hub.training.vocab import select_draft_vocab, token_counts

HERE = Path(__file__).parent
SUITES = ["mt_bench", "humaneval", "gsm8k"]


def miss_rates(rows: list[dict], in_vocab: torch.Tensor) -> dict[str, float]:
    rates = {}
    for suite in SUITES:
        toks = torch.tensor([t for r in rows if r["suite"] == suite for t in r["input_ids"][r["prompt_tokens"]:]])
        rates[suite] = 1 - in_vocab[toks].float().mean().item()
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="eagle3_hub/reference_draft/smollm2-135m-instruct")
    ap.add_argument("--work-dir", required=True, help="a training run whose data/tokenized/train gives the counts")
    ap.add_argument("--answers", default=str(HERE.parent / "acceptance_by_stage" / "target_answers.jsonl"))
    ap.add_argument("--sizes", default="8192,12288,16384,24576")
    args = ap.parse_args()

    rows = [json.loads(line) for line in open(args.answers)]
    t2d = load_file(str(Path(args.draft) / "model.safetensors"))["t2d"]  # (V,) bool: in the draft vocabulary
    train = datasets.load_from_disk(str(Path(args.work_dir) / "data" / "tokenized" / "train"))
    counts = token_counts(train, t2d.numel())
    tok = AutoTokenizer.from_pretrained(resolve_target(None)[0])  # the embedded target's

    print("answer tokens: " + ", ".join(f"{s} {sum(len(r['input_ids']) - r['prompt_tokens'] for r in rows if r['suite'] == s)}"
                                         for s in SUITES))
    print("| vocabulary | coverage of the run's loss tokens | " + " | ".join(f"{s} outside" for s in SUITES) + " |")
    print("|---|---|" + "---|" * len(SUITES))
    cov = counts[t2d].sum().item() / counts.sum().item()
    print(f"| {args.draft} ({int(t2d.sum())}) | {cov:.2%} | "
          + " | ".join(f"{v:.1%}" for v in miss_rates(rows, t2d).values()) + " |")
    for n in (int(s) for s in args.sizes.split(",")):
        ids, cov = select_draft_vocab(counts, n, always_include=[tok.eos_token_id], prefer=t2d.nonzero().squeeze(1))
        in_vocab = torch.zeros_like(t2d)
        in_vocab[ids] = True
        print(f"| top {n} of the run's data | {cov:.2%} | "
              + " | ".join(f"{v:.1%}" for v in miss_rates(rows, in_vocab).values()) + " |")

    print("\nmissed by the draft, first MT-bench answers (two tokens of context -> the missed token):")
    for r in [r for r in rows if r["suite"] == "mt_bench"][:4]:
        ids = r["input_ids"][r["prompt_tokens"]:]
        missed = [f"{tok.decode(ids[max(0, i - 2):i])!r} -> {tok.decode([t])!r}" for i, t in enumerate(ids) if not t2d[t]]
        print(f"  question {r['question_id']}: " + "; ".join(missed[:8]))


if __name__ == "__main__":
    main()
