"""vLLM serving our draft next to our own decoding, on the same prompts and chain length.

    python tests/engines/vllm_vs_ours.py --vllm-python /work/venvs/vllm-cpu/bin/python --out DIR [--k 3]
        [--max-tokens 64] [--prompts 8] [--layout vllm|sglang] [--target TARGET] [--draft DRAFT_DIR]
        [--dtype float32|bfloat16] [--device cpu|cuda]

Runs in the project venv; vLLM runs in its own venv (tests/engines/setup_vllm_cpu.sh), as a subprocess of
``vllm_spec_decode.py``. Steps: the shipped SmolLM2 draft converted with ``eagle3_hub.formats.convert`` (to
``vllm`` or ``sglang``); the target's transformers folder (the embedded one: its GGUF de-quantised into the cache); the
first MT-bench turn of each category (then more turns) through the target's chat template; vLLM greedy without
and with ``speculative_config={"method": "eagle3", ...}``; ours: ``eagle3_hub.generate`` with a chain (depth k,
one candidate per level, every level drafted as vLLM does (no pruning by draft probability), no lookup branch).
Writes ``DIR/result.json`` and prints the comparison.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from eagle3_hub import generate, load_target
from eagle3_hub.benchmark.bench import build_prompt
from eagle3_hub.formats import convert
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.targets import reference_draft, resolve_target

MT_BENCH = Path(__file__).resolve().parents[2] / "eagle3_hub" / "benchmark" / "data" / "mt_bench.jsonl"
HERE = Path(__file__).resolve().parent


def mt_bench_prompts(tokenizer, n: int) -> list[list[int]]:
    """First turns of MT-bench as token ids: one question of each category first (its questions come in blocks
    of ten per category), then the next of each, and so on."""
    rows = [json.loads(line) for line in MT_BENCH.read_text().splitlines() if line.strip()]
    order = sorted(range(len(rows)), key=lambda i: (i % 10, i))
    return [build_prompt(tokenizer, [rows[i]["turns"][0]], []).tolist()[0] for i in order[:n]]


def ours_chain(target, draft, prompts: list[list[int]], k: int, max_new_tokens: int) -> dict:
    """Our greedy decoding with a chain of k draft tokens per step: the tokens, and acceptance counted as vLLM
    counts it (per verification after the prefill: accepted draft tokens, and which positions were accepted)."""
    tokens, drafts, accepted, per_pos = [], 0, 0, [0] * k
    for ids in prompts:
        steps: list[int] = []
        out = generate(
            target,
            draft,
            torch.tensor([ids], device=target.device),
            max_new_tokens=max_new_tokens,
            depth=k,
            tree_top_k=1,
            total_tokens=k,
            lookup_tokens=0,
            adaptive=False,
            min_node_prob=0.0,
            grow_min_prob=0.0,
            on_step=lambda toks, n_draft: steps.append(n_draft[0]),
        )
        tokens.append(out.sequences[0, len(ids) :].tolist())
        for n in steps[1:]:  # the first call is the prefill: no draft was verified
            drafts += 1
            accepted += n
            for i in range(n):
                per_pos[i] += 1
    pad = target.generation_config.pad_token_id
    tokens = [
        t[: len(t) - next((i for i, x in enumerate(reversed(t)) if x != pad), len(t))] if pad is not None else t for t in tokens
    ]
    return {
        "tokens": tokens,
        "num_drafts": drafts,
        "num_accepted_tokens": accepted,
        "mean_acceptance_length": 1 + accepted / max(drafts, 1),
        "per_position_acceptance": [a / max(drafts, 1) for a in per_pos],
    }


def run_vllm(
    python: str, target_dir: str, draft_dir: Path, prompts_file: Path, out: Path, k: int, max_tokens: int, dtype: str
) -> dict:
    cmd = [
        python,
        str(HERE / "vllm_spec_decode.py"),
        "--target",
        target_dir,
        "--draft",
        str(draft_dir),
        "--prompts",
        str(prompts_file),
        "--k",
        str(k),
        "--max-tokens",
        str(max_tokens),
        "--out",
        str(out),
        "--dtype",
        dtype,
    ]
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = out.with_suffix(".log").read_text()[-4000:]
        raise RuntimeError(f"vLLM failed (exit {proc.returncode}), log {out.with_suffix('.log')}:\n{tail}")
    return json.loads(out.read_text())


def compare(vllm: dict, ours: dict) -> dict:
    plain, spec = vllm["plain"]["tokens"], vllm["spec"]["tokens"]
    m = vllm["spec"]["metrics"]
    return {
        "prompts": len(plain),
        "vllm_spec_equals_plain": sum(a == b for a, b in zip(plain, spec)),
        "ours_equals_vllm_plain": sum(a == b for a, b in zip(plain, ours["tokens"])),
        "vllm_mean_acceptance_length": m.get("mean_acceptance_length"),
        "ours_mean_acceptance_length": ours["mean_acceptance_length"],
        "vllm_per_position_acceptance": m.get("per_position_acceptance"),
        "ours_per_position_acceptance": ours["per_position_acceptance"],
        "vllm_num_drafts": m.get("num_drafts"),
        "ours_num_drafts": ours["num_drafts"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm-python", required=True, help="python of the vLLM venv")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--layout", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--target", default=None, help="the target (a Hub id, a folder or a named target; default: the embedded one)")
    p.add_argument("--draft", help="our layout's draft folder for the target (default: the one shipped for it)")
    p.add_argument("--dtype", default="float32", help="vLLM's dtype (ours runs in float32)")
    p.add_argument("--device", default=None, help="where ours runs (default: cuda when available, else cpu)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    target_dir = resolve_target(args.target)[0]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target, tokenizer = load_target(args.target, device=device)  # float32: equal tokens need it
    src = args.draft or str(reference_draft(args.target))
    draft_dir = args.out / f"draft-{args.layout}"
    if not (draft_dir / "config.json").exists():
        convert(src, str(draft_dir), to=args.layout)
    prompts = mt_bench_prompts(tokenizer, args.prompts)
    (args.out / "prompts.json").write_text(json.dumps(prompts))
    vllm = run_vllm(
        args.vllm_python,
        target_dir,
        draft_dir,
        args.out / "prompts.json",
        args.out / "vllm.json",
        args.k,
        args.max_tokens,
        args.dtype,
    )
    draft = Eagle3DraftModel.from_pretrained(src, target=target, dtype=torch.float32).to(device)
    ours = ours_chain(target, draft, prompts, args.k, args.max_tokens)
    result = {
        "k": args.k,
        "max_tokens": args.max_tokens,
        "layout": args.layout,
        "target": args.target or "embedded",
        "draft": src,
        "dtype": args.dtype,
        "device": device,
        "vllm_version": vllm["vllm"],
        "comparison": compare(vllm, ours),
        "vllm": vllm,
        "ours": ours,
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["comparison"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
