"""Where one draft forward at a tree level goes (session 13): the reference draft in bf16, 8 tree nodes over a
300-slot draft cache, on this CPU, 2 threads; module forward against its pieces, then torch.profiler by op.

    python results/smollm2-135m-instruct/diagnostics/draft_forward_ops.py

Output of session 13's run (training paused) in draft_forward_ops.txt: matrix products are ~72% of the forward's
CPU time, so a lean draft forward (plain tensor ops, as the target's) could save at most ~0.7 ms a call.
"""
import time, statistics, torch
import torch.nn.functional as F
from eagle3_hub import Eagle3DraftModel
from eagle3_hub.targets import load_target
from eagle3_hub.generation.tree_decoding import TreeKVCache, _additive_mask
torch.set_num_threads(2)
target, _ = load_target(None, dtype=torch.bfloat16)
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target).to(torch.bfloat16).eval()
cfg = draft.config
C = 300
cache = TreeKVCache(1, 512)
k = torch.randn(1, cfg.num_key_value_heads, C, cfg.head_dim, dtype=torch.bfloat16)
cache.load([(k, k.clone())])
s = 8
tok = torch.randint(0, 49152, (1, s))
emb = F.embedding(tok, draft.embed_tokens.weight)
hid = torch.randn(1, s, cfg.hidden_size, dtype=torch.bfloat16)
pos = torch.full((1, s), C)
allowed = torch.ones(1, s, C + s, dtype=torch.bool)
def run_module():
    out = draft(inputs_embeds=emb, hidden_states=hid, position_ids=pos, attention_mask=_additive_mask(allowed, torch.bfloat16), cache=cache, use_cache=True)
    cache.rollback()
    return out.logits
def bench(fn, n=200):
    for _ in range(20): fn()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); fn(); ts.append(time.perf_counter()-t0)
    return statistics.median(ts)*1000
with torch.no_grad():
    print("module forward ms", bench(run_module))
    # pieces
    W = draft.lm_head.weight
    x = torch.randn(1, s, cfg.hidden_size, dtype=torch.bfloat16)
    print("lm_head ms", bench(lambda: F.linear(x, W)))
    mlp = draft.midlayer.mlp
    print("mlp ms", bench(lambda: mlp(x)))
    x2 = torch.randn(1, s, 2*cfg.hidden_size, dtype=torch.bfloat16)
    a = draft.midlayer.self_attn
    print("qkv ms", bench(lambda: (a.q_proj(x2), a.k_proj(x2), a.v_proj(x2))))
    print("norm ms", bench(lambda: draft.norm(x)))
    print("rotary ms", bench(lambda: draft.rotary_emb(x, pos)))
    print("mask ms", bench(lambda: _additive_mask(allowed, torch.bfloat16)))
    q = torch.randn(1, cfg.num_attention_heads, s, cfg.head_dim, dtype=torch.bfloat16)
    kk = torch.randn(1, cfg.num_key_value_heads, C+s, cfg.head_dim, dtype=torch.bfloat16)
    m = _additive_mask(allowed, torch.bfloat16)
    from transformers.models.llama.modeling_llama import repeat_kv
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    print("sdpa+repeat ms", bench(lambda: F.scaled_dot_product_attention(q, repeat_kv(kk, g), repeat_kv(kk, g), attn_mask=m)))
    print("sdpa gqa ms", bench(lambda: F.scaled_dot_product_attention(q, kk, kk, attn_mask=m, enable_gqa=True)))
    print("sdpa gqa bool ms", bench(lambda: F.scaled_dot_product_attention(q, kk, kk, attn_mask=allowed[:, None], enable_gqa=True)))
    print("fp32 logsoftmax+topk ms", bench(lambda: torch.log_softmax(torch.randn(1, s, 8192).float(), -1).topk(8, -1)))
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            run_module()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
