"""Where does a ~32 ms stall per tree step come from on the H200 (results/cuda-h200/README.md)?

Run once on the device, from the repository root: ``python3 results/cuda-h200/diagnose_step_stall.py OUT_DIR``.
Random 1B Llama target in bf16 with the copy draft (eagle3_hub.benchmark.random_target), 128-token prompt. For
lookup on/off x draft graph on/off: tokens/s, the per-step draft / verify / overhead split, CUDA allocator
segment allocations and frees, and Python garbage-collection pauses during one generation; then a torch.profiler
trace of one generation with the CUDA defaults (host ops by self time; the gzipped Chrome trace is saved).
"""

import gc
import gzip
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from eagle3_hub.benchmark.random_target import copy_draft, prompts, random_target
from eagle3_hub.generation.tree_decoding import generate

out = Path(sys.argv[1] if len(sys.argv) > 1 else "stall")
out.mkdir(parents=True, exist_ok=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
size = "1b" if dev == "cuda" else "tiny"
target = random_target(size, dev)
draft = copy_draft(target)
target.to(torch.bfloat16)
draft.to(torch.bfloat16)
ids = prompts(target.config.vocab_size, (128,), dev, seed=3)[0][None]

gc_pauses = []
_gc_start = [0.0]


def on_gc(phase, info):
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        gc_pauses.append((info["generation"], 1e3 * (time.perf_counter() - _gc_start[0])))


gc.callbacks.append(on_gc)


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def stats():
    return torch.cuda.memory_stats() if dev == "cuda" else {}


def one(lookup, graph, n=128):
    generate(target, draft, ids, max_new_tokens=16, eos_token_id=[], lookup_tokens=lookup, draft_graph=graph)
    sync()
    gc_pauses.clear()
    s0 = stats()
    t0 = time.perf_counter()
    o = generate(target, draft, ids, max_new_tokens=n, eos_token_id=[], lookup_tokens=lookup, draft_graph=graph)
    sync()
    dt = time.perf_counter() - t0
    s1 = stats()
    d = lambda k: s1.get(k, 0) - s0.get(k, 0)  # noqa: E731
    r = {"lookup_tokens": lookup, "draft_graph": graph, "tok_s": round(n / dt, 1), "steps": o.stats.steps,
         "lookup_accepted": o.stats.lookup_accepted, "acceptance": round(o.stats.mean_acceptance_length, 2),
         "per_step_ms": {k: round(v, 2) for k, v in o.stats.per_step_ms().items()},
         "host_ms_per_step": round(1e3 * dt / max(o.stats.steps, 1), 2),
         "segments_allocated": d("segment.all.allocated"), "segments_freed": d("segment.all.freed"),
         "alloc_retries": d("num_alloc_retries"), "gc_pauses": len(gc_pauses),
         "gc_ms": round(sum(p for _, p in gc_pauses), 1), "gc_gen2": sum(g == 2 for g, _ in gc_pauses)}
    print(r, flush=True)
    return r


rows = [one(20, True), one(0, True), one(20, False), one(0, False)]
(out / "configs.json").write_text(json.dumps(rows, indent=2))

acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
generate(target, draft, ids, max_new_tokens=16, eos_token_id=[])
sync()
with profile(activities=acts) as prof:
    generate(target, draft, ids, max_new_tokens=48, eos_token_id=[])
    sync()
table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
(out / "profile_host.txt").write_text(table)
print(table[:6000], flush=True)
if dev == "cuda":
    (out / "profile_device.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30))
trace = out / "trace.json"
prof.export_chrome_trace(str(trace))
with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb") as g:
    g.write(f.read())
trace.unlink()
