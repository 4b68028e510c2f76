"""How well the draft does on the held-out split (loss, step accuracy, expected acceptance length greedy and sampled),
and the share of positions masked out of the loss, which stops a run that would learn (nearly) nothing."""

from __future__ import annotations

import torch

from .ttt import acceptance_metrics, objective

# temperatures, besides greedy and T=1, at which the held-out split's expected acceptance is reported: where chat
# users sample
EVAL_TEMPERATURES = (0.7,)


@torch.no_grad()
def evaluate(draft, loader, recipe, features, accelerator) -> dict:
    """The held-out metrics, summed over every process's shard; ``features(batch, draft)`` gives the target's side."""
    draft.eval()
    t = recipe["train"]
    if t.get("eval_ttt_steps"):  # scored at another unroll than the one trained
        t = {**t, "ttt_steps": t["eval_ttt_steps"]}
    sums = None
    for batch in loader:
        aux, logits = features(batch, draft)
        with accelerator.autocast():
            out = objective(draft, aux, batch, logits, t, EVAL_TEMPERATURES)
        vals = [
            out.loss.detach() * out.chain_count,
            out.step_correct,
            out.step_count,
            out.chain_correct,
            out.chain_count,
            out.step_trained,
            out.step_alpha,
            out.chain_alpha,
            out.chain_alpha_at,
        ]
        sums = vals if sums is None else [a + b for a, b in zip(sums, vals)]
    draft.train()
    sums = [accelerator.reduce(v.float(), "sum") for v in sums]
    m = acceptance_metrics(sums[1], sums[2], sums[3], sums[4], sums[6], sums[7], sums[8], EVAL_TEMPERATURES)
    m["loss"] = (sums[0] / sums[4].clamp(min=1)).item()
    m["masked_share"] = masked_share(sums[2].sum(), sums[5].sum())
    return m


def report_eval(m: dict, step: int, accelerator) -> None:
    """The held-out metrics of ``step`` to the trackers (tensorboard) and as one ``[eval]`` line."""
    accelerator.log(
        {
            "eval/loss": m["loss"],
            "eval/acceptance_length": m["expected_acceptance_length"],
            "eval/masked_share": m["masked_share"],
            "eval/acceptance_length_sampled": m["expected_acceptance_length_sampled"],
            **{f"eval/acceptance_length_T{t}": v for t, v in m["expected_acceptance_length_at"].items()},
            **{f"eval/acc_{k}": a for k, a in enumerate(m["step_accuracy"])},
        },
        step=step,
    )
    accelerator.print(
        f"[eval] step {step}: loss {m['loss']:.3f}, expected acceptance length "
        f"{m['expected_acceptance_length']:.2f}, step accuracy "
        + " ".join(f"{a:.2f}" for a in m["step_accuracy"])
        + "".join(f", at T={t} {v:.2f}" for t, v in m["expected_acceptance_length_at"].items())
        + f", at T=1 {m['expected_acceptance_length_sampled']:.2f}, masked {m['masked_share']:.1%}"
    )


# Positions whose target token lies outside the draft vocabulary are masked out of the loss. Answers written by the
# target itself keep that share near the vocabulary's coverage gap; a high share means the data's answers are not the
# target's (data.regenerate: false on foreign data), and a run masking nearly everything trains on nothing.
MASKED_WARN, MASKED_STOP, MASKED_CHECK_STEPS = 0.25, 0.99, 10


def masked_share(scored, trained) -> float:
    """The share of scored positions that the loss does not train on."""
    scored, trained = float(scored), float(trained)
    return 1.0 - trained / scored if scored else 0.0


def check_masked_share(share: float, steps: int, recipe: dict, vocab_size: int) -> str | None:
    """Stop a run that trains on (nearly) nothing (ValueError), or return a warning for one that masks much."""
    if share < MASKED_WARN:
        return None
    d = recipe["draft"]
    fix = "set data.regenerate: true so that the target writes the answers" + (
        ", or draft.reselect_vocab: true" if d["init_from"] else ", or raise draft.draft_vocab_size"
    )
    what = (
        f"{share:.1%} of the positions to learn in the first {steps} step(s) are masked out: the target's next "
        f"token there lies outside the draft vocabulary ({vocab_size} tokens)"
    )
    if share >= MASKED_STOP:
        raise ValueError(f"{what}, so the draft learns (nearly) nothing. The data's answers are not the target's own: {fix}.")
    return f"[warn] {what}. If the data's answers were not written by this target: {fix}."
