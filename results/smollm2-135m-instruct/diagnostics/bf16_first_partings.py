"""Where bf16 tree decoding first parts from plain bf16 greedy on the first 6 MT-bench first turns (stage-7 draft,
256 new tokens): the two tokens, their float32 logits (a float32 copy of the same weights) and their bf16 ones.

    python results/smollm2-135m-instruct/diagnostics/bf16_first_partings.py [MT_BENCH_JSONL]   # bf16_first_partings.txt
"""
import sys
import copy, json, torch
from eagle3_hub import Eagle3DraftModel, generate
from eagle3_hub.targets import load_target
from eagle3_hub.benchmark.bench import build_prompt
torch.set_num_threads(2)
t16, tok = load_target(None, dtype=torch.bfloat16)
t32 = copy.deepcopy(t16).float()
import eagle3_hub, pathlib
dpath = pathlib.Path(eagle3_hub.__file__).parent / "reference_draft/smollm2-135m-instruct"
draft = Eagle3DraftModel.from_pretrained(str(dpath), dtype=torch.bfloat16)
qs = [json.loads(l) for l in open(sys.argv[1] if len(sys.argv) > 1 else "../shared/benchmarks/mt_bench.jsonl")][:6]
for q in qs:
    ids = build_prompt(tok, q["turns"][:1], [])
    with torch.inference_mode():
        p = t16.generate(ids, max_new_tokens=256, do_sample=False)[0, ids.shape[1]:].tolist()
        o = generate(t16, draft, ids, max_new_tokens=256).sequences[0, ids.shape[1]:].tolist()
        n = min(len(p), len(o)); d = next((i for i in range(n) if p[i] != o[i]), None)
        if d is None: print(q["question_id"], "identical"); continue
        pre = torch.tensor([ids[0].tolist() + p[:d]])
        l32 = t32(pre).logits[0, -1].float(); l16 = t16(pre).logits[0, -1].float()
        top32 = l32.topk(3)
        print(q["question_id"], "diverge at", d, "plain", repr(tok.decode(p[d])), "tree", repr(tok.decode(o[d])),
              "fp32 logits plain/tree %.4f %.4f" % (l32[p[d]], l32[o[d]]), "bf16 %.4f %.4f" % (l16[p[d]], l16[o[d]]),
              "fp32 top3", [(tok.decode(i), round(v, 3)) for v, i in zip(top32.values.tolist(), top32.indices.tolist())], flush=True)
