"""The adaptive tree against the same forward where it drafts (almost) nothing: the embedded SmolLM2-135M-Instruct
and its reference draft in float32, the first B of the 8 MT-bench first turns of mt_bench_8.jsonl, left-padded, N
new tokens past the end-of-sequence token, greedy (T=0) or top-p 0.9 at temperature T. One warm-up run of each, then
REPS rounds, each a `same_forward_generate` run ("sf") and a `generate(..., adaptive=True)` run ("tree"), their
order alternating, so that a drift of the machine's speed slows both alike. Per run it prints the wall seconds and
the seconds inside each phase (calls, seconds; timed by wrapping the phases' methods), then the median over the
rounds of sf seconds / tree seconds (above 1: the tree faster) by wall and by process CPU time.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/smollm2-135m-instruct/adaptive-none-cost/interleaved.py \
        THREADS B N T REPS      # e.g. 2 8 256 0 6 (greedy batch 8), 2 4 256 1 6 (T=1 batch 4)
"""

import collections
import json
import statistics as S
import sys
import time

import torch

from eagle3_hub.targets import load_target
from eagle3_hub.generation.tree.api import generate, load_draft
from eagle3_hub.generation.tree.same_forward import same_forward_generate
from eagle3_hub.generation.tree import decode as D, verification as V, drafting as DR, controller as C
torch.set_num_threads(int(sys.argv[1])); B = int(sys.argv[2]); N = int(sys.argv[3]); T = float(sys.argv[4]); reps = int(sys.argv[5])
target, tok = load_target(None, dtype=torch.float32)
draft = load_draft("eagle3_hub/reference_draft/smollm2-135m-instruct", target)
qs = [json.loads(l) for l in open("benchmarks/smollm2-135m-instruct/modes-and-batches/mt_bench_8.jsonl")]
texts = [tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=False, add_generation_prompt=True) for q in qs][:B]
tok.padding_side = "left"
enc = tok(texts, return_tensors="pt", padding=True)
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(cls, name, key=None):
    f = getattr(cls, name)
    def g(self, *a, **k):
        t = time.perf_counter(); r = f(self, *a, **k); acc[key or name] += time.perf_counter() - t; cnt[key or name] += 1; return r
    setattr(cls, name, g)
wrap(D.TreeDecoder, "plain_step"); wrap(V.Verifier, "prefill"); wrap(DR.Drafter, "read"); wrap(C.TreeController, "choose"); wrap(C.TreeController, "observe")
wrap(DR.Drafter, "draft_tree"); wrap(V.Verifier, "verify")
wrap(D.TreeDecoder, "_lookup_chain"); wrap(D.TreeDecoder, "_emit_all"); wrap(D.TreeDecoder, "_advance")
import eagle3_hub.generation.tree.decode as DD
_sc = DD.step_costs
def sc(*a, **k):
    t = time.perf_counter(); r = _sc(*a, **k); acc["step_costs"] += time.perf_counter() - t; cnt["step_costs"] += 1; return r
DD.step_costs = sc
orig_step = D.TreeDecoder.step
def step(self, depth, chain=None, shape=None):
    t = time.perf_counter(); r = orig_step(self, depth, chain, shape)
    if depth >= 1 or chain is not None: acc["tree_step"] += time.perf_counter() - t; cnt["tree_step"] += 1
    return r
D.TreeDecoder.step = step
kw = dict(do_sample=T > 0, temperature=T or 1.0, top_p=0.9)
def sf(g):
    return same_forward_generate(target, enc.input_ids, N, enc.attention_mask, eos_token_id=[], pad_token_id=tok.pad_token_id, generator=g, **kw)[0]
def tr(g):
    return generate(target, draft, enc.input_ids, enc.attention_mask, max_new_tokens=N, eos_token_id=[], adaptive=True, generator=g, **kw).sequences
sf(torch.Generator().manual_seed(0)); tr(torch.Generator().manual_seed(0))
tot = collections.defaultdict(list); cpu = collections.defaultdict(list)
for r in range(reps):
    for name, f in ((("sf", sf), ("tree", tr)) if r % 2 == 0 else (("tree", tr), ("sf", sf))):
        acc.clear(); cnt.clear()
        t = time.perf_counter(); c0 = time.process_time(); f(torch.Generator().manual_seed(r)); dt = time.perf_counter() - t; cpu[name].append(time.process_time() - c0)
        tot[name].append(dt)
        print(name, round(dt, 2), {k: (cnt[k], round(v, 3)) for k, v in acc.items()}, flush=True)
        if name == "tree": print("   none-step mean ms", round(1000 * acc["plain_step"] / max(cnt["plain_step"], 1), 2))
        else: print("   sf verify mean ms", round(1000 * acc["verify"] / max(cnt["verify"], 1), 2))
r = [a / b for a, b in zip(tot["sf"], tot["tree"])]; rc = [a / b for a, b in zip(cpu["sf"], cpu["tree"])]
print("MEDIAN wall ratio", round(S.median(r), 3), "cpu ratio", round(S.median(rc), 3), "cpu per rep", [round(x, 3) for x in rc])
print("sf/tree per rep", [round(a / b, 3) for a, b in zip(tot["sf"], tot["tree"])], "sum ratio", round(sum(tot["sf"]) / sum(tot["tree"]), 3))
