"""SmolLM2-135M's head (49,152 x 576, float32, 2 threads) over the few rows a CPU verification needs, by kernel;
then tree decoding end to end with the packed head and without it. Behind ``_packed_head`` in
eagle3_hub/generation/tree_decoding.py.

    python results/smollm2-135m-instruct/diagnostics/lm_head_kernels.py [--bench-dir ../shared/benchmarks] [--out F]

Kernels (ms, median of 20, random weights):
- ``linear``: ``F.linear`` (what transformers' lm_head runs);
- ``transposed``: ``x @ W.T.contiguous()`` (a plain product on a transposed copy);
- ``onednn_packed``: ``torch.ops.mkldnn._linear_pointwise`` on the weight packed once for 8 rows
  (``_reorder_linear_weight``), what tree decoding uses on a CPU.

End to end: the shipped draft on MT-bench first turns (greedy, 256 new tokens, CPU defaults), the same questions
with the packed head and with ``F.linear`` (``_packed_head`` returning None), alternating so that a drift of the
machine's speed hits both; the outputs must be the same tokens.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

torch.set_num_threads(2)


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[reps // 2]


def kernels() -> dict:
    torch.manual_seed(0)
    w = torch.randn(49152, 576) * 0.02
    wt = w.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 8)
    out = {}
    for m in (1, 2, 3, 4, 5, 8, 12, 16, 24, 32):
        x = torch.randn(m, 576)
        row = {
            "linear": median_ms(lambda: F.linear(x, w)),
            "transposed": median_ms(lambda: x @ wt),
            "onednn_packed": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")),
        }
        row["max_abs_diff"] = float((torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "") - F.linear(x, w)).abs().max())
        out[m] = row
        print(f"{m:3d} rows: " + "  ".join(f"{k} {v:.2f}" if k != "max_abs_diff" else f"diff {v:.1e}" for k, v in row.items()), flush=True)
    return out


def end_to_end(bench_dir: Path, questions: int) -> dict:
    from transformers import AutoModel

    from eagle3_hub import generate
    from eagle3_hub.generation import tree_decoding
    from eagle3_hub.targets import load_target

    target, tok = load_target(None)[:2]
    draft = AutoModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target)
    rows = [json.loads(line) for line in (bench_dir / "mt_bench.jsonl").read_text().splitlines() if line.strip()]
    real = tree_decoding._packed_head
    res = {"packed": [], "linear": []}
    for i, q in enumerate(rows[:questions]):
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        seqs = {}
        for name in (["packed", "linear"] if i % 2 == 0 else ["linear", "packed"]):
            tree_decoding._packed_head = real if name == "packed" else (lambda head: None)
            out = generate(target, draft, ids, max_new_tokens=256)
            tree_decoding._packed_head = real
            s = out.stats
            seqs[name] = out.sequences
            res[name].append({"tok_s": s.new_tokens / s.total_time_s, **s.per_step_ms()})
        assert torch.equal(seqs["packed"], seqs["linear"]), f"question {i}: outputs differ"
        print(f"question {i}: " + "  ".join(f"{k} {v[-1]['tok_s']:.1f} tok/s, verify {v[-1]['verify']:.1f} ms/step"
                                            for k, v in res.items()), flush=True)
    summary = {k: {m: sum(r[m] for r in v) / len(v) for m in v[0]} for k, v in res.items()}
    print("mean:", json.dumps(summary, indent=1))
    return {"per_question": res, "mean": summary}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-dir", type=Path, default=Path("../shared/benchmarks"))
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with torch.inference_mode():
        result = {"kernels_ms": kernels()}
    result["end_to_end"] = end_to_end(args.bench_dir, args.questions)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
