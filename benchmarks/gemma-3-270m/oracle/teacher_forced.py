"""What the gemma-3-270m draft predicts on the target's own sampled continuations of the `continuation` suite.

For the first openings, the target samples a continuation with plain `generate` (temperature T, top-p 0.9); the
draft then reads the target's features of the whole text, teacher-forced, and at every continuation position this
prints the target's processed probability mass on the draft's top-1, top-4 and top-8 candidates: the chance that a
first draft position of one, four or eight one-hot candidates is accepted, without any tree decoding. Run from the
repository root:

    python benchmarks/gemma-3-270m/oracle/teacher_forced.py --temperature 0.7 --questions 4 --new-tokens 128
"""

import argparse

import torch

from eagle3_hub.benchmark.bench import build_prompt
from eagle3_hub.benchmark.suites import load_suite
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.targets import load_target

p = argparse.ArgumentParser()
p.add_argument("--temperature", type=float, default=0.7)
p.add_argument("--top-p", type=float, default=0.9)
p.add_argument("--questions", type=int, default=4)
p.add_argument("--new-tokens", type=int, default=128)
args = p.parse_args()

torch.set_num_threads(2)
target, tok = load_target("gemma-3-270m", dtype="bfloat16")
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/gemma-3-270m", target=target, torch_dtype=torch.bfloat16)
aux_ids, tops = draft.config.aux_layer_ids, (1, 4, 8)
mass = {k: [] for k in tops}
for i, question in enumerate(load_suite("continuation")[0].questions[: args.questions]):
    ids = build_prompt(tok, question.turns[:1], [])
    torch.manual_seed(i)
    text = target.generate(ids, do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                           max_new_tokens=args.new_tokens)
    with torch.no_grad():
        out = target(input_ids=text, output_hidden_states=True, use_cache=False)
        aux = torch.cat([out.hidden_states[j + 1] for j in aux_ids], dim=-1)
        # the draft at position t reads (feature t, token t + 1) and predicts token t + 2
        guesses = draft(input_ids=text[:, 1:], target_hidden_states=aux[:, :-1]).logits[0].float().topk(max(tops)).indices
    for t in range(ids.shape[1] - 2, text.shape[1] - 2):
        probs = torch.softmax(out.logits[0, t + 1].float() / args.temperature, dim=-1)
        sorted_p, order = probs.sort(descending=True)
        kept = (sorted_p.cumsum(0) - sorted_p) < args.top_p  # the nucleus: tokens before which less than top-p lies
        processed = torch.zeros_like(probs).scatter_(0, order[kept], sorted_p[kept])
        processed /= processed.sum()
        candidates = draft.draft_to_target_ids(guesses[t])
        for k in tops:
            mass[k].append(float(processed[candidates[:k]].sum()))
print(f"T={args.temperature}, top-p {args.top_p}, {len(mass[1])} positions: the target's mass on the draft's "
      + ", ".join(f"top-{k} {sum(v) / len(v):.3f}" for k, v in mass.items()))
