import os, sys, time, torch
from eagle3_hub.targets import load_target
torch.set_num_threads(2)
# FORWARD_DTYPE=bfloat16 for bf16 (session 7: 1 / 19 tokens 30 / 219 ms, against 69 / 125 in float32: no bf16 units)
dtype = getattr(torch, os.environ.get("FORWARD_DTYPE", "float32"))
t = load_target(None, dtype=dtype)
t = t[0] if isinstance(t, tuple) else t
from transformers import DynamicCache
ids = torch.randint(100, 40000, (1, 200))
with torch.no_grad():
    cache = DynamicCache(config=t.config)
    t(ids, past_key_values=cache, use_cache=True)
    for n in [int(a) for a in sys.argv[1:]] or [1, 4, 9, 16, 32]:  # token counts
        ts = []
        for r in range(8):
            x = torch.randint(100, 40000, (1, n))
            t0 = time.perf_counter()
            t(x, past_key_values=cache, use_cache=True, logits_to_keep=n)
            ts.append(time.perf_counter() - t0)
            cache.crop(-n)
        ts.sort(); print(n, "tokens", f"{1000*ts[len(ts)//2]:.1f} ms (min {1000*ts[0]:.1f})", flush=True)
    # without lm_head
    for n in [1, 9]:
        ts=[]
        for r in range(8):
            x = torch.randint(100, 40000, (1, n))
            t0 = time.perf_counter(); t.model(x, past_key_values=cache, use_cache=True); ts.append(time.perf_counter()-t0); cache.crop(-n)
        ts.sort(); print(n, "tokens body only", f"{1000*ts[len(ts)//2]:.1f} ms", flush=True)
