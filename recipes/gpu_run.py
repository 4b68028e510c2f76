"""The GPU run, one command, sized for about 10 minutes of one H100: the SmolLM2 target writes its training data on
the GPU, a draft trains on at least 50x the tokens of the reference draft's last stage, the trained pair is benched on
CUDA against plain `generate` and the same forward, and everything comes back in one folder.

    PYTHONPATH=$PWD python recipes/gpu_run.py --out runs/gpu-run                 # on a machine with one GPU
    PYTHONPATH=$PWD python recipes/gpu_run.py --out /tmp/gpu-run-tiny --tiny --target TINY_MODEL_FOLDER   # CPU, seconds

Rerun the same command after an interruption: the data and the training resume from work_dir, a finished phase is
skipped. The folder gets:
  draft/            the trained draft as written by `eagle3-hub train` (training_metrics.json, throughput included)
  draft-16mib/      the same weights in safetensors files of at most 16 MiB each (model.safetensors.index.json)
  bench/            bench.json / bench.md: plain generate, same_forward and tree decoding, greedy, T=0.7 and T=1,
                    batch 1 and 8, the reference draft beside the new one (tree@reference)
  results.json      sizes, the tokens trained against the last stage's, held-out metrics, seconds per phase, files
  work/             data, checkpoints and logs (not needed to use the draft)
`--tiny` shrinks every size (16 prompts, 3 steps, 2 questions of 8 tokens) for a dry run on a CPU
(tests/test_gpu_run.py).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file, save_file

from eagle3_hub.atomic import atomic_dir, atomic_write_json
from eagle3_hub.targets import reference_draft
from eagle3_hub.training.recipe import load_recipe
from eagle3_hub.training.train import train

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "smollm2-135m-instruct"
# the reference draft's last stage: 400 steps of batch 4, samples of at most 384 tokens
LAST_STAGE_TOKENS = 400 * 4 * 384
SHARD_BYTES = 16 * 2**20

FULL = {
    "scale": 50,
    "prompts": sorted(DATA.glob("regenerated*.jsonl")),
    "max_samples": None,
    "max_new_tokens": 256,
    "gen_batch_size": 512,
    "max_length": 768,
    "eval_samples": 64,
    "pack_tokens": 1024,
    "batch_size": 32,
    "lr": 5e-4,
    "warmup_steps": 50,
    "eval_every": 250,
    "save_every": 100,
    "bench": ["--num-questions", "8", "--max-new-tokens", "128", "--batch-size", "1,8", "--warmup", "1"],
}
TINY = {
    "scale": None,
    "steps": 3,
    "prompts": [DATA / "regenerated_chat_seed1.jsonl"],
    "max_samples": 16,
    "max_new_tokens": 8,
    "gen_batch_size": 8,
    "max_length": 96,
    "eval_samples": 4,
    "pack_tokens": 192,
    "batch_size": 2,
    "lr": 1e-3,
    "warmup_steps": 1,
    "eval_every": 3,
    "save_every": 3,
    "bench": ["--num-questions", "2", "--max-new-tokens", "8", "--batch-size", "1,2", "--warmup", "0", "--no-float32-check"],
}


def recipe_for(
    size: dict, target: str | None, init_from: str | None, out: Path, steps: int | None, device: str, answers: int = 1
) -> dict:
    """Stage 1 of the reference recipe, with the target answering every prompt again on this device (greedy, T=0.7
    or T=1, one setting a prompt; ``answers`` > 1: that many sampled answers a prompt, T=0.7 or T=1) and packed
    training."""
    # several answers of one prompt must be sampled (greedy ones are all the same); at equal samples they train
    # nearly as well as new prompts (docs/training.md, "More prompts or more answers per prompt")
    sampling = [
        *([{"temperature": 0, "share": 0.4}] if answers == 1 else []),
        {"temperature": 0.7, "top_p": 0.9, "share": 0.3},
        {"temperature": 1.0, "top_p": 0.9, "share": 0.3},
    ]
    sources = [
        {"path": str(p), "regenerate": True, **({"max_samples": size["max_samples"]} if size["max_samples"] else {})}
        for p in size["prompts"]
    ]
    return load_recipe(
        None,
        {
            "target": {"name": target, "dtype": "bfloat16" if device.startswith("cuda") else "float32"},
            # a new draft starts from the target's last layer and head: ahead of random weights at every step
            # (docs/training.md, "Training choices at equal CPU time")
            "draft": {"draft_vocab_size": 8192, "init_from": init_from}
            | ({} if init_from else {"head_from_target": True, "layer_from_target": -1}),
            "data": {
                "sources": sources,
                "regenerate_with": "generate",
                "max_new_tokens": size["max_new_tokens"],
                "gen_batch_size": size["gen_batch_size"],
                "strip_patterns": ["<<[^>]*>>"],
                "max_length": size["max_length"],
                "eval_samples": size["eval_samples"],
                "max_repeat_share": 0.2,
                "answer_sampling": sampling,
                "answers_per_prompt": answers,
            },
            "features": {"mode": "online"},
            "train": {
                "ttt_steps": 5,
                "max_steps": steps,
                "batch_size": size["batch_size"],
                "packing": True,
                "pack_tokens": size["pack_tokens"],
                "lr": size["lr"],
                "warmup_steps": size["warmup_steps"],
                "eval_every": size["eval_every"],
                "save_every": size["save_every"],
                "log_every": 10,
            },
            "work_dir": str(out / "work"),
            "output_dir": str(out / "draft"),
        },
    )


def steps_for(size: dict) -> int:
    """Optimizer steps whose packed rows hold ``scale`` x the last stage's tokens (rows ~97% full)."""
    if size["scale"] is None:
        return size["steps"]
    per_step = size["batch_size"] * size["pack_tokens"] * 0.97
    return math.ceil(size["scale"] * LAST_STAGE_TOKENS / per_step)


