"""Tree decoding on a randomly initialised Llama target of a chosen size: a lossless check and a timing run
for a device where no trained target/draft pair can be downloaded (an accelerator lent without internet).

    python -m eagle3_hub.commands.random_target --size 1b --device cuda --out random-target

What it measures (one JSON + one Markdown table in ``--out``):
  * lossless: float32 tree decoding equals plain greedy ``target.generate`` token for token (batch 1, three
    prompt lengths, and a left-padded batch row by row); bfloat16 agreement (first diverging position).
  * the target forward's cost by number of verified tokens (1 .. 128 behind a 512-token cache): what a
    tree of N nodes costs on this device compared with one plain decoding step.
  * bfloat16 tokens/s of plain greedy, assisted generation (our draft as ``assistant_model``) and tree
    decoding variants (``VARIANTS``: tree shapes, the lookup branch on/off, the draft's CUDA graph on/off),
    with the per-step draft / verify / overhead split and the *break-even acceptance length* (step time /
    plain time per token): the acceptance a trained draft needs for 1x, and twice that for 2x, on this device.
    Every method runs on the same attention kernels (``attention_kernels``: no cuDNN SDPA on CUDA).

The draft is a "copy draft" (no training possible without the target's data): ``fc`` passes the last aux
feature (the output of the last decoder layer) so the draft proposes the target's own last prediction down
the tree. A random target often repeats itself, so its acceptance is high where the text loops and 1
elsewhere; it is not a trained draft's acceptance, which is why the break-even numbers are reported.
"""

from __future__ import annotations

import copy
import platform
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.cache_utils import DynamicCache

from .. import Eagle3DraftModel
from ..atomic import atomic_write_json, atomic_write_text
from ..generation.tree import attention_kernels, generate

# Llama shapes by size (TinyLlama-1.1B for "1b"); "tiny" is for a CPU dry run of this script.
SIZES = {
    "tiny": dict(
        hidden_size=128, intermediate_size=344, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, vocab_size=1024
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
}
# tree decoding variants timed: (depth, top_k, total_tokens, lookup_tokens, draft_graph); the first = CUDA default.
# The second and third isolate the CUDA graph of the draft's tree levels and the lookup branch.
VARIANTS = [
    (6, 10, 60, 20, True),
    (6, 10, 60, 20, False),
    (6, 10, 60, 0, True),
    (4, 4, 8, 20, True),
    (8, 10, 80, 20, True),
]


def random_target(size: str, device: str, seed: int = 0):
    config = LlamaConfig(**SIZES[size], max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return target.eval()


def copy_draft(target, **kwargs) -> Eagle3DraftModel:
    """A draft whose tree repeats the target's last prediction (see the module docstring); ``kwargs`` go to
    ``Eagle3DraftModel.from_target``. The tests' copy draft too."""
    H = target.config.hidden_size
    draft = Eagle3DraftModel.from_target(target, **kwargs)
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * H :] = torch.eye(H, device=draft.fc.weight.device)
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight)
    return draft.eval()


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def plain_greedy(target, ids, mask, max_new_tokens):
    return target.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )


def prompts(vocab: int, lengths, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).to(device) for n in lengths]


def _tree_kwargs(variant) -> dict:
    depth, k, n, lookup, graph = variant
    return dict(depth=depth, tree_top_k=k, total_tokens=n, lookup_tokens=lookup, draft_graph=graph)


