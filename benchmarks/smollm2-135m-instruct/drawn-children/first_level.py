"""First-level acceptance of the shipped SmolLM2 draft on text the target samples: k children as the draft's top-k
tokens (one-hot proposals: the target's mass on them) against k children drawn from the draft without replacement
at a share of the sampling temperature (recursive rejection sampling, ``acceptance.proposal_level``), on the same
positions. Writes first_level.json beside this file and prints a table.

python benchmarks/smollm2-135m-instruct/drawn-children/first_level.py [--prompts 8] [--draws 16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from eagle3_hub import Eagle3DraftModel, load_target, reference_draft
from eagle3_hub.generation.tree.acceptance import proposal_level
from eagle3_hub.generation.tree.drafting import Drafter
from eagle3_hub.generation.tree.nucleus import Nucleus
from eagle3_hub.generation.tree.verification import Proposal

HERE = Path(__file__).parent
PROMPTS = HERE.parent / "stage12" / "unseen_16.jsonl"
SHARES = (0.4, 0.6, 0.8, 1.0)
K = 4


def positions(target, draft, tokenizer, prompt: str, temperature: float, seed: int):
    """The target's sampled answer (top-p 0.9, 128 tokens); per answer position after the first, the draft's logits
    for it (teacher-forced: the target's features and the token before) and the target's logits."""
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    torch.manual_seed(seed)
    ids = target.generate(**enc, do_sample=True, temperature=temperature, top_p=0.9, max_new_tokens=128)
    out = target(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i + 1] for i in draft.config.aux_layer_ids], dim=-1)
    s = ids.shape[1]
    # the draft at position t reads the features of t and token t + 1 and proposes token t + 2
    d = draft(input_ids=ids[:, 1:], target_hidden_states=aux[:, :-1], position_ids=torch.arange(s - 1)[None])
    start = enc["input_ids"].shape[1] - 1
    return d.logits[0, start : s - 2].float(), out.logits[0, start + 1 : s - 1].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--draws", type=int, default=16, help="draws of the children per position")
    args = ap.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load_target()
    draft = Eagle3DraftModel.from_pretrained(reference_draft(), target=target).float().eval()
    draft_ids = torch.arange(draft.config.draft_vocab_size) + draft.d2t
    draft_of = torch.full((int(draft_ids.max()) + 1,), -1)
    draft_of[draft_ids] = torch.arange(draft_ids.numel())
    prompts = [json.loads(line)["turns"][0] for line in PROMPTS.read_text().splitlines()[: args.prompts]]
    gen = torch.Generator().manual_seed(0)
    results = {}
    with torch.no_grad():
        for temperature in (0.7, 1.0):
            nucleus = Nucleus(temperature=temperature, top_p=0.9)
            top_k = torch.zeros(K, dtype=torch.float64)
            drawn = {share: torch.zeros(K, dtype=torch.float64) for share in SHARES}
            n = 0
            for i, prompt in enumerate(prompts):
                q_logits, p_logits = positions(target, draft, tokenizer, prompt, temperature, seed=i)
                support, p = nucleus(p_logits)  # the target's processed distribution on its support
                m = support.shape[0]
                n += m
                # one-hot top-k children: accepted with the target's mass on them
                top = draft_ids[q_logits.topk(K, dim=-1).indices]  # (m, K) target ids
                mass = ((top[:, :, None] == support[:, None, :]) * p[:, None, :]).sum(-1)
                top_k += mass.cumsum(-1).sum(0).double()
                for share in SHARES:
                    me = SimpleNamespace(top_k=K, sampling=(temperature * share, gen), log_probs=Drafter.log_probs)
                    for _ in range(args.draws):
                        _, ids, log_q = Drafter.children(me, torch.zeros(m), q_logits)
                        tok = torch.cat([torch.zeros(m, 1, dtype=torch.long), draft_ids[ids]], dim=1)
                        proposal = Proposal(log_q[:, None], torch.zeros(m, K + 1, dtype=torch.long), draft_of)
                        for k in range(1, K + 1):  # the first k draws as the node's children
                            cand = torch.zeros(m, K + 1, dtype=torch.bool)
                            cand[:, 1 : k + 1] = True
                            accept, _ = proposal_level(p, support, cand, tok, torch.zeros(m, dtype=torch.long), proposal, gen)
                            drawn[share][k - 1] += accept.any(-1).double().sum() / args.draws
            results[f"T={temperature:g}"] = {
                "positions": n,
                "top_k": [round(float(x) / n, 3) for x in top_k],
                **{f"drawn at {share:g}x T": [round(float(x) / n, 3) for x in drawn[share]] for share in SHARES},
            }
    (HERE / "first_level.json").write_text(json.dumps(results, indent=1) + "\n")
    print("| sampling | children | " + " | ".join(str(k) for k in range(1, K + 1)) + " |")
    print("|---|---|" + "---|" * K)
    for mode, r in results.items():
        for name, row in r.items():
            if name != "positions":
                print(f"| {mode} ({r['positions']} positions) | {name} | " + " | ".join(f"{x:.3f}" for x in row) + " |")


if __name__ == "__main__":
    main()
