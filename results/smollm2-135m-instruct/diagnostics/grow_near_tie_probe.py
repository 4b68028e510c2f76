"""Where does a bf16 tree-decoding token that the float32 target ranks below its argmax come from?

Session 14: on the README command with ``--depth 8 --grow-min-prob 0.3`` (stage-9 draft, bf16), two tokens were
~0.80 below the float32 argmax where the bench's tolerance was 0.5 (question 85, turn 2, token 179). This reruns that
question with the same settings, finds every emitted token whose float32 gap exceeds the tolerance, and scores that
same position three more ways on the same text:

- bf16 prefill: one bf16 forward of prompt + output[:t] (a several-token verification's kernels);
- bf16 steps: the prompt prefilled, then output[:t] fed one token at a time (plain bf16 decoding's numerics);
- float32: the reference.

If plain bf16 decoding, on the same text, also ranks the emitted token first (or within rounding), the gap is bf16's,
not the tree's. If it ranks the float32 argmax first by a clear margin, the tree's verification is suspect. Then the
last turn is decoded again with the tree's target forwards recorded, and the logits its last verification gave are
printed for every slot.

Result (session 15, stage-9 draft, ``grow_near_tie_probe.txt``): the token was <|im_end|> where float32 has ' a' 0.80
higher. The tree's last verification gave both exactly 29.5: a bf16 tie, and argmax takes the lower id. A bf16
prefill of the same text has them 0.375 apart, plain bf16 steps 0.25, both within the 0.5 tolerance. So it was bf16
rounding, built up over the layers, not a decoding bug; the bench's check now also scores each output with the bf16
target itself and flags a token only when neither precision ranks it within the tolerance (``near_ties.py``).

    python results/smollm2-135m-instruct/diagnostics/grow_near_tie_probe.py [DRAFT] [--question 85] [--depth 8]
        [--grow-min-prob 0.3]                                         # grow_near_tie_probe.txt
"""
import argparse
import copy

import torch

from eagle3_hub import Eagle3DraftModel, generate
from eagle3_hub.benchmark.bench import build_prompt
from eagle3_hub.benchmark.near_ties import argmax_gaps, tolerance
from eagle3_hub.benchmark.suites import load_suite
from eagle3_hub.targets import load_target

ap = argparse.ArgumentParser()
ap.add_argument("draft", nargs="?", default=None)
ap.add_argument("--question", type=int, default=85)
ap.add_argument("--depth", type=int, default=8)
ap.add_argument("--grow-min-prob", type=float, default=0.3)
ap.add_argument("--max-new-tokens", type=int, default=256)
args = ap.parse_args()

torch.set_num_threads(2)
t16, tok = load_target(None, dtype=torch.bfloat16)
t32 = copy.deepcopy(t16).float().eval()
if args.draft is None:
    import pathlib

    import eagle3_hub

    args.draft = str(pathlib.Path(eagle3_hub.__file__).parent / "reference_draft/smollm2-135m-instruct")
draft = Eagle3DraftModel.from_pretrained(args.draft, dtype=torch.bfloat16)
q = next(q for q in load_suite("mt_bench")[0].questions if int(q.question_id) == args.question)


@torch.inference_mode()
def bf16_steps_logits(prompt: list[int], out: list[int], t: int) -> torch.Tensor:
    """Logits at output position t with the prompt prefilled and output[:t] fed one token at a time."""
    res = t16(input_ids=torch.tensor([prompt]), use_cache=True)
    cache, logits = res.past_key_values, res.logits[0, -1]
    for i in range(t):
        res = t16(input_ids=torch.tensor([[out[i]]]), past_key_values=cache, use_cache=True)
        cache, logits = res.past_key_values, res.logits[0, -1]
    return logits.float()


@torch.inference_mode()
def prefill_logits(model, prompt: list[int], out: list[int], t: int) -> torch.Tensor:
    return model(input_ids=torch.tensor([prompt + out[:t]])).logits[0, -1].float()


