"""Training throughput of three batch layouts on the same samples, interleaved in one process so that other work on
a shared machine slows each alike: A today's recipe (online features, length-grouped batches of 4 samples), B packed
(online, one row of up to 1,152 tokens a step, about as many tokens a step), C packed from offline features (the
target's features of those samples computed first and read back from a safetensors cache; that build is timed apart).

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 nice python benchmarks/smollm2-135m-instruct/training-packing/packing_ab.py \
        --data WORK_DIR/data/tokenized --rounds 3 --out benchmarks/smollm2-135m-instruct/training-packing/result.json

WORK_DIR is that of `eagle3-hub train --config ... --data-only` on the embedded SmolLM2 target (README.md here).
Each round runs one optimizer step of each arm (the order rotates per round): features, TTT loss (5 steps),
backward, AdamW. Tokens are real (non-padding) tokens; the result is rewritten after every round.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers
from accelerate import Accelerator
from datasets import load_from_disk

from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.targets import load_target, reference_draft
from eagle3_hub.training.batching import LengthGroupedBatches, PackedBatches, collate, collate_packed
from eagle3_hub.training.features import TrainingFeatures
from eagle3_hub.training.models import draft_aux_ids
from eagle3_hub.training.throughput import matmul_peak, model_flops_per_token
from eagle3_hub.training.ttt import objective

T = {"ttt_steps": 5, "step_weight": 0.8, "loss": "kl", "lk_eta": 3.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pack-tokens", type=int, default=1152)
    parser.add_argument("--rows", type=int, default=1, help="packed rows a step (train.batch_size)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    target, tok = load_target(None, dtype="float32", device="cpu")
    draft = Eagle3DraftModel.from_pretrained(reference_draft(), target=target).float().train()
    draft.get_input_embeddings().requires_grad_(False)  # the target's embedding, frozen as in training
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-5)
    ds = load_from_disk(args.data)["train"]
    lengths = [len(x) for x in ds["input_ids"]]
    g = torch.Generator().manual_seed(0)
    grouped = [[ds[i] for i in b] for b in LengthGroupedBatches(lengths, 4, g)][: args.rounds]
    g.manual_seed(0)
    packed = [[ds[i] for i in b] for b in PackedBatches(lengths, args.rows, args.pack_tokens, g)][: args.rounds]
    batches = {"A_unpacked_online": [collate(b, tok.pad_token_id) for b in grouped],
               "B_packed_online": [collate_packed(b, tok.pad_token_id, args.pack_tokens) for b in packed],
               "C_packed_offline": [collate_packed(b, tok.pad_token_id, args.pack_tokens) for b in packed]}
    aux_ids = draft_aux_ids(draft)
    online = TrainingFeatures({"features": {"mode": "online"}}, target, aux_ids, [], tok.pad_token_id, None)
    wanted = {ex["index"] for b in packed for ex in b}
    used = ds.select([i for i, x in enumerate(ds["index"]) if x in wanted])
    cache = tempfile.mkdtemp(prefix="packing-ab-")
    t0 = time.perf_counter()
    offline = TrainingFeatures({"features": {"mode": "offline", "cache_dir": cache, "reuse_from": []},
                                "work_dir": cache, "train": {"batch_size": 4}},
                               target, aux_ids, [used], tok.pad_token_id, Accelerator(cpu=True))
    build_s = time.perf_counter() - t0
    build_tokens = sum(len(x) for x in used["input_ids"])
    features = {"A_unpacked_online": online, "B_packed_online": online, "C_packed_offline": offline}
    peak = matmul_peak(torch.device("cpu"))
    result = {"pack_tokens": args.pack_tokens, "rows": args.rows, "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                          "torch": torch.__version__, "transformers": transformers.__version__},
              "peak": peak, "offline_build": {"tokens": build_tokens, "seconds": round(build_s, 2),
                                              "tokens_per_s": build_tokens / build_s},
              "arms": {a: {"tokens": 0, "padded_slots": 0, "seconds": 0.0, "steps": 0} for a in batches}}
    names = list(batches)
    for r in range(args.rounds):
        for arm in names[r % 3:] + names[: r % 3]:
            batch = batches[arm][r]
            t0 = time.perf_counter()
            aux, scores = features[arm](batch, draft)
            out = objective(draft, aux, batch, scores, T)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            a = result["arms"][arm]
            a["seconds"] += time.perf_counter() - t0
            a["tokens"] += int(batch["attention_mask"].sum())
            a["padded_slots"] += batch["input_ids"].numel()
            a["steps"] += 1
        for arm, a in result["arms"].items():
            a["tokens_per_s"] = a["tokens"] / a["seconds"]
            flops = model_flops_per_token(draft, target, T["ttt_steps"], online=arm != "C_packed_offline")
            a["peak_share"] = a["tokens_per_s"] * flops / peak["flops"]
        base = result["arms"]["A_unpacked_online"]["tokens_per_s"]
        result["ratio_to_A"] = {arm: a["tokens_per_s"] / base for arm, a in result["arms"].items()}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"round {r + 1}: " + ", ".join(f"{k} {a['tokens_per_s']:.0f} tok/s" for k, a in result["arms"].items()), flush=True)


if __name__ == "__main__":
    main()