def reshard(draft: Path, out: Path) -> list[dict]:
    """The draft folder again, its weights in safetensors files of at most 16 MiB."""
    state = load_file(str(draft / "model.safetensors"))
    split = split_torch_state_dict_into_shards(state, max_shard_size=SHARD_BYTES)
    with atomic_dir(out) as tmp:
        for f in draft.iterdir():
            if f.is_file() and f.name != "model.safetensors":
                (tmp / f.name).write_bytes(f.read_bytes())
        for name, keys in split.filename_to_tensors.items():
            save_file({k: state[k].contiguous() for k in keys}, str(tmp / name), metadata={"format": "pt"})
        if split.is_sharded:
            atomic_write_json(
                tmp / "model.safetensors.index.json",
                {
                    "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                    "weight_map": split.tensor_to_filename,
                },
            )
    files = [{"file": f.name, "bytes": f.stat().st_size} for f in sorted(out.glob("*.safetensors"))]
    too_big = [f for f in files if f["bytes"] > SHARD_BYTES]
    if too_big:
        raise SystemExit(
            f"gpu_run: error: {too_big[0]['file']} holds a tensor over {SHARD_BYTES / 2**20:g} MiB "
            f"({too_big[0]['bytes']} bytes): the draft cannot come back in files that small"
        )
    return files


def bench(size: dict, target: str | None, draft: Path, compare: str | None, device: str, out: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "eagle3_hub.cli",
        "bench",
        "--draft",
        str(draft),
        "--device",
        device,
        "--suite",
        "mt_bench",
        "--max-turns",
        "1",
        "--methods",
        "plain,same_forward,tree",
        "--temperature",
        "0,0.7,1",
        "--seed",
        "0",
        "--out",
        str(out),
        "--quiet",
        *size["bench"],
    ]
    cmd += ["--target", target] if target else []
    cmd += ["--compare-draft", compare] if compare else []
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the output folder (rerun the same command to resume)")
    parser.add_argument("--target", default=None, help="target folder or Hub id (default: the embedded SmolLM2)")
    parser.add_argument(
        "--init-from",
        default="reference",
        help="draft to continue: `reference` (the shipped draft of the embedded target), a folder, or `none` (from scratch)",
    )
    parser.add_argument(
        "--answers-per-prompt",
        type=int,
        default=1,
        help="sampled answers the target writes to each prompt (default 1: 40%% greedy, 30%% T=0.7, 30%% T=1); more "
        "samples from the same prompts, each pass over the data that much longer",
    )
    parser.add_argument("--tiny", action="store_true", help="every size shrunk: a dry run on a CPU in seconds")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.answers_per_prompt < 1:
        parser.error(f"--answers-per-prompt must be 1 or more, got {args.answers_per_prompt}")
    size, out = (TINY if args.tiny else FULL), Path(args.out)
    if args.init_from == "reference" and args.target is not None:
        parser.error("--init-from reference is the embedded target's draft: pass --init-from none or a folder")
    init = {"reference": str(reference_draft()), "none": None}.get(args.init_from, args.init_from)
    seconds, t0 = {}, time.time()
    recipe = recipe_for(size, args.target, init, out, None, args.device, args.answers_per_prompt)
    train(recipe, data_only=True)  # the target writes the data (cached in work/data: a rerun reads it)
    seconds["data"] = round(time.time() - t0, 1)
    steps = steps_for(size)
    draft = out / "draft"
    if not (draft / "model.safetensors").exists():
        t0 = time.time()
        work = Path(recipe["work_dir"])
        train(
            recipe_for(size, args.target, init, out, steps, args.device, args.answers_per_prompt),
            resume=(work / "checkpoints").exists(),
        )
        seconds["train"] = round(time.time() - t0, 1)
    files = reshard(draft, out / "draft-16mib")
    if not (out / "bench" / "bench.json").exists():
        t0 = time.time()
        bench(size, args.target, draft, init, args.device, out / "bench")
        seconds["bench"] = round(time.time() - t0, 1)
    metrics = json.loads((draft / "training_metrics.json").read_text())
    tokens = (metrics.get("throughput") or {}).get("tokens", 0)
    results = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "tiny": args.tiny,
        "steps": metrics["steps"],
        "tokens_trained": tokens,
        "last_stage_tokens": LAST_STAGE_TOKENS,
        "tokens_over_last_stage": tokens / LAST_STAGE_TOKENS,
        "throughput": metrics.get("throughput"),
        "acceptance": metrics["acceptance"],
        "seconds_this_call": seconds,
        "weights": files,
        "bench": json.loads((out / "bench" / "bench.json").read_text())["results"],
    }
    atomic_write_json(out / "results.json", results)
    print(
        f"[gpu_run] {tokens} tokens trained ({tokens / LAST_STAGE_TOKENS:.1f}x the last stage's), held-out "
        f"acceptance {metrics['acceptance']['expected_acceptance_length']:.2f}; {out}/results.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