def describe(name: str, logits: torch.Tensor, emitted: int, best32: int) -> str:
    top = logits.topk(3)
    order = [(repr(tok.decode(i)), round(v, 3)) for v, i in zip(top.values.tolist(), top.indices.tolist())]
    return (f"  {name:13s} emitted {logits[emitted]:.4f}  fp32-argmax {logits[best32]:.4f}  "
            f"emitted-minus-fp32best {logits[emitted] - logits[best32]:+.4f}  top3 {order}")


answers: list[str] = []
for turn in range(len(q.turns)):
    ids = build_prompt(tok, q.turns[: turn + 1], answers)
    with torch.inference_mode():
        res = generate(t16, draft, ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                       eos_token_id=tok.eos_token_id, tokenizer=tok, depth=args.depth,
                       grow_min_prob=args.grow_min_prob)
    prompt = ids[0].tolist()
    out = res.sequences[0, ids.shape[1]:].tolist()
    answers.append(tok.decode(out, skip_special_tokens=True).strip())
    gaps, best = argmax_gaps(t32, prompt, out)
    tol = tolerance(best, torch.bfloat16)
    over = (gaps > tol).nonzero().flatten().tolist()
    print(f"question {q.question_id} turn {turn + 1}: {len(out)} tokens, max gap {float(gaps.max()):.4f}, "
          f"{len(over)} over tolerance", flush=True)
    for t in over:
        l32 = prefill_logits(t32, prompt, out, t)
        best32 = int(l32.argmax())
        print(f" token {t}: emitted {tok.decode(out[t])!r}, float32 argmax {tok.decode(best32)!r}, "
              f"gap {float(gaps[t]):.4f}, tolerance {float(tol[t]):.3f}; context ...{tok.decode(out[max(0, t - 12):t])!r}")
        print(describe("float32", l32, out[t], best32))
        print(describe("bf16 prefill", prefill_logits(t16, prompt, out, t), out[t], best32))
        print(describe("bf16 steps", bf16_steps_logits(prompt, out, t), out[t], best32), flush=True)

# ---- the tree's own verification at the flagged token: the logits its last target forwards gave (the last turn)
from eagle3_hub.generation import tree_decoding as td  # noqa: E402

calls: list[dict] = []
orig_forward, orig_head = td._TreeDecoder._target_forward, td._TreeDecoder._lm_head


def recording_forward(self, ids, position_ids, mask, logits_to_keep, cache=None):
    calls.append({"ids": ids[0].tolist(), "pos": position_ids[0].tolist(), "heads": []})
    return orig_forward(self, ids, position_ids, mask, logits_to_keep, cache)


def recording_head(self, hidden):
    logits = orig_head(self, hidden)
    if calls:
        calls[-1]["heads"].append(logits.detach().float().reshape(-1, logits.shape[-1]).clone())
    return logits


td._TreeDecoder._target_forward, td._TreeDecoder._lm_head = recording_forward, recording_head
ids = build_prompt(tok, q.turns, answers[:-1])
with torch.inference_mode():
    res = generate(t16, draft, ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                   eos_token_id=tok.eos_token_id, tokenizer=tok, depth=args.depth, grow_min_prob=args.grow_min_prob)
again = res.sequences[0, ids.shape[1]:].tolist()
print(f"rerun of the last turn with recording: {'the same' if again == out else 'a different'} output")
last = calls[-1]
print(f"last target forward: {len(last['ids'])} slots, tokens {[tok.decode(i) for i in last['ids']]}, "
      f"positions {last['pos']}")
eos, alt = tok.eos_token_id, int(l32.argmax()) if over else None
for h, logits in enumerate(last["heads"]):
    for row, lg in enumerate(logits):
        top = lg.topk(3)
        print(f"  head call {h} row {row}: top3 {[(tok.decode(i), round(v, 3)) for v, i in zip(top.values.tolist(), top.indices.tolist())]}"
              + (f", eos {lg[eos]:.4f}, fp32-argmax {lg[alt]:.4f}" if alt is not None else ""))
