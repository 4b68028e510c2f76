"""Training's metrics as a model card reads them: the ``training_metrics.json`` that ``eagle3-hub train`` writes
(recipe, vocabulary, data report, eval history), flattened into the card's training information. It lives with
training, which owns the schema; ``eagle3_hub.publish`` hands the result to the card. Imports nothing heavy: the
card command uses it without the training extras."""

from __future__ import annotations

from .presets import PRESETS


def training_info_from_metrics(metrics: dict) -> dict:
    """The ``training_metrics.json`` that ``eagle3-hub train`` writes (recipe, vocabulary, data report, eval
    history), flattened into the card's training information."""
    recipe = metrics.get("recipe") or {}
    target, data, train = recipe.get("target") or {}, recipe.get("data") or {}, recipe.get("train") or {}
    sources = []
    for src in data.get("sources") or []:
        spec = dict(src) if isinstance(src, dict) else dict(PRESETS.get(src, {"path": src}))
        sources.append(spec.get("path"))
    report, vocab, history = metrics.get("data") or {}, metrics.get("vocab") or {}, metrics.get("eval_history") or []
    info = {
        "target": target.get("name") or "smollm2-135m-instruct",
        "datasets": [s for s in sources if s],
        "regenerated": data.get("regenerate"),
        "prompts written by the target": data.get("synthesize") or None,
        "training conversations": report.get("train"),
        "prompt format": (
            "prompt only, through the recipe's target.chat_template (a base model)" if target.get("chat_template") else None
        ),
        "max length (tokens)": data.get("max_length"),
        "draft vocabulary": vocab.get("draft_vocab_size"),
        "loss tokens covered by the draft vocabulary": f"{vocab['coverage']:.1%}" if vocab.get("coverage") is not None else None,
        "vocabulary chosen anew": (
            f"{vocab['remap']['carried_over']} rows carried over, {vocab['remap']['new']} new, "
            f"{vocab['remap']['dropped']} dropped (the continued draft's covered "
            f"{vocab['init_from_coverage']:.1%})"
        )
        if vocab.get("remap")
        else None,
        "epochs": train.get("epochs"),
        "optimizer steps": metrics.get("steps"),
        "batch size": (train.get("batch_size") or 0) * (train.get("grad_accum") or 1) or None,
        "learning rate": train.get("lr"),
        "optimizer": f"AdamW, betas {train['betas']}, warm-up {train.get('warmup_steps')} steps, grad clip {train.get('grad_clip')}"
        if train.get("betas")
        else None,
        "training-time-test steps": train.get("ttt_steps"),
        "step weight": train.get("step_weight"),
        "objective": _objective(train.get("loss"), train.get("lk_eta")),
        "LoRA": f"r={recipe['lora']['r']}, alpha={recipe['lora']['alpha']}"
        if (recipe.get("lora") or {}).get("enabled")
        else None,
    }
    earlier = metrics.get("earlier_stages") or []
    if earlier:  # a draft continued from another one (draft.init_from): its training is part of this one's
        info["continued from"] = (recipe.get("draft") or {}).get("init_from")
        info["earlier training"] = "; ".join(
            f"{st.get('steps')} steps x {st.get('batch_size')} on {st.get('training_samples')} conversations"
            + (f" ({st['wall_time_s'] / 60:.0f} min)" if st.get("wall_time_s") else "")
            for st in earlier
        )
        info["optimizer steps, all stages"] = (metrics.get("steps") or 0) + sum(st.get("steps") or 0 for st in earlier)
    if history:
        last = history[-1]
        if last.get("expected_acceptance_length") is not None:
            info["eval: expected acceptance length"] = round(float(last["expected_acceptance_length"]), 3)
        if last.get("step_accuracy"):
            info["eval: accuracy per draft step"] = " / ".join(f"{a:.2f}" for a in last["step_accuracy"])
        if last.get("expected_acceptance_length_sampled") is not None:
            info["eval: expected acceptance length at T=1"] = round(float(last["expected_acceptance_length_sampled"]), 3)
        first = history[0]
        if earlier and first.get("step") == 0 and first.get("expected_acceptance_length") is not None:
            sampled = first.get("expected_acceptance_length_sampled")
            greedy = round(float(first["expected_acceptance_length"]), 3)
            info["eval: the draft it continued (step 0)"] = (
                greedy if sampled is None else f"{greedy} ({round(float(sampled), 3)} at T=1)"
            )
    return {k: v for k, v in info.items() if v not in (None, [], "")}


def _objective(loss, lk_eta) -> str | None:
    """The training objective in words (``train.loss``): None for the default KL, which needs no row."""
    if loss in (None, "kl"):
        return None
    if loss == "lk_hybrid":
        return f"lk_hybrid: KL blended into 1 - acceptance (sum min(p, q)) as the draft improves (lk_eta {lk_eta})"
    if isinstance(loss, dict):
        return " + ".join(f"{w} {name}" for name, w in loss.items())
    return {"lk": "lk: 1 - acceptance (sum min(p, q))", "lk_log": "lk_log: -log acceptance"}.get(loss, str(loss))
