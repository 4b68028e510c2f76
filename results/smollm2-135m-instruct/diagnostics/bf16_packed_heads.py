"""Heads in bfloat16 over the few rows a CPU tree step needs: ``F.linear`` against oneDNN on a weight packed once
(``torch.ops.mkldnn._reorder_linear_weight``, what ``_packed_head`` in eagle3_hub/generation/tree_decoding.py uses
for float32 heads). SmolLM2-135M's head (49,152 x 576) and the draft's (8,192 / 16,384 x 576), 2 threads, random
weights, median of 30; ``equal``: the two kernels gave the same bf16 numbers.

    python results/smollm2-135m-instruct/diagnostics/bf16_packed_heads.py [--out F]
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

torch.set_num_threads(2)


def median_ms(fn, reps: int = 30) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[reps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
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
                    "linear": median_ms(lambda: F.linear(x, w)),
                    "onednn_packed": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")),
                    "equal": bool(torch.equal(got, F.linear(x, w))),
                }
                print(f"{vocab:6d} x 576, {m:2d} rows: linear {rows[m]['linear']:.2f} ms  packed "
                      f"{rows[m]['onednn_packed']:.2f} ms  equal {rows[m]['equal']}", flush=True)
            result["heads"][vocab] = rows
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
