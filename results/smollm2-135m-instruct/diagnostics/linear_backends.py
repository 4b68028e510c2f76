"""Can a better matmul make a verification cheaper on this CPU? (Session 8: no.)

SmolLM2-135M's decoder linear layers (30 layers of q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536,
float32, random weights, 2 threads) for M rows (tokens), median of 7, by how the product is computed:

- ``linear``: ``F.linear`` (MKL sgemm, what transformers runs);
- ``mkl_packed``: MKL's packed-weight sgemm (``torch.ops.mkl._mkl_linear`` on weights reordered for M rows);
- ``onednn``: oneDNN (``torch._C._nn.mkldnn_linear`` on mkldnn tensors);
- ``fused``: q/k/v as one 960x576 product and gate/up as one 3072x576 (4 products per layer instead of 7).

    python results/smollm2-135m-instruct/diagnostics/linear_backends.py

Session 8, three runs (ms for the 30 layers, 1 / 8 / 19 / 32 rows). Ad-hoc scripts on an idle machine: linear
38 / 57 / 78 / 103, onednn 38 / 61 / 78 / 100; linear 56 / 82 / 100 vs mkl_packed 63 / 87 / 115 (8 / 19 / 32
rows); linear 39 / 48 / 66 vs fused 38 / 45 / 65 (1 / 8 / 19 rows). This script twice, with the stage-6 training
paused: linear 43 / 46 / 80 / 79 and 39 / 56 / 76 / 97, mkl_packed 37 / 64 / 86 / 99 and 37 / 63 / 87 / 104,
onednn 30 / 51 / 69 / 91 and 33 / 54 / 69 / 87, fused 40 / 46 / 78 / 96 and 39 / 55 / 77 / 102. A 2048^3 product
runs at ~150 GFLOP/s, 19 rows at ~40 (one row is memory-bound: ~8.5 GB/s). Packing and fusion do not help;
oneDNN was 0-17% faster than MKL in some runs and not in others, at one row as much as at 8-32, so it would
speed a plain step as much as a verification and leave their ratio as it is. The cost of a verification here is
the kernels', not our code's.
"""

import time

import torch
import torch.nn.functional as F

LAYERS = 30
SHAPES = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576), "gate": (1536, 576),
          "up": (1536, 576), "down": (576, 1536)}


def median_ms(fn, reps: int = 7) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[reps // 2]


def costs(w: dict, m: int) -> list[float]:
    """ms of the 30 layers' products for m rows: linear, mkl_packed, onednn, fused."""
    x = {name: torch.randn(m, shape[1]) for name, shape in SHAPES.items()}
    packed = {name: [torch.ops.mkl._mkl_reorder_linear_weight(t, m) for t in ws] for name, ws in w.items()}
    dnn = {name: [t.to_mkldnn() for t in ws] for name, ws in w.items()}
    qkv = [torch.cat([w["q"][i], w["k"][i], w["v"][i]]) for i in range(LAYERS)]
    gate_up = [torch.cat([w["gate"][i], w["up"][i]]) for i in range(LAYERS)]

    def linear():
        for name, ws in w.items():
            for t in ws:
                F.linear(x[name], t)

    def mkl_packed():
        for name, ws in w.items():
            for p, t in zip(packed[name], ws):
                torch.ops.mkl._mkl_linear(x[name], p, t, None, m)

    def onednn():
        for name, ws in dnn.items():
            xd = x[name].to_mkldnn()
            for t in ws:
                torch._C._nn.mkldnn_linear(xd, t).to_dense()

    def fused():
        for i in range(LAYERS):
            F.linear(x["q"], qkv[i])
            F.linear(x["o"], w["o"][i])
            F.linear(x["gate"], gate_up[i])
            F.linear(x["down"], w["down"][i])

    return [median_ms(fn) for fn in (linear, mkl_packed, onednn, fused)]


def main():
    torch.set_num_threads(2)
    w = {name: [torch.randn(*shape) for _ in range(LAYERS)] for name, shape in SHAPES.items()}
    print("rows | linear | mkl_packed | onednn | fused   (ms, 30 layers)")
    for m in (1, 8, 19, 32):
        print(f"{m:4d} | " + " | ".join(f"{c:6.1f}" for c in costs(w, m)), flush=True)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    print(f"2048^3 product: {2 * 2048**3 / median_ms(lambda: a @ b) / 1e6:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
