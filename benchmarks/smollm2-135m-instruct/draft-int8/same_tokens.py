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
from pathlib import Path

import torch

from eagle3_hub import Eagle3DraftModel, load_target, reference_draft
from eagle3_hub.generation.tree.drafting import DRAW_TEMPERATURE_SHARE
from eagle3_hub.generation.tree.fast_paths import int8_draft

HERE = Path(__file__).parent
PROMPTS = HERE.parent / "stage12" / "unseen_16.jsonl"


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
            enc = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            torch.manual_seed(seed)
            ids = target.generate(**enc, do_sample=True, temperature=temperature, top_p=0.9, max_new_tokens=128)
            out = target(input_ids=ids, output_hidden_states=True)
            aux = torch.cat([out.hidden_states[i + 1] for i in draft.config.aux_layer_ids], dim=-1)
            s, start = ids.shape[1], enc["input_ids"].shape[1] - 1
            p = torch.softmax(out.logits[0, start + 1 : s - 1].float() / temperature, -1)[:, target_ids]
            for name, d in drafts.items():
                # the draft at position t reads the features of t and token t + 1 and proposes token t + 2
                logits = d(input_ids=ids[:, 1:], target_hidden_states=aux[:, :-1], position_ids=torch.arange(s - 1)[None])
                q_logits = logits.logits[0, start : s - 2].float()
                q = torch.softmax(q_logits / (temperature * DRAW_TEMPERATURE_SHARE), -1)
                top = target_ids[q_logits.argmax(-1)] == out.logits[0, start + 1 : s - 1].argmax(-1)
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
