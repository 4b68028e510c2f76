"""SmolLM2-135M's forward through transformers and through ``LeanTargetForward`` (float32, 2 threads); then tree
decoding end to end with each. Behind ``LEAN_FORWARD_DEVICES`` in eagle3_hub/generation/tree_decoding.py.

    python results/smollm2-135m-instruct/diagnostics/lean_forward.py [--bench-dir ../shared/benchmarks] [--out F]

Forwards (ms, median of 15, alternating): 1 and 9 tokens over a 260-token cache, the 9 under a causal 4D mask as a
verification passes one; with the largest difference of the hidden states of every layer between the two.

End to end: the shipped draft on MT-bench first turns (greedy, 256 new tokens, CPU defaults), each question with
the lean forward and with transformers' (``LEAN_FORWARD_DEVICES`` emptied), and plain ``target.generate`` for the
ratio, in rotating order so that a drift of the machine's speed hits all three; the outputs must be the same tokens.
"""

import argparse
import json
import time
from pathlib import Path

import torch

torch.set_num_threads(2)


def forwards(target) -> dict:
    from transformers import DynamicCache

    from eagle3_hub.generation.lean_target_forward import LeanTargetForward

    lean = LeanTargetForward.for_model(target, "cache")
    assert lean is not None, "the lean forward does not reproduce this target"
    L = 260
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (1, L), generator=g)
    theirs, ours = DynamicCache(), DynamicCache()
    target(prompt, cache=theirs, use_cache=True)
    target(prompt, cache=ours, use_cache=True)
    out = {}
    for n in (1, 9):
        ids = torch.randint(100, 40000, (1, n), generator=g)
        pos = torch.arange(L, L + n)[None]
        allowed = torch.ones(n, L + n, dtype=torch.bool)
        allowed[:, L:] = torch.ones(n, n, dtype=torch.bool).tril()
        mask = torch.zeros(1, 1, n, L + n).masked_fill(~allowed, torch.finfo(torch.float32).min)

        def hf():
            r = target.model(ids, cache=theirs, use_cache=True, attention_mask=mask, position_ids=pos,
                             output_hidden_states=True)
            theirs.crop(-n)
            return r.hidden_states

        def lf():
            r = lean(ids, pos, mask, ours)[1]
            ours.crop(-n)
            return r

        diff = max(float((a - b).abs().max()) for a, b in zip(hf(), lf()))
        times = {"transformers": [], "lean": []}
        for _ in range(15):
            for name, fn in (("transformers", hf), ("lean", lf)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        out[n] = {k: 1000 * sorted(v)[len(v) // 2] for k, v in times.items()} | {"max_abs_diff": diff}
        print(f"{n} tokens: transformers {out[n]['transformers']:.1f} ms, lean {out[n]['lean']:.1f} ms, "
              f"hidden states differ by {diff:.1e}", flush=True)
    return out


def end_to_end(target, tok, bench_dir: Path, questions: int) -> dict:
    from transformers import AutoModel

    from eagle3_hub import generate
    from eagle3_hub.generation import tree_decoding

    draft = AutoModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target)
    rows = [json.loads(line) for line in (bench_dir / "mt_bench.jsonl").read_text().splitlines() if line.strip()]
    devices = tree_decoding.LEAN_FORWARD_DEVICES
    order = ["lean", "transformers", "plain"]
    res = {k: [] for k in order}
    for i, q in enumerate(rows[:questions]):
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        seqs = {}
        for name in order[i % 3:] + order[: i % 3]:
            if name == "plain":
                t0 = time.perf_counter()
                seqs[name] = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=256,
                                             do_sample=False)
                n = seqs[name].shape[1] - ids.shape[1]
                res[name].append({"tok_s": n / (time.perf_counter() - t0)})
                continue
            tree_decoding.LEAN_FORWARD_DEVICES = devices if name == "lean" else ()
            out = generate(target, draft, ids, max_new_tokens=256)
            tree_decoding.LEAN_FORWARD_DEVICES = devices
            s = out.stats
            assert s.lean_forward == (name == "lean")
            seqs[name] = out.sequences
            res[name].append({"tok_s": s.new_tokens / s.total_time_s, "acceptance": s.mean_acceptance_length,
                              **s.per_step_ms()})
        n = min(x.shape[1] for x in seqs.values())
        assert all(torch.equal(x[:, :n], seqs["plain"][:, :n]) for x in seqs.values()), f"question {i}: outputs differ"
        print(f"question {i}: " + "  ".join(f"{k} {v[-1]['tok_s']:.1f} tok/s" for k, v in res.items())
              + f"  verify {res['lean'][-1]['verify']:.1f} / {res['transformers'][-1]['verify']:.1f} ms/step", flush=True)
    mean = {k: {m: sum(r[m] for r in v) / len(v) for m in v[0]} for k, v in res.items()}
    for k in ("lean", "transformers"):
        mean[k]["speedup_vs_plain"] = mean[k]["tok_s"] / mean["plain"]["tok_s"]
    print("mean:", json.dumps(mean, indent=1))
    return {"per_question": res, "mean": mean}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-dir", type=Path, default=Path("../shared/benchmarks"))
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from eagle3_hub.targets import load_target

    target, tok = load_target(None)[:2]
    with torch.inference_mode():
        result = {"forwards_ms": forwards(target)}
    result["end_to_end"] = end_to_end(target, tok, args.bench_dir, args.questions)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
