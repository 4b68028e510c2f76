"""vLLM serving an EAGLE-3 draft: greedy outputs with and without speculation, and vLLM's own acceptance counters.

Runs in the vLLM venv (tests/engines/setup_vllm_cpu.sh; any vLLM build with EAGLE-3, CPU or GPU):

    python tests/engines/vllm_spec_decode.py --target TARGET_DIR --draft CONVERTED_DRAFT --prompts PROMPTS.json \
        --k 3 --max-tokens 64 --out result.json [--dtype float32|bfloat16] [--plain-only | --spec-only]

PROMPTS.json: a list of token-id lists (the chat template applied by the caller, so that both engines see the same
tokens). The result holds, per prompt, the generated token ids of each run, and the spec-decode metrics vLLM
counts (drafts, draft tokens, accepted tokens, accepted tokens per position).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def spec_metrics(llm) -> dict:
    """vLLM's speculative decoding counters (its Prometheus metrics ``vllm:spec_decode_*``)."""
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            key = m.name.split("vllm:spec_decode_", 1)[1]
            out[key] = list(m.values) if hasattr(m, "values") else m.value
    drafts = out.get("num_drafts") or 0
    if drafts:
        out["mean_acceptance_length"] = 1 + out["num_accepted_tokens"] / drafts
        out["per_position_acceptance"] = [a / drafts for a in out.get("num_accepted_tokens_per_pos", [])]
    return out


def run(args, speculative: bool) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        model=args.target,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        max_num_seqs=args.max_num_seqs,
    )
    if speculative:
        kwargs["speculative_config"] = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": args.k}
    llm = LLM(**kwargs)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in json.loads(Path(args.prompts).read_text())]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=False)
    outs = llm.generate(prompts, params)
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outs]}
    if speculative:
        result["metrics"] = spec_metrics(llm)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plain-only", action="store_true")
    mode.add_argument("--spec-only", action="store_true")
    args = p.parse_args(argv)
    import vllm

    result = {"vllm": vllm.__version__, "k": args.k, "max_tokens": args.max_tokens, "dtype": args.dtype}
    if not args.spec_only:
        result["plain"] = run(args, speculative=False)
    if not args.plain_only:
        result["spec"] = run(args, speculative=True)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: a 1024-token window of a small model needs far less
    sys.exit(main())
