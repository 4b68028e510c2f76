"""The greedy check of a benchmark run in reduced precision: is every token the target's own choice?

In float32, greedy tree decoding emits exactly the tokens of plain greedy ``target.generate``, and the benchmark
compares them token for token. In bfloat16 (or float16) it cannot: a verification of several tokens runs other
matrix kernels than a one-token step, the two round differently, and bf16 logits are coarse (steps of 0.125
between 16 and 32), so two candidates that are near-tied can swap, and from there the texts part
(docs/benchmarks.md has the measured cases).

So in reduced precision each greedy output is scored, teacher-forced, by a float32 copy of the same weights:
at every position the gap between the best float32 logit and the logit of the token that was emitted. A correct
decoder, plain or tree, only ever emits a token within rounding of the best; a bug (a wrong cache slot, a wrong
mask, an off-by-one in the accepted path) emits tokens far below it. The tolerance is a few bf16 steps at the
logits' magnitude, and plain decoding's own gaps are reported next to every method's, so the two can be compared.

The rounding of a bf16 forward is not only that of its last step: it builds up over the layers, and plain bf16
decoding itself emits tokens more than a few steps below the float32 best. So a token over the float32 tolerance is
asked the question that defines a correct decoder: would plain decoding, in the run's dtype, choose it on that exact
prefix? ``plain_step_logits`` recomputes plain decoding's own steps (``target.generate``, the prompt then one token
per step with the cache, each step forced to the emitted token). A token plain decoding would choose there is
correct, whatever its float32 gap; one it would not is flagged unless plain's step holds it within the tolerance of
its choice (where a tree verification and a one-token step part at a tie: they round differently). A bug is caught:
a wrong token is far below the best in both precisions.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import LogitsProcessor, LogitsProcessorList

# a token is a near-tie choice when its float32 logit is within this many steps of the reduced dtype (at the
# magnitude of the best logit) of the best one
TOLERANCE_STEPS = 4.0
MAX_FLAGGED = 20  # flagged tokens listed per method in the report
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def reduced_precision(dtype: torch.dtype) -> bool:
    return dtype in MANTISSA_BITS


def step_at(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers around ``value`` (its unit in the last place)."""
    if value == 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(value))) - MANTISSA_BITS[dtype])


def float32_reference(target) -> torch.nn.Module:
    """A float32 copy of ``target`` (same weights, same device) to score outputs with."""
    return copy.deepcopy(target).float().eval().requires_grad_(False)


@torch.inference_mode()
def argmax_gaps(reference, prompt_ids: list[int], output_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced float32 scores of ``output_ids`` after ``prompt_ids``: (gap, best logit) per output token,
    where gap = best logit - logit of the emitted token (0 where the emitted token is the float32 argmax)."""
    if not output_ids:
        return torch.zeros(0), torch.zeros(0)
    device = next(reference.parameters()).device
    ids = torch.tensor([prompt_ids + output_ids[:-1]], device=device)
    n = len(output_ids)
    logits = reference(input_ids=ids, logits_to_keep=n).logits[0, -n:].float()  # (n, V)
    chosen = logits.gather(1, torch.tensor(output_ids, device=device)[:, None]).squeeze(1)
    best = logits.max(dim=-1).values
    return (best - chosen).cpu(), best.cpu()


class _Forced(LogitsProcessor):
    """Keeps each step's scores (plain decoding's own) and makes the step emit the given token."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.scores = tokens, []

    def __call__(self, input_ids, scores):
        self.scores.append(scores[0].float().clone())
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.tokens[len(self.scores) - 1]] = 0
        return forced


@torch.inference_mode()
def plain_step_logits(target, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """(n, V): the logits plain greedy decoding (``target.generate``, the target's dtype) computes for each of
    ``output_ids`` after ``prompt_ids``, each step forced to the emitted token (the same kernels and cache)."""
    if not output_ids:
        return torch.zeros(0, 0)
    device = next(target.parameters()).device
    forced = _Forced(output_ids)
    ids = torch.tensor([prompt_ids], device=device)
    target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=len(output_ids),
        min_new_tokens=None,
        do_sample=False,
        num_beams=1,
        eos_token_id=[],
        repetition_penalty=None,
        logits_processor=LogitsProcessorList([forced]),
    )
    return torch.stack(forced.scores).cpu()


