"""Expected acceptance of every stage of the reference draft on one fixed text: how it grows with the data.

The target answers the first turns of the first ``--questions`` questions of each benchmark suite once (greedy,
256 new tokens, cached in ``--out``); every stage's draft is then scored on those answers the way training scores
its held-out split (teacher-forced, ``ttt_steps`` chained draft steps, expected acceptance length of a chain).
No draft trained on any benchmark question. The stages are read from the git history of the shipped folder, and
the working tree's draft is added when it differs from the last one committed.

    python results/smollm2-135m-instruct/diagnostics/acceptance_by_stage.py [--bench-dir ../shared/benchmarks]

Writes ``acceptance_by_stage.json``, ``.md`` and ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from eagle3_hub.benchmark.suites import load_suite  # noqa: E402
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel  # noqa: E402
from eagle3_hub.targets import load_target  # noqa: E402
from eagle3_hub.training.features import aux_features  # noqa: E402
from eagle3_hub.training.ttt import acceptance_metrics, ttt_loss  # noqa: E402

DRAFT = "eagle3_hub/reference_draft/smollm2-135m-instruct"
SUITES = ["mt_bench", "humaneval", "gsm8k"]
# the commits that shipped each stage of the current lineage (stage 1 = the first draft trained on target-answered data)
STAGES = {"stage 1": "b5fc1f1", "stage 2": "13fd6ef", "stage 3": "7490a5e", "stage 4": "11a61d3", "stage 5": "e0d8115",
          "stage 6": "4ee2c51", "stage 7": "3e99268", "stage 8": "34a72c0",
          "stage 9": "8e6d003", "stage 10": "efcafb5",
          "stage 11": "5859b07"}


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], check=True, capture_output=True).stdout


def export_draft(commit: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "training_metrics.json"):
        (folder / name).write_bytes(git("show", f"{commit}:{DRAFT}/{name}"))
    return folder


def lineage(folder: Path) -> dict:
    m = json.loads((folder / "training_metrics.json").read_text())
    earlier = m.get("earlier_stages") or []
    return {"training_conversations": m["data"]["train"],  # each stage's data holds every earlier stage's
            "optimizer_steps_all_stages": m["steps"] + sum(s.get("steps") or 0 for s in earlier)}


def target_answers(target, tok, bench_dir, n: int, max_new_tokens: int, cache: Path) -> list[dict]:
    if cache.exists():
        return [json.loads(line) for line in cache.read_text().splitlines()]
    rows = []
    tok.padding_side = "left"
    for suite in tqdm(SUITES, desc="target answers (one batch per suite)"):
        (s,) = load_suite(suite, bench_dir)
        questions = s.questions[:n]
        texts = [tok.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True,
                                         tokenize=False) for q in questions]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        for q, ids, keep, gen in zip(questions, enc.input_ids, enc.attention_mask.bool(), out[:, enc.input_ids.shape[1]:]):
            gen = gen.tolist()
            if tok.eos_token_id in gen:
                gen = gen[: gen.index(tok.eos_token_id) + 1]
            prompt = ids[keep].tolist()
            rows.append({"suite": suite, "question_id": q.question_id, "prompt_tokens": len(prompt),
                         "input_ids": prompt + gen})
    cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-dir", default="../shared/benchmarks")
    ap.add_argument("--questions", type=int, default=10, help="first questions of each suite")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--out", default="results/smollm2-135m-instruct/acceptance_by_stage")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    target, tok = load_target(None, dtype=torch.float32)
    answers = target_answers(target, tok, args.bench_dir, args.questions, args.max_new_tokens, out / "target_answers.jsonl")

    with tempfile.TemporaryDirectory() as tmp:
        folders = {label: export_draft(commit, Path(tmp) / commit) for label, commit in STAGES.items()}
        last = folders[list(STAGES)[-1]] / "model.safetensors"
        if (Path(DRAFT) / "model.safetensors").read_bytes() != last.read_bytes():
            folders["working tree"] = Path(DRAFT)
        features = {}  # aux layer ids -> per-answer (aux, logits)
        results = {}
        for label, folder in folders.items():
            draft = Eagle3DraftModel.from_pretrained(folder, target=target).float().eval()
            key = tuple(draft.config.aux_layer_ids)
            if key not in features:
                feats = []
                for row in tqdm(answers, desc=f"target features {list(key)}"):
                    seq = torch.tensor([row["input_ids"]])
                    feats.append(aux_features(target, seq, torch.ones_like(seq), list(key)))
                features[key] = feats
            answer_ids = torch.tensor([t for row in answers for t in row["input_ids"][row["prompt_tokens"]:]])
            covered = draft.t2d[answer_ids].float().mean().item()  # share of answer tokens the draft can propose
            per_suite = {}
            for suite in SUITES:
                sums = None
                for row, (aux, logits) in zip(answers, features[key]):
                    if row["suite"] != suite:
                        continue
                    seq = torch.tensor([row["input_ids"]])
                    loss_mask = torch.zeros_like(seq)
                    loss_mask[:, row["prompt_tokens"]:] = 1
                    with torch.no_grad():
                        o = ttt_loss(draft, aux, seq, logits, loss_mask, torch.ones_like(seq), ttt_steps=args.ttt_steps)
                    part = [o.step_correct, o.step_count, o.chain_correct, o.chain_count]
                    sums = part if sums is None else [a + b for a, b in zip(sums, part)]
                m = acceptance_metrics(*sums)
                per_suite[suite] = {"expected_acceptance_length": m["expected_acceptance_length"],
                                    "step_accuracy": m["step_accuracy"]}
            results[label] = {**lineage(folder), "answer_tokens_in_draft_vocab": covered, "suites": per_suite}
            print(label, results[label]["training_conversations"], "conversations:",
                  {s: round(v["expected_acceptance_length"], 3) for s, v in per_suite.items()}, flush=True)

    report = {"questions_per_suite": args.questions, "max_new_tokens": args.max_new_tokens, "ttt_steps": args.ttt_steps,
              "stages": results}
    (out / "acceptance_by_stage.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| stage | training conversations | optimizer steps (all stages) | answer tokens in the draft vocabulary | "
             + " | ".join(SUITES) + " | step-0 accuracy (mt_bench) |", "|---" * (5 + len(SUITES)) + "|"]
    for label, r in results.items():
        cov = f"{r['answer_tokens_in_draft_vocab']:.1%}"
        accs = " | ".join(f"{r['suites'][s]['expected_acceptance_length']:.2f}" for s in SUITES)
        lines.append(f"| {label} | {r['training_conversations']:,} | {r['optimizer_steps_all_stages']:,} | {cov} | {accs} | "
                     f"{r['suites']['mt_bench']['step_accuracy'][0]:.2f} |")
    table = "\n".join(lines) + "\n"
    (out / "acceptance_by_stage.md").write_text(
        f"Expected chain acceptance ({args.ttt_steps} draft steps) on the target's own greedy answers to the first "
        f"{args.questions} questions of each suite (first turns, {args.max_new_tokens} new tokens), teacher-forced.\n\n"
        + table)
    print(table)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = [r["training_conversations"] for r in results.values()]
    for suite in SUITES:
        ax.plot(x, [r["suites"][suite]["expected_acceptance_length"] for r in results.values()], "o-", label=suite)
    for label, r in results.items():
        ax.annotate(label, (r["training_conversations"], r["suites"]["mt_bench"]["expected_acceptance_length"]),
                    textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xticks(x, [f"{v:,}" for v in x])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training conversations (log scale)")
    ax.set_ylabel("expected acceptance length (chain)")
    ax.set_title("Reference draft for SmolLM2-135M-Instruct, by training stage")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_stage.png", dpi=120)


if __name__ == "__main__":
    main()
