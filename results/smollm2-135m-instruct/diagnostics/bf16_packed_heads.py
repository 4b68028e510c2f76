"""Heads in bfloat16 over the few rows a CPU tree step needs: ``F.linear`` against oneDNN on a weight packed once
(``torch.ops.mkldnn._reorder_linear_weight``, what ``_packed_head`` in eagle3_hub/generation/tree_decoding.py uses
for float32 heads). SmolLM2-135M's head (49,152 x 576) and the draft's (8,192 / 16,384 x 576), 2 threads, random
weights, median of 30; ``equal``: the two kernels gave the same bf16 numbers.

``--questions N``: then tree decoding end to end in bf16 (the shipped draft, MT-bench first turns, 256 new tokens,
CPU bf16 defaults) with both heads packed and with neither (``_packed_head`` returning None), alternating per
question so that a drift of the machine's speed hits both; the outputs must be the same tokens.

    python results/smollm2-135m-instruct/diagnostics/bf16_packed_heads.py [--questions 8] [--bench-dir ../shared/benchmarks] [--out F]
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_head_kernels import median_ms  # this folder's float32 head timings: the same timer

torch.set_num_threads(2)


def end_to_end(bench_dir: Path, questions: int) -> dict:
    from transformers import AutoModel

    from eagle3_hub import generate
    from eagle3_hub.generation import tree_decoding
    from eagle3_hub.targets import load_target

    target, tok = load_target(None, dtype=torch.bfloat16)[:2]
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
            try:
                out = generate(target, draft, ids, max_new_tokens=256)
            finally:
                tree_decoding._packed_head = real
            s = out.stats
            seqs[name] = out.sequences
            res[name].append({"tok_s": s.new_tokens / s.total_time_s, "new_tokens": s.new_tokens,
                              "time_s": s.total_time_s, **s.per_step_ms()})
        assert torch.equal(seqs["packed"], seqs["linear"]), f"question {i}: outputs differ"
        print(f"question {i}: " + "  ".join(f"{k} {v[-1]['tok_s']:.1f} tok/s" for k, v in res.items()), flush=True)
    summary = {k: {"tok_s": sum(r["new_tokens"] for r in v) / sum(r["time_s"] for r in v),
                   **{m: sum(r[m] for r in v) / len(v) for m in v[0] if m not in ("tok_s", "new_tokens", "time_s")}}
               for k, v in res.items()}
    print("all:", json.dumps(summary, indent=1))
    return {"per_question": res, "all": summary}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--questions", type=int, default=0)
    ap.add_argument("--bench-dir", type=Path, default=Path("../shared/benchmarks"))
    args = ap.parse_args()
    torch.manual_seed(0)
    result = {"cpu_bf16_supported": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "heads": {}}
    with torch.inference_mode():
        for vocab in (49152, 16384, 8192):
            w = (torch.randn(vocab, 576) * 0.02).bfloat16()
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 8)
            rows = {}
            for m in (1, 4, 8, 12, 16):
                x = torch.randn(m, 576).bfloat16()
                got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                rows[m] = {
                    "linear": median_ms(lambda: F.linear(x, w), reps=30),
                    "onednn_packed": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), reps=30),
                    "equal": bool(torch.equal(got, F.linear(x, w))),
                }
                print(f"{vocab:6d} x 576, {m:2d} rows: linear {rows[m]['linear']:.2f} ms  packed "
                      f"{rows[m]['onednn_packed']:.2f} ms  equal {rows[m]['equal']}", flush=True)
            result["heads"][vocab] = rows
    if args.questions:
        with torch.inference_mode():
            result["end_to_end"] = end_to_end(args.bench_dir, args.questions)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
