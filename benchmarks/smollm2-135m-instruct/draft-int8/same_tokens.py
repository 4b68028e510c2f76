"""The shipped SmolLM2 draft in float32 and through ``draft_int8`` (``fast_paths.int8_draft``) on the same tokens:
text the target samples for unseen prompts (top-p 0.9, 128 tokens), the draft teacher-forced on it. Per position,
the chance that one child drawn from the draft (at 0.6x the temperature, as tree decoding draws) is accepted,
``sum min(p, q)`` over the draft vocabulary, and whether the draft's top token is the target's. Prints a table and
writes same_tokens.json beside this file.

python benchmarks/smollm2-135m-instruct/draft-int8/same_tokens.py [--prompts 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from eagle3_hub import Eagle3DraftModel, load_target, reference_draft
from eagle3_hub.generation.tree.drafting import DRAW_TEMPERATURE_SHARE
from eagle3_hub.generation.tree.fast_paths import int8_draft

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "drawn-children"))
from first_level import PROMPTS, positions  # noqa: E402  (the sampled text and the teacher-forced logits)


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    args = ap.parse_args()
    target, tokenizer = load_target()
    draft = Eagle3DraftModel.from_pretrained(reference_draft(), target=target).float().eval()
    drafts = {"float32": draft, "int8": int8_draft(draft)}
    target_ids = draft.draft_to_target_ids(torch.arange(draft.d2t.numel()))
    prompts = [json.loads(line)["turns"][0] for line in PROMPTS.read_text().splitlines()[: args.prompts]]
    sums: dict[str, list[float]] = {}
    for temperature in (0.7, 1.0):
        for seed, prompt in enumerate(prompts):
            for name, d in drafts.items():  # the same seed samples the same text for each draft
                q_logits, p_logits = positions(target, d, tokenizer, prompt, temperature, seed)
                p = torch.softmax(p_logits / temperature, -1)[:, target_ids]
                q = torch.softmax(q_logits / (temperature * DRAW_TEMPERATURE_SHARE), -1)
                top = target_ids[q_logits.argmax(-1)] == p_logits.argmax(-1)
                acc = sums.setdefault(f"T={temperature:g} {name}", [0.0, 0.0, 0])
                acc[0] += float(torch.minimum(p, q).sum())
                acc[1] += float(top.sum())
                acc[2] += q.shape[0]
    table = {k: {"drawn_child_accepted": a / n, "top_token_matches": t / n, "positions": n} for k, (a, t, n) in sums.items()}
    (HERE / "same_tokens.json").write_text(json.dumps(table, indent=1) + "\n")
    print("| draft | one drawn child accepted | top token = target's | positions |\n|---|---|---|---|")
    for k, r in table.items():
        print(f"| {k} | {r['drawn_child_accepted']:.4f} | {r['top_token_matches']:.4f} | {r['positions']} |")


if __name__ == "__main__":
    main()
