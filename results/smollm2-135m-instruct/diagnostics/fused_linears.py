"""Would fusing q/k/v and gate/up into one matrix product each speed up a bf16 verification on this CPU? SmolLM2-135M's
30 layers' linear shapes on random bf16 weights, M tokens, 2 threads, median of 30.

    python results/smollm2-135m-instruct/diagnostics/fused_linears.py

Session 13 (fused_linears.txt): no: 24.0 against 25.1 ms at 7 tokens, within noise at 1 and 16. The ~212 MB of layer
weights stream at ~8 GB/s: verification is bound by memory bandwidth, not by the number of products.
"""
import time, statistics, torch
import torch.nn.functional as F
torch.set_num_threads(2)
torch.manual_seed(0)
dt = torch.bfloat16
L = 30
def bench(fn, n=30):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000
for M in (1, 7, 16):
    x = torch.randn(1, M, 576, dtype=dt)
    xi = torch.randn(1, M, 1536, dtype=dt)
    Ws = [dict(q=torch.randn(576, 576, dtype=dt), k=torch.randn(192, 576, dtype=dt), v=torch.randn(192, 576, dtype=dt),
               o=torch.randn(576, 576, dtype=dt), g=torch.randn(1536, 576, dtype=dt), u=torch.randn(1536, 576, dtype=dt),
               d=torch.randn(576, 1536, dtype=dt)) for _ in range(L)]
    fused = [dict(qkv=torch.cat([w["q"], w["k"], w["v"]]), gu=torch.cat([w["g"], w["u"]]), o=w["o"], d=w["d"]) for w in Ws]
    def sep():
        for w in Ws:
            F.linear(x, w["q"]); F.linear(x, w["k"]); F.linear(x, w["v"]); F.linear(x, w["o"])
            F.linear(x, w["g"]); F.linear(x, w["u"]); F.linear(xi, w["d"])
    def fus():
        for w in fused:
            F.linear(x, w["qkv"]).split([576, 192, 192], -1); F.linear(x, w["o"])
            F.linear(x, w["gu"]).chunk(2, -1); F.linear(xi, w["d"])
    print(f"M={M}: separate {bench(sep):.1f} ms, fused qkv/gate-up {bench(fus):.1f} ms (30 layers)")