def plain_step_gaps(target, prompt_ids: list[int], output_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output token, under plain decoding's own steps: (gap, best logit), gap 0 where plain would choose it."""
    if not output_ids:
        return torch.zeros(0), torch.zeros(0)
    logits = plain_step_logits(target, prompt_ids, output_ids)
    best = logits.max(dim=-1).values
    return best - logits.gather(1, torch.tensor(output_ids)[:, None]).squeeze(1), best


def tolerance(best: torch.Tensor, dtype: torch.dtype, steps: float = TOLERANCE_STEPS) -> torch.Tensor:
    """Per token, ``steps`` steps of ``dtype`` at the magnitude of its best logit."""
    return torch.tensor([steps * step_at(float(b), dtype) for b in best.tolist()])


def near_tie_flags(
    gaps: torch.Tensor,
    best: torch.Tensor,
    own_gaps: torch.Tensor,
    own_best: torch.Tensor,
    dtype: torch.dtype,
    steps: float = TOLERANCE_STEPS,
):
    """Per token, from its float32 (gap, best logit) and plain decoding's own step (``plain_step_gaps``): (the float32
    tolerance, the own tolerance, over the float32 tolerance, flagged = over both: plain decoding would not choose it
    there, nor hold it within the tolerance of its choice)."""
    tol, own_tol = tolerance(best, dtype, steps), tolerance(own_best, dtype, steps)
    over32 = gaps > tol
    return tol, own_tol, over32, over32 & (own_gaps > own_tol)


def near_tie_check(records, target, dtype: torch.dtype, steps: float = TOLERANCE_STEPS) -> dict:
    """Per method, over its greedy records (each with ``prompt_ids`` and ``output_ids``): tokens scored, tokens
    that are the float32 argmax, the largest float32 gap, the tokens over the float32 tolerance (``steps`` steps of
    ``dtype`` at the best logit), and ``over_tolerance``: those of them that plain decoding (``dtype``, its own steps
    on the same prefix) would not choose, nor hold within ``steps`` of its steps of its choice; ``own_max_gap``: the
    largest gap under plain decoding's steps, over the turns that had a token to ask about; ``by_suite``: tokens, largest gap and
    tokens over the tolerance per suite; ``flagged``: where the first ``MAX_FLAGGED`` of those tokens are (question,
    turn, token index, both gaps and tolerances), so that a failure can be traced without running again."""
    reference = float32_reference(target)
    report: dict[str, dict] = {}
    try:
        for r in records:
            if r.mode != "greedy":
                continue
            gaps, best = argmax_gaps(reference, r.prompt_ids, r.output_ids)
            own_gaps, own_best = torch.zeros_like(gaps), best  # asked only where float32 alone would flag
            if bool((gaps > tolerance(best, dtype, steps)).any()):
                own_gaps, own_best = plain_step_gaps(target, r.prompt_ids, r.output_ids)
            tol, own_tol, over32, flagged = near_tie_flags(gaps, best, own_gaps, own_best, dtype, steps)
            e = report.setdefault(
                r.method,
                {
                    "turns": 0,
                    "tokens": 0,
                    "argmax": 0,
                    "max_gap": 0.0,
                    "own_max_gap": 0.0,
                    "float32_over_tolerance": 0,
                    "over_tolerance": 0,
                    "worst": None,
                    "by_suite": {},
                    "flagged": [],
                },
            )
            per_suite = e["by_suite"].setdefault(r.suite, {"tokens": 0, "max_gap": 0.0, "over_tolerance": 0})
            e["turns"] += 1
            over = int(flagged.sum())
            largest = float(gaps.max()) if len(gaps) else 0.0
            for counts in (e, per_suite):
                counts["tokens"] += len(gaps)
                counts["over_tolerance"] += over
                counts["max_gap"] = max(counts["max_gap"], largest)
            e["float32_over_tolerance"] += int(over32.sum())
            e["own_max_gap"] = max(e["own_max_gap"], float(own_gaps.max()) if len(own_gaps) else 0.0)
            e["argmax"] += int((gaps == 0).sum())

            def token(i: int) -> dict:  # one token of this turn, as the report lists it
                return {
                    "suite": r.suite,
                    "question_id": r.question_id,
                    "turn": r.turn,
                    "token": i,
                    "gap": float(gaps[i]),
                    "tolerance": float(tol[i]),
                    "own_gap": float(own_gaps[i]),
                    "own_tolerance": float(own_tol[i]),
                }

            for i in flagged.nonzero().flatten().tolist()[: MAX_FLAGGED - len(e["flagged"])]:
                e["flagged"].append(token(i))
            if len(gaps) and (e["worst"] is None or largest > e["worst"]["gap"]):
                e["worst"] = token(int(gaps.argmax()))
    finally:
        del reference
    for e in report.values():
        e["within_tolerance"] = e["over_tolerance"] == 0
        e["tolerance_steps"] = steps
    return report


__all__ = [
    "TOLERANCE_STEPS",
    "argmax_gaps",
    "float32_reference",
    "near_tie_check",
    "near_tie_flags",
    "plain_step_gaps",
    "plain_step_logits",
    "reduced_precision",
    "step_at",
    "tolerance",
]
