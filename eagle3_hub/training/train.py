"""`eagle3-hub train`: target + data -> a trained EAGLE-3 draft folder.

    eagle3-hub train --config recipes/smollm2-135m-instruct.yaml [--train.lr 3e-4 ...] [--resume]
    accelerate launch --config_file recipes/accelerate/ddp.yaml -m eagle3_hub.training.train --config ...

Stages: data (load, regenerate, tokenise; cached in work_dir) -> draft vocabulary -> features (online, or an
offline cache of safetensors shards) -> TTT training with checkpoints -> the draft folder (+ metrics, card).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import load_from_disk
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .. import Eagle3DraftModel
from ..targets import check_aux_layer_ids, load_target, num_decoder_layers
from .data import DataError, build_conversations, tokenize_dataset
from .features import OfflineFeatures, aux_features
from .recipe import load_recipe, parse_overrides
from .ttt import acceptance_metrics, ttt_loss
from .vocab import coverage_table, select_draft_vocab, token_counts


def atomic_write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def collate(batch: list[dict], pad_id: int) -> dict:
    """Right-padded batch: input_ids, attention_mask, loss_mask (b, s), and the sample indices."""
    s = max(len(ex["input_ids"]) for ex in batch)
    ids = torch.full((len(batch), s), pad_id, dtype=torch.long)
    att = torch.zeros((len(batch), s), dtype=torch.long)
    lm = torch.zeros((len(batch), s), dtype=torch.long)
    for i, ex in enumerate(batch):
        n = len(ex["input_ids"])
        ids[i, :n] = torch.tensor(ex["input_ids"])
        att[i, :n] = 1
        lm[i, :n] = torch.tensor(ex["loss_mask"])
    return {"input_ids": ids, "attention_mask": att, "loss_mask": lm, "index": torch.tensor([ex["index"] for ex in batch])}


# ------------------------------------------------------------------------------------------------- stages
def prepare_data(recipe: dict, target, tokenizer, accelerator: Accelerator):
    """Conversations -> tokenised train/eval splits, saved under work_dir/data (reruns reuse them)."""
    work = Path(recipe["work_dir"]) / "data"
    final = work / "tokenized"
    d = recipe["data"]
    if accelerator.is_main_process and not (final / "dataset_dict.json").exists():
        convs = build_conversations(
            d["sources"], target, tokenizer, work, seed=recipe["train"]["seed"], synthesize=d["synthesize"],
            regenerate_responses=d["regenerate"], max_new_tokens=d["max_new_tokens"], temperature=d["temperature"],
            batch_size=d["gen_batch_size"], max_turns=d["max_turns"], strip_patterns=d["strip_patterns"],
        )
        tok, report = tokenize_dataset(convs, tokenizer, d["max_length"], num_proc=d["num_proc"])
        tok = tok.add_column("index", list(range(len(tok))))
        n_eval = min(d["eval_samples"], max(1, len(tok) // 10))
        split = tok.train_test_split(test_size=n_eval, seed=recipe["train"]["seed"])
        tmp = work / "tokenized.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        split.save_to_disk(str(tmp))
        os.replace(tmp, final)
        atomic_write_json(work / "data_report.json", {**report, "train": len(split["train"]), "eval": len(split["test"])})
        print(f"[data] {report}; train {len(split['train'])}, eval {len(split['test'])}")
    accelerator.wait_for_everyone()
    split = load_from_disk(str(final))
    return split["train"], split["test"]


def prepare_vocab(recipe: dict, train_ds, tokenizer, vocab_size: int) -> tuple[torch.Tensor, dict]:
    path = Path(recipe["work_dir"]) / "vocab.json"
    size = recipe["draft"]["draft_vocab_size"] or vocab_size
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["draft_vocab_size"] == size:
            return torch.tensor(saved["target_ids"]), saved
    counts = token_counts(train_ds, vocab_size)
    ids, coverage = select_draft_vocab(counts, size, always_include=[tokenizer.eos_token_id])
    info = {"draft_vocab_size": size, "coverage": coverage, "coverage_by_size": coverage_table(counts),
            "loss_tokens": int(counts.sum()), "target_ids": ids.tolist()}
    atomic_write_json(path, info)
    print(f"[vocab] {size} tokens cover {coverage:.2%} of {int(counts.sum())} loss tokens")
    return ids, info


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    done = sorted((p for p in ckpt_root.glob("step-*") if (p / "trainer_state.json").exists()),
                  key=lambda p: int(p.name.split("-")[1]))
    return done[-1] if done else None


def save_checkpoint(accelerator: Accelerator, ckpt_root: Path, step: int, state: dict, keep: int) -> None:
    """accelerate's save_state into a temporary folder, then an atomic rename: a kill leaves no half checkpoint."""
    if accelerator.is_main_process:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".tmp-step-{step}"
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        atomic_write_json(tmp / "trainer_state.json", state)
        final = ckpt_root / f"step-{step}"
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in sorted(ckpt_root.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


@torch.no_grad()
def evaluate(draft, target, loader, recipe, features, accelerator) -> dict:
    draft.eval()
    t = recipe["train"]
    sums = None
    for batch in loader:
        aux, logits = features(batch)
        with accelerator.autocast():
            out = ttt_loss(draft, aux, batch["input_ids"], logits, batch["loss_mask"], batch["attention_mask"],
                           ttt_steps=t["ttt_steps"], step_weight=t["step_weight"])
        vals = [out.loss.detach() * out.chain_count, out.step_correct, out.step_count, out.chain_correct, out.chain_count]
        sums = vals if sums is None else [a + b for a, b in zip(sums, vals)]
    draft.train()
    sums = [accelerator.reduce(v.float(), "sum") for v in sums]
    m = acceptance_metrics(sums[1], sums[2], sums[3], sums[4])
    m["loss"] = (sums[0] / sums[4].clamp(min=1)).item()
    return m


# ------------------------------------------------------------------------------------------------- main
def train(recipe: dict, resume: bool = False) -> Path:
    t = recipe["train"]
    if t["num_threads"]:
        torch.set_num_threads(int(t["num_threads"]))
    mp = t["mixed_precision"]
    if mp == "auto":  # bf16 autocast on GPUs that have it; on CPUs without bf16 units it is 4x slower than fp32
        mp = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if torch.cuda.is_available() else "no"
    work = Path(recipe["work_dir"])
    accelerator = Accelerator(mixed_precision=mp, gradient_accumulation_steps=t["grad_accum"],
                              log_with="tensorboard", project_dir=str(work))
    set_seed(t["seed"])
    tg = recipe["target"]
    target, tokenizer = load_target(tg["name"], dtype=tg["dtype"], device=accelerator.device,
                                    gguf_file=tg["gguf_file"], adapter=tg["adapter"])
    L = num_decoder_layers(target)
    if recipe["draft"]["aux_layer_ids"] is not None:
        check_aux_layer_ids(recipe["draft"]["aux_layer_ids"], L)
    vocab_size = target.config.get_text_config().vocab_size
    size = recipe["draft"]["draft_vocab_size"]
    if size is not None and not 0 < size <= vocab_size:
        raise ValueError(f"draft.draft_vocab_size={size} must be in 1..{vocab_size} (the target vocabulary)")

    train_ds, eval_ds = prepare_data(recipe, target, tokenizer, accelerator)
    vocab_ids, vocab_info = prepare_vocab(recipe, train_ds, tokenizer, vocab_size)

    # ---- the draft (fresh, from an existing one, or LoRA adapters on an existing one)
    d = recipe["draft"]
    if d["init_from"]:
        draft = Eagle3DraftModel.from_pretrained(d["init_from"], target=target)
    else:
        draft = Eagle3DraftModel.from_target(target, aux_layer_ids=d["aux_layer_ids"], draft_vocab_size=size,
                                             intermediate_size=d["intermediate_size"])
        draft.set_vocab_mapping(vocab_ids)
    draft = draft.float().to(accelerator.device)
    draft.embed_tokens.weight.requires_grad_(False)
    if recipe["lora"]["enabled"]:
        from peft import LoraConfig, get_peft_model

        lc = recipe["lora"]
        draft = get_peft_model(draft, LoraConfig(r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=lc["dropout"],
                                                 target_modules=lc["target_modules"]))
    if t["gradient_checkpointing"]:
        draft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    draft.train()

    # ---- features
    features = OfflineFeatures(recipe, target, draft_aux_ids(draft), accelerator) if recipe["features"]["mode"] == "offline" else None
    if features is not None:
        features.build([train_ds, eval_ds], tokenizer.pad_token_id)

    def get_features(batch):
        if features is not None:
            return features.load(batch)
        return aux_features(target, batch["input_ids"], batch["attention_mask"], draft_aux_ids(draft))

    pad = tokenizer.pad_token_id
    g = torch.Generator().manual_seed(t["seed"])
    train_loader = DataLoader(train_ds, batch_size=t["batch_size"], shuffle=True, generator=g, collate_fn=lambda b: collate(b, pad))
    eval_loader = DataLoader(eval_ds, batch_size=t["batch_size"], shuffle=False, collate_fn=lambda b: collate(b, pad))
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    steps_per_epoch = math.ceil(len(train_loader) / t["grad_accum"])
    total_steps = t["max_steps"] or steps_per_epoch * t["epochs"]

    def lr_lambda(step):  # linear warmup, cosine to 10%
        if step < t["warmup_steps"]:
            return (step + 1) / t["warmup_steps"]
        progress = min(1.0, (step - t["warmup_steps"]) / max(1, total_steps - t["warmup_steps"]))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    draft, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(draft, optimizer, train_loader, eval_loader, scheduler)
    accelerator.init_trackers("tensorboard")

    # ---- resume
    ckpt_root = work / "checkpoints"
    step, epoch, skip = 0, 0, 0
    history: list = []
    last = latest_checkpoint(ckpt_root) if resume else None
    if resume and last is None:
        accelerator.print("[resume] no checkpoint found: starting from scratch")
    if last is not None:
        accelerator.load_state(str(last))
        state = json.loads((last / "trainer_state.json").read_text())
        step, epoch, skip, history = state["step"], state["epoch"], state["batches_in_epoch"], state["eval_history"]
        accelerator.print(f"[resume] from {last} (step {step}, epoch {epoch}, batch {skip})")

    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", disable=not accelerator.is_local_main_process)
    tokens_seen, t0 = 0, time.time()
    metrics_path = Path(recipe["output_dir"]).with_name(Path(recipe["output_dir"]).name + "-metrics.json")
    while step < total_steps:
        if hasattr(train_loader, "set_epoch"):
            train_loader.set_epoch(epoch)
        g.manual_seed(t["seed"] + epoch)  # the shuffle of each epoch is a function of the seed alone
        loader = accelerator.skip_first_batches(train_loader, skip) if skip else train_loader
        batches_in_epoch = skip
        for batch in loader:
            with accelerator.accumulate(draft):
                aux, logits = get_features(batch)
                with accelerator.autocast():
                    out = ttt_loss(draft, aux, batch["input_ids"], logits, batch["loss_mask"], batch["attention_mask"],
                                   ttt_steps=t["ttt_steps"], step_weight=t["step_weight"])
                accelerator.backward(out.loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(params, t["grad_clip"])
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            batches_in_epoch += 1
            tokens_seen += int(batch["attention_mask"].sum())
            if not accelerator.sync_gradients:
                continue
            step += 1
            bar.update(1)
            if step % t["log_every"] == 0 or step == total_steps:
                acc0 = (out.step_correct[0] / out.step_count[0].clamp(min=1)).item()
                logs = {"loss": out.loss.item(), "acc0": acc0, "lr": scheduler.get_last_lr()[0],
                        "tokens_per_s": tokens_seen / (time.time() - t0)}
                bar.set_postfix(loss=f"{logs['loss']:.3f}", acc0=f"{acc0:.2f}", tok_s=f"{logs['tokens_per_s']:.0f}")
                accelerator.log(logs, step=step)
            if step % t["eval_every"] == 0 or step == total_steps:
                m = evaluate(draft, target, eval_loader, recipe, get_features, accelerator)
                history.append({"step": step, **m})
                accelerator.log({"eval/loss": m["loss"], "eval/acceptance_length": m["expected_acceptance_length"],
                                 **{f"eval/acc_{k}": a for k, a in enumerate(m["step_accuracy"])}}, step=step)
                accelerator.print(f"[eval] step {step}: loss {m['loss']:.3f}, expected acceptance length "
                                  f"{m['expected_acceptance_length']:.2f}, step accuracy "
                                  + " ".join(f"{a:.2f}" for a in m["step_accuracy"]))
            if step % t["save_every"] == 0 or step == total_steps:
                save_checkpoint(accelerator, ckpt_root, step, {"step": step, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
                                                                "eval_history": history}, t["keep_checkpoints"])
            if step >= total_steps:
                break
        else:
            epoch, skip = epoch + 1, 0
            continue
        break
    bar.close()
    accelerator.end_training()

    # ---- the draft folder
    out_dir = Path(recipe["output_dir"])
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(draft)
        export_draft(model, out_dir, tokenizer)
        info = {"recipe": recipe, "vocab": {k: v for k, v in vocab_info.items() if k != "target_ids"},
                "data": json.loads((work / "data" / "data_report.json").read_text()),
                "steps": step, "eval_history": history, "wall_time_s": None}
        atomic_write_json(out_dir / "training_metrics.json", info)
        accelerator.print(f"[done] draft written to {out_dir}")
        if recipe["push_to_hub"]:
            from ..hub import push_draft

            push_draft(out_dir, recipe["push_to_hub"], private=recipe["private"])
    return out_dir


def draft_aux_ids(draft) -> list[int]:
    model = draft
    while not hasattr(model, "config") or not hasattr(model.config, "aux_layer_ids"):
        model = model.base_model if hasattr(model, "base_model") and model.base_model is not model else model.module
    return model.config.aux_layer_ids


def export_draft(model, out_dir: Path, tokenizer=None) -> None:
    """bf16 weights without the target's embedding, written to a temporary folder and renamed into place.
    A LoRA draft is saved as its adapter (a ``PeftModel`` of the draft)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    if hasattr(model, "peft_config"):
        model.save_pretrained(tmp)
    else:
        model = model.to(torch.bfloat16)
        model.save_pretrained(tmp, save_embeddings=False)
    old = out_dir.with_name(f".old-{out_dir.name}")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML recipe (see recipes/); any key can also be given as --section.key VALUE")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in work_dir")
    parser.set_defaults(accepts_overrides=True, overrides=[])  # --section.key VALUE pairs, e.g. --train.lr 3e-4


def run(args) -> int:
    overrides = parse_overrides([a for a in (args.overrides or []) if a != "--"])
    try:
        recipe = load_recipe(args.config, overrides)
        train(recipe, resume=args.resume)
    except (DataError, KeyError, ValueError, FileNotFoundError) as e:
        print(f"eagle3-hub train: error: {e}", file=sys.stderr)
        return 2
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="eagle3_hub.training.train")
    add_arguments(parser)
    args, extra = parser.parse_known_args()
    args.overrides = extra
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
