import os, time, torch, json, sys
from transformers import DynamicCache
from eagle3_hub.targets import load_target
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub import generate
torch.set_num_threads(int(sys.argv[1]))
target, tok = load_target(None, dtype=torch.float32)
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target).float()
q = [json.loads(l) for l in open(os.environ.get("MT_BENCH", "../shared/benchmarks/mt_bench.jsonl"))][0]
text = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=False)
ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
print("prompt", ids.shape)
out = generate(target, draft, ids, max_new_tokens=64, do_sample=False)
st = out.stats
print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(st).items() if not isinstance(v, list)})
# raw forwards at ~ the same cache length
with torch.no_grad():
    cache = DynamicCache(config=target.config); L = ids.shape[1] + 60
    target(torch.randint(100, 40000, (1, L)), past_key_values=cache, use_cache=True)
    for n, masked in [(1, False), (9, False), (9, True)]:
        ts = []
        for r in range(6):
            x = torch.randint(100, 40000, (1, n))
            kw = {}
            if masked:
                allowed = torch.ones(1, n, L + n, dtype=torch.bool); allowed[0, :, L:] = torch.eye(n, dtype=torch.bool) | torch.tril(torch.ones(n, n, dtype=torch.bool))
                m = torch.zeros(1, 1, n, L + n); m.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
                kw = dict(attention_mask=m, position_ids=torch.arange(L, L + n)[None])
            t0 = time.perf_counter(); target(x, past_key_values=cache, use_cache=True, output_hidden_states=True, logits_to_keep=n, **kw); ts.append(time.perf_counter() - t0); cache.crop(-n)
        ts.sort(); print(n, "masked" if masked else "causal", f"{1000*ts[len(ts)//2]:.1f} ms")
