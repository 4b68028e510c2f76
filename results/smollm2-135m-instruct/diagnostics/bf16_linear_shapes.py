"""F.linear time (median of 40, 2 threads) for the shapes of a SmolLM2 tree step, bfloat16 against float32: the
target's head (576 -> 49152) and the draft's head (576 -> 8192) over 1-8 rows, and the draft layer's projections.

    python results/smollm2-135m-instruct/diagnostics/bf16_linear_shapes.py     # output: bf16_linear_shapes.txt
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)


def median_ms(shape, n_out, dtype, n_in=576):
    x, w = torch.randn(*shape, n_in).to(dtype), torch.randn(n_out, n_in).to(dtype)
    for _ in range(5):
        F.linear(x, w)
    ts = []
    for _ in range(40):
        t0 = time.perf_counter()
        F.linear(x, w)
        ts.append(time.perf_counter() - t0)
    return 1000 * sorted(ts)[len(ts) // 2]


for shape in [(1, 1), (1, 4), (1, 8)]:
    print("heads", shape, " ".join(f"576->{n}: bf16 {median_ms(shape, n, torch.bfloat16):.3f} fp32 {median_ms(shape, n, torch.float32):.3f} ms"
                                   for n in (8192, 49152)))
for shape in [(1, 1), (1, 8)]:
    print("draft layer", shape, " ".join(f"{i}->{o}: {median_ms(shape, o, torch.bfloat16, i):.3f}"
                                         for i, o in [(1152, 576), (1152, 192), (576, 576), (576, 1536), (1536, 576), (1728, 576)]), "ms (bf16)")
