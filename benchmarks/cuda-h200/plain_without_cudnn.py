"""Is plain ``target.generate`` on the H200 also slowed by cuDNN attention's per-shape plans? Plain greedy tok/s
of the random 1B Llama target (bf16, 2 prompts x 128 new tokens) with the default SDPA kernels and without cuDNN,
and tree decoding (CUDA defaults) in the same run. ``python3 benchmarks/cuda-h200/plain_without_cudnn.py OUT_DIR``."""

import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from eagle3_hub import generate
from eagle3_hub.benchmark.random_target import copy_draft, plain_greedy, prompts, random_target

dev = "cuda" if torch.cuda.is_available() else "cpu"
target = random_target("1b" if dev == "cuda" else "tiny", dev)
draft = copy_draft(target)
target.to(torch.bfloat16)
draft.to(torch.bfloat16)
ps = prompts(target.config.vocab_size, (64, 128), dev, seed=3)
no_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def tok_s(fn, n=128):
    fn(ps[0][:16][None], 16)
    torch.cuda.synchronize() if dev == "cuda" else None
    t0 = time.perf_counter()
    for p in ps:
        fn(p[None], n)
    torch.cuda.synchronize() if dev == "cuda" else None
    return round(len(ps) * n / (time.perf_counter() - t0), 1)


plain = lambda ids, n: plain_greedy(target, ids, torch.ones_like(ids), n)  # noqa: E731
r = {"plain_default_kernels": tok_s(plain)}
with sdpa_kernel(no_cudnn):
    r["plain_without_cudnn"] = tok_s(plain)
r["tree_defaults"] = tok_s(lambda ids, n: generate(target, draft, ids, max_new_tokens=n, eos_token_id=[]))
print(r, flush=True)
out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
out.mkdir(parents=True, exist_ok=True)
(out / "plain_without_cudnn.json").write_text(json.dumps(r, indent=2))