def lossless(target, draft, device, new_tokens: int, variant) -> dict:
    rows = []
    ps = prompts(target.config.vocab_size, (32, 100, 200), device)
    for p in ps:
        ids, mask = p[None], torch.ones_like(p[None])
        ref = plain_greedy(target, ids, mask, new_tokens)
        out = generate(
            target, draft, ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=[], **_tree_kwargs(variant)
        )
        rows.append(
            {
                "prompt_len": len(p),
                "equal": bool(torch.equal(out.sequences, ref)),
                "acceptance": round(out.stats.mean_acceptance_length, 2),
            }
        )
    L = max(len(p) for p in ps)
    ids = torch.zeros(len(ps), L, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, L - len(p) :], mask[i, L - len(p) :] = p, 1
    out = generate(
        target, draft, ids, attention_mask=mask, max_new_tokens=new_tokens // 2, eos_token_id=[], **_tree_kwargs(variant)
    )
    batch_equal = all(
        torch.equal(out.sequences[i, L:], plain_greedy(target, p[None], torch.ones_like(p[None]), new_tokens // 2)[0, len(p) :])
        for i, p in enumerate(ps)
    )
    return {
        "batch1": rows,
        "batch3_left_padded_rows_equal": batch_equal,
        "all_equal": batch_equal and all(r["equal"] for r in rows),
    }


def bf16_agreement(target, draft, device, new_tokens: int, variant) -> list[dict]:
    rows = []
    for p in prompts(target.config.vocab_size, (32, 100, 200), device, seed=2):
        ids, mask = p[None], torch.ones_like(p[None])
        ref = plain_greedy(target, ids, mask, new_tokens)[0, len(p) :]
        out = generate(
            target, draft, ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=[], **_tree_kwargs(variant)
        ).sequences[0, len(p) :]
        diff = (out != ref).nonzero()
        rows.append({"prompt_len": len(p), "first_divergence": int(diff[0]) if len(diff) else None, "equal": not len(diff)})
    return rows


@torch.no_grad()
def forward_cost(target, device, context: int = 512, sizes=(1, 4, 8, 16, 32, 64, 128), repeats: int = 20) -> dict:
    """Milliseconds of one target forward of n new tokens behind a ``context``-token cache (median)."""
    vocab = target.config.vocab_size
    prefix = DynamicCache(config=target.config)
    target(input_ids=torch.randint(3, vocab, (1, context), device=device), past_key_values=prefix, use_cache=True)
    result = {}
    for n in sizes:
        ids = torch.randint(3, vocab, (1, n), device=device)
        times = []
        for r in range(repeats + 3):
            cache = copy.deepcopy(prefix)  # (crop's argument changed meaning across transformers 5.x)
            sync(device)
            t0 = time.perf_counter()
            target(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
            sync(device)
            if r >= 3:
                times.append(time.perf_counter() - t0)
        result[n] = round(1e3 * sorted(times)[len(times) // 2], 3)
    return result


def timing(
    target, draft, device, new_tokens: int, variants, num_prompts: int = 3, on_result=print, result: dict | None = None
) -> dict:
    ps = prompts(target.config.vocab_size, (64, 128, 192)[:num_prompts], device, seed=3)
    one = lambda p: (p[None], torch.ones_like(p[None]))  # noqa: E731

    def timed(fn):
        fn(ps[0][:16], 16)  # warm-up
        sync(device)
        t0, toks, extra = time.perf_counter(), 0, []
        for p in ps:
            n, e = fn(p, new_tokens)
            toks += n
            extra.append(e)
        sync(device)
        return toks / (time.perf_counter() - t0), extra

    def plain(p, m):
        out = plain_greedy(target, *one(p), m)
        return out.shape[1] - len(p), None

    def assisted(p, m):
        out = target.generate(
            *one(p)[:1],
            attention_mask=one(p)[1],
            assistant_model=draft,
            max_new_tokens=m,
            min_new_tokens=m,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
        return out.shape[1] - len(p), {k: v for k, v in draft.last_assisted_stats.items() if k != "rounds"}

    result = {} if result is None else result  # filled as it goes (on_result may save it)
    tps, _ = timed(plain)
    result["plain_tok_s"] = round(tps, 1)
    on_result(result)
    plain_ms = 1e3 / tps
    draft.bind(target)
    tps, stats = timed(assisted)
    result["assisted_tok_s"] = round(tps, 1)
    result["assisted_stats"] = stats
    on_result(result)
    result["tree"] = []
    for variant in variants:

        def tree(p, m, variant=variant):
            out = generate(target, draft, *one(p), max_new_tokens=m, eos_token_id=[], **_tree_kwargs(variant))
            return out.stats.new_tokens, out.stats

        depth, k, n, lookup, graph = variant
        row = {"depth": depth, "top_k": k, "total_tokens": n, "lookup_tokens": lookup, "draft_graph": graph}
        try:
            tps, stats = timed(tree)
        except Exception as e:  # one variant failing (e.g. graph capture on a new driver) must not hide the rest
            result["tree"].append({**row, "error": f"{type(e).__name__}: {e}"})
            on_result(result["tree"][-1])
            continue
        steps = sum(s.steps for s in stats)
        ms = {
            ph: round(1e3 * sum(getattr(s, f"{ph}_time_s") for s in stats) / steps, 2) for ph in ("draft", "verify", "overhead")
        }
        acc = sum(s.new_tokens for s in stats) / sum(s.target_forwards for s in stats)
        step_ms = sum(ms.values())
        result["tree"].append(
            {
                **row,
                "tok_s": round(tps, 1),
                "speedup_vs_plain": round(tps / result["plain_tok_s"], 2),
                "acceptance": round(acc, 2),
                "per_step_ms": ms,
                "break_even_acceptance": round(step_ms / plain_ms, 2),
            }
        )
        on_result(result["tree"][-1])
    return result


def markdown(r: dict) -> str:
    lines = [
        f"# Tree decoding on a random {r['size']} Llama target ({r['device_name']})",
        "",
        f"torch {r['torch']}, transformers {r['transformers']}; {r['new_tokens']} new tokens per prompt.",
        "",
        f"Lossless float32 (depth, top_k, total_tokens, lookup_tokens, draft_graph = {r['lossless_shape']}): all equal to plain greedy = **{r['lossless']['all_equal']}**; "
        f"batch-1 rows {r['lossless']['batch1']}; left-padded batch of 3 rows equal: {r['lossless']['batch3_left_padded_rows_equal']}.",
        "",
        f"bfloat16 agreement with bf16 plain greedy: {r['bf16_agreement']}",
        "",
        "Target forward (bf16) behind a 512-token cache, ms by tokens verified: "
        + ", ".join(f"{n}: {ms}" for n, ms in r["forward_ms"].items()),
        "",
        f"plain greedy {r['timing']['plain_tok_s']} tok/s; assisted {r['timing']['assisted_tok_s']} tok/s",
        "",
        "| depth | top_k | total | lookup | draft graph | tok/s | x plain | acceptance | draft ms | verify ms | overhead ms | break-even acceptance |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in r["timing"]["tree"]:
        if "error" in t:
            lines.append(
                f"| {t['depth']} | {t['top_k']} | {t['total_tokens']} | {t['lookup_tokens']} | {t['draft_graph']} "
                f"| failed: {t['error'][:80]} |"
            )
            continue
        ms = t["per_step_ms"]
        lines.append(
            f"| {t['depth']} | {t['top_k']} | {t['total_tokens']} | {t['lookup_tokens']} | {t['draft_graph']} | {t['tok_s']} | {t['speedup_vs_plain']} | {t['acceptance']} "
            f"| {ms['draft']} | {ms['verify']} | {ms['overhead']} | {t['break_even_acceptance']} |"
        )
    lines += [
        "",
        "Acceptance comes from a copy draft on a random target (repetitive text): not a trained draft's. "
        "Break-even acceptance = step time / plain time per token: a trained draft needs that for 1x, twice it for 2x.",
    ]
    return "\n".join(lines) + "\n"


PHASES = ("lossless", "bf16", "forward", "timing")


def run_random_target(
    size: str = "1b",
    device: str | None = None,
    new_tokens: int = 256,
    out: str | Path = "random-target",
    phases=PHASES,
    prompts: int = 3,
) -> dict:
    """Run the ``phases`` on a random Llama target of ``size``; writes ``random_target.json`` (after every phase)
    and, when every phase ran, ``random_target.md`` in ``out``. Returns the results."""
    from ..devices import resolve_device

    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {', '.join(sorted(SIZES))}")
    phases = set(phases)
    unknown = phases - set(PHASES)
    if unknown:
        raise ValueError(f"unknown phase(s) {sorted(unknown)}: choose from {', '.join(PHASES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = str(resolve_device(device))
    r = {
        "size": size,
        "device": dev,
        "new_tokens": new_tokens,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device_name": torch.cuda.get_device_name(dev) if torch.device(dev).type == "cuda" else platform.processor(),
    }

    def save():
        atomic_write_json(out / "random_target.json", r)

    t0 = time.time()
    target = random_target(size, dev)
    L = target.config.num_hidden_layers
    draft = copy_draft(target, aux_layer_ids=[1, L // 2 - 1, L - 1], draft_vocab_size=target.config.vocab_size)
    shape = VARIANTS[0]
    r["lossless_shape"] = shape
    if "lossless" in phases:
        r["lossless"] = lossless(target, draft, dev, new_tokens, shape)
        print("lossless float32:", r["lossless"], f"({time.time() - t0:.0f} s)", flush=True)
        save()
    target.to(torch.bfloat16)
    draft.to(torch.bfloat16)
    if "bf16" in phases:
        r["bf16_agreement"] = bf16_agreement(target, draft, dev, new_tokens, shape)
        print("bf16 agreement:", r["bf16_agreement"], flush=True)
    if "forward" in phases:
        r["forward_ms"] = forward_cost(target, dev)
        print("forward ms:", r["forward_ms"], flush=True)
        save()
    if "timing" in phases:
        r["attention_kernels"] = "every method without cuDNN SDPA (eagle3_hub's attention_kernels)"
        with attention_kernels(torch.device(dev)):
            r["timing"] = timing(
                target,
                draft,
                dev,
                new_tokens,
                VARIANTS,
                prompts,
                on_result=lambda t: (print(t, flush=True), save()),
                result=r.setdefault("timing", {}),
            )
    r["wall_s"] = round(time.time() - t0, 1)
    save()
    if phases >= set(PHASES):
        md = markdown(r)
        atomic_write_text(out / "random_target.md", md)
        print(md)
    return r
