"""Time of SmolLM2-135M's lm_head (49,152 x 576, fp32, 2 threads) and of its 30 decoder layers' linear layers for
1-16, 24 and 32 rows, on weights that do not fit in the cache (as in a forward). Behind ``LOGITS_ROWS_MULTIPLE``
in eagle3_hub/generation/tree_decoding.py. Session 5, training paused (ms, median of 7):

    rows      1     2     3     4     5     6     7     8     9    11    12    16
    lm_head  10.7  23.8  35.5  16.9  17.2  24.6  35.8  17.7  23.8  40.2  18.1  21.0
    layers   41.2  56.0  66.7  51.9  43.3  44.5  53.2  50.9  74.0  65.2  61.0  58.5

MKL's small-batch sgemm on this AMD EPYC (AVX2) is fastest for a multiple of 4 rows; the layers' timings are
noisier (a whole forward varies by ~10% from run to run here).
"""

import time

import torch
import torch.nn as nn

torch.set_num_threads(2)
torch.manual_seed(0)
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30  # (out, in)
layers = [nn.Linear(i, o, bias=False) for o, i in SHAPES]
head = nn.Linear(576, 49152, bias=False)


def body(m):
    x, x2 = torch.randn(m, 576), torch.randn(m, 1536)
    for lin, (_, i) in zip(layers, SHAPES):
        lin(x if i == 576 else x2)


def lm_head(m):
    head(torch.randn(m, 576))


def median_ms(fn, m, n=7):
    fn(m)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(m)
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1e3


with torch.no_grad():
    for m in list(range(1, 17)) + [24, 32]:
        print(f"{m:3d} rows: lm_head {median_ms(lm_head, m):5.1f} ms, decoder linear layers {median_ms(body, m):5.1f} ms", flush=True)
