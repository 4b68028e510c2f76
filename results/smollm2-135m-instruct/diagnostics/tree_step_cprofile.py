"""Where a bf16 tree step goes: cProfile of tree decoding (stage-7 draft, CPU bf16 defaults) on MT-bench first turns
2-4, 256 new tokens, cumulative ms per step of eagle3_hub's functions (the profiler inflates them ~20%).

    python results/smollm2-135m-instruct/diagnostics/tree_step_cprofile.py [MT_BENCH_JSONL]   # tree_step_cprofile.txt
"""
import sys
import cProfile, pstats, json, torch
from eagle3_hub import Eagle3DraftModel, generate
from eagle3_hub.targets import load_target
from eagle3_hub.benchmark.bench import build_prompt
torch.set_num_threads(2)
t, tok = load_target(None, dtype=torch.bfloat16)
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=t, dtype=torch.bfloat16)
qs = [json.loads(l) for l in open(sys.argv[1] if len(sys.argv) > 1 else "../shared/benchmarks/mt_bench.jsonl")][1:4]
with torch.inference_mode():
    generate(t, draft, build_prompt(tok, qs[0]["turns"][:1], []), max_new_tokens=32)
    pr = cProfile.Profile(); pr.enable()
    steps = 0
    for q in qs:
        out = generate(t, draft, build_prompt(tok, q["turns"][:1], []), max_new_tokens=256); steps += out.stats.steps
    pr.disable()
print("steps", steps)
st = pstats.Stats(pr); st.sort_stats("cumulative")
rows = []
for (f, l, name), (cc, nc, tt, ct, callers) in st.stats.items():
    if "eagle3_hub" in f or name in ("linear", "scaled_dot_product_attention", "topk", "log_softmax", "tolist"):
        rows.append((ct, tt, nc, name, f.split("/")[-1]))
for ct, tt, nc, name, f in sorted(rows, reverse=True)[:30]:
    print(f"{1000*ct/steps:7.2f} ms/step cum  {1000*tt/steps:6.2f} self  {nc:7d} calls  {name} ({f})")
