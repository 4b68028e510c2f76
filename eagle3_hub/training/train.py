"""`eagle3-hub train`: target + data -> a trained EAGLE-3 draft folder.

    eagle3-hub train --config recipes/smollm2-135m-instruct.yaml [--train.lr 3e-4 ...] [--resume | --overwrite]
    accelerate launch --config_file recipes/accelerate/ddp.yaml -m eagle3_hub.commands.train --config ...

``train`` runs one recipe in phases: the target, checked before anything is written (``models``) -> data (load,
regenerate, tokenise, split; cached in work_dir, ``splits``) -> draft vocabulary (``vocab``) -> the draft
(``models``) -> features (online, or an offline cache of safetensors shards, ``features``) -> batches
(``batching``) -> TTT training with held-out evaluations (``evaluation``) and checkpoints (``checkpoints``) -> the
draft folder with its metrics (``export``). ``stages.train_recipe`` runs a recipe's stages one after another.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..extras import missing_extra

try:
    from accelerate import Accelerator
    from accelerate.utils import set_seed
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from ..atomic import atomic_write_json
from ..targets import cpu_has_bf16_units
from .batching import make_loaders
from .checkpoints import (
    FINISHED,
    claim_work_dir,
    latest_checkpoint,
    move_aside,
    read_state,
    record_run,
    recover,
    run_id,
    run_identity,
    save_checkpoint,
)
from .evaluation import MASKED_CHECK_STEPS, check_masked_share, evaluate, masked_share, report_eval
from .export import export_draft, training_metrics
from .features import TrainingFeatures
from .generation import regeneration_draft
from .models import build_draft, draft_aux_ids, load_checked_target, load_continued_draft
from .recipe_schema import validate
from .sources import DataError
from .splits import prepare_data
from .throughput import Throughput, matmul_peak, model_flops_per_token
from .ttt import objective
from .vocab import prepare_vocab


def train(recipe: dict, resume: bool = False, overwrite: bool = False, data_only: bool = False) -> Path:
    """Run a recipe (its keys: ``recipe_schema.Recipe``; recipes/README.md) and return the draft folder;
    ``data_only``: stop after the data (generated, tokenised, with its reports in work_dir/data) and return that folder.

    Bad input (recipe values, target, draft vocabulary size, aux layers, an existing draft that does not fit,
    missing chat template, empty or malformed data) raises before anything is written to work_dir. With
    ``resume``, training continues from the latest checkpoint in work_dir and ends where an uninterrupted run
    would have ended (same data order, optimizer, scheduler and RNG state). A run only resumes its own checkpoints:
    work_dir's checkpoints of another recipe (or, without ``resume``, of any run) stop it before anything is written,
    unless ``overwrite`` moves that run aside to ``<work_dir>/previous-<time>``."""
    check_recipe(recipe)
    if resume and overwrite:
        raise ValueError("--resume continues the run in work_dir and --overwrite moves it aside: pass one of them.")
    t, work, identity = recipe["train"], Path(recipe["work_dir"]), run_identity(recipe)
    previous = None if data_only else claim_work_dir(work, identity, resume, overwrite)
    accelerator = start_accelerator(recipe, previous)
    target, tokenizer = load_checked_target(recipe, accelerator.device)
    # data_only: the data does not depend on the draft, which a later stage's data may be prepared before
    init, earlier = (None, []) if data_only else load_continued_draft(recipe, target, accelerator.is_main_process)
    train_ds, eval_ds = prepare_data(recipe, target, tokenizer, accelerator)
    if data_only:
        accelerator.print(f"[data] {len(train_ds)} train and {len(eval_ds)} held-out samples in {work / 'data'}")
        return work / "data"
    vocab_ids, vocab_info = draft_vocabulary(recipe, train_ds, tokenizer, target, init, accelerator)
    draft = build_draft(recipe, target, init, vocab_ids, vocab_info, accelerator)
    features = TrainingFeatures(recipe, target, draft_aux_ids(draft), [train_ds, eval_ds], tokenizer.pad_token_id, accelerator)
    train_loader, eval_loader, generator = make_loaders(train_ds, eval_ds, t, tokenizer.pad_token_id, accelerator)
    # len(train_loader): batches per process, each one sees its shard
    total_steps = t["max_steps"] or math.ceil(len(train_loader) / t["grad_accum"]) * t["epochs"]
    draft, optimizer, scheduler = make_optimizer(draft, t, total_steps, accelerator)
    online = recipe["features"]["mode"] == "online"
    peak = matmul_peak(accelerator.device, torch.bfloat16 if accelerator.mixed_precision == "bf16" else torch.float32)
    run = Run(
        accelerator=accelerator,
        recipe=recipe,
        draft=draft,
        optimizer=optimizer,
        scheduler=scheduler,
        features=features,
        train_loader=train_loader,
        eval_loader=eval_loader,
        generator=generator,
        total_steps=total_steps,
        run_id=run_id(identity),
        throughput=Throughput(model_flops_per_token(draft, target, t["ttt_steps"], online), peak),
    )
    progress = start_or_resume(run, identity, resume)
    if init is not None and progress.step == 0:  # a continued draft: its score on this held-out split before any step
        evaluate_into(run, progress.eval_history, 0)
    state_dict, wall = fit(run, progress, len(vocab_ids))
    return finish(run, progress, state_dict, wall, vocab_info, earlier)


@dataclass
class Run:
    """What the training loop works with: the recipe and the pieces ``accelerator.prepare`` returned."""

    accelerator: Accelerator
    recipe: dict
    draft: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    features: TrainingFeatures
    train_loader: DataLoader
    eval_loader: DataLoader
    generator: torch.Generator  # the train loader's shuffle, reseeded at each epoch
    total_steps: int
    run_id: str
    throughput: Throughput


@dataclass
class Progress:
    """Where a run stands: what each checkpoint records (``trainer_state.json``), and a resumed run starts from."""

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # of this epoch, already trained on: a resumed run skips them
    eval_history: list[dict] = field(default_factory=list)
    wall_before: float = 0.0  # seconds the run trained before this (re)start
    tokens: int = 0  # real (non-padding) tokens trained on, over every process (the learning curve's axis)

    @classmethod
    def from_state(cls, state: dict) -> Progress:
        """The progress a checkpoint's trainer state records."""
        return cls(
            state["step"],
            state["epoch"],
            state["batches_in_epoch"],
            state["eval_history"],
            state.get("wall_time_s", 0.0),
            state.get("tokens", 0),
        )

    def state(self, wall: float) -> dict:
        """The trainer state of a checkpoint, ``wall`` seconds into the run."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batches_in_epoch": self.batches_in_epoch,
            "eval_history": self.eval_history,
            "wall_time_s": wall,
            "tokens": self.tokens,
        }


def check_recipe(recipe: dict) -> None:
    """Checks that need no model, made before anything is loaded or written: every value against the schema
    (``recipe_schema``), then what the keys must be together."""
    validate(recipe)
    d, data = recipe["draft"], recipe["data"]
    regeneration_draft(data["regenerate_with"], data["regenerate_draft"], recipe["target"]["name"])  # bad values fail early
    if recipe["features"]["reuse_from"] and recipe["features"]["mode"] != "offline":
        raise ValueError("features.reuse_from copies offline features: set features.mode: offline, or remove it.")
    if recipe["lora"]["enabled"] and not d["init_from"]:
        raise ValueError("lora.enabled adapts an existing draft: set draft.init_from to its folder or Hub id.")
    if d["reselect_vocab"] and not d["init_from"]:
        raise ValueError(
            "draft.reselect_vocab chooses a new vocabulary for the draft of draft.init_from: set "
            "init_from, or leave reselect_vocab false (a new draft always takes its vocabulary from the data)."
        )
    if d["reselect_vocab"] and recipe["lora"]["enabled"]:
        raise ValueError(
            "draft.reselect_vocab changes the draft's lm_head, but LoRA adapters are saved for the draft "
            "as it is: turn one of them off."
        )
    if not data["sources"] and not data["synthesize"]:
        raise DataError("No data: give `data.sources` and/or `data.synthesize` > 0 in the recipe.")


def resolve_mixed_precision(mixed_precision: str) -> str:
    """``train.mixed_precision`` for accelerate: ``auto`` is bf16 autocast on GPUs that have it (fp16 on older ones)
    and on CPUs with bf16 units (AVX512-BF16 / AMX), none on other CPUs, where bf16 matmuls are emulated and
    slower than float32."""
    if mixed_precision != "auto":
        return mixed_precision
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_bf16_units() else "no"


def start_accelerator(recipe: dict, previous: str | None) -> Accelerator:
    """The seeded accelerator (mixed precision, accumulation, tensorboard in work_dir), once an older run moved aside."""
    t, work = recipe["train"], Path(recipe["work_dir"])
    if t["num_threads"]:
        torch.set_num_threads(int(t["num_threads"]))
    mp = resolve_mixed_precision(t["mixed_precision"])
    # the scheduler is stepped once per optimizer step here (accelerate would step it once per process)
    accelerator = Accelerator(
        mixed_precision=mp,
        gradient_accumulation_steps=t["grad_accum"],
        log_with="tensorboard",
        project_dir=str(work),
        step_scheduler_with_optimizer=False,
    )
    set_seed(t["seed"])
    if accelerator.is_main_process:  # before this run's logs start: an older run moves aside whole
        if previous is not None:
            move_aside(work, previous)
        recover(work / "checkpoints")  # a checkpoint swap or removal cut short by a kill
    accelerator.wait_for_everyone()
    return accelerator


def draft_vocabulary(recipe: dict, train_ds, tokenizer, target, init, accelerator) -> tuple[torch.Tensor, dict]:
    """The draft vocabulary, from the data or ``init``'s own: every process computes it, the main one writes it."""
    init_ids = None
    if init is not None:
        init_ids = init.draft_to_target_ids(torch.arange(init.config.draft_vocab_size, device=init.d2t.device))
    vocab_ids, vocab_info = prepare_vocab(
        recipe,
        train_ds,
        tokenizer,
        target.config.get_text_config().vocab_size,
        draft_ids=init_ids,
        reselect=recipe["draft"]["reselect_vocab"],
        write=accelerator.is_main_process,
    )
    accelerator.wait_for_everyone()
    return vocab_ids, vocab_info


def make_optimizer(draft, t: dict, total_steps: int, accelerator):
    """AdamW on the trainable parameters, warmup then cosine decay to 10%, prepared with the draft for the processes."""

    def lr_lambda(step):  # linear warmup, cosine to 10%
        if step < t["warmup_steps"]:
            return (step + 1) / t["warmup_steps"]
        progress = min(1.0, (step - t["warmup_steps"]) / max(1, total_steps - t["warmup_steps"]))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    return accelerator.prepare(draft, optimizer, scheduler)


def start_or_resume(run: Run, identity: dict, resume: bool) -> Progress:
    """Start the trackers, load this run's latest checkpoint with ``resume``, and record work_dir as this run's."""
    accelerator, work = run.accelerator, Path(run.recipe["work_dir"])
    accelerator.init_trackers("tensorboard")
    progress = Progress()
    last = latest_checkpoint(work / "checkpoints", run.run_id) if resume else None
    if resume and last is None:
        accelerator.print("[resume] no checkpoint found: starting from scratch")
    if last is not None:
        accelerator.load_state(str(last))
        progress = Progress.from_state(read_state(last))
        accelerator.print(
            f"[resume] from {last} (step {progress.step}, epoch {progress.epoch}, batch {progress.batches_in_epoch})"
        )
    if accelerator.is_main_process:
        (work / FINISHED).unlink(missing_ok=True)  # this run is not finished (yet)
        record_run(work, identity)
    accelerator.wait_for_everyone()
    return progress


def evaluate_into(run: Run, history: list[dict], step: int, tokens: int = 0) -> None:
    """Evaluate on the held-out split, report it, and write the history so far to work_dir/eval_metrics.json."""
    m = evaluate(run.draft, run.eval_loader, run.recipe, run.features, run.accelerator)
    history.append({"step": step, "tokens": tokens, **m})
    report_eval(m, step, run.accelerator)
    if run.accelerator.is_main_process:
        atomic_write_json(Path(run.recipe["work_dir"]) / "eval_metrics.json", {"eval_history": history})


def fit(run: Run, progress: Progress, vocab_size: int) -> tuple[dict, float]:
    """Train from ``progress`` to the last step, logging, evaluating and checkpointing; return the weights and wall time."""
    accelerator, draft, optimizer, scheduler = run.accelerator, run.draft, run.optimizer, run.scheduler
    t, p, total_steps = run.recipe["train"], progress, run.total_steps
    ckpt_root = Path(run.recipe["work_dir"]) / "checkpoints"
    bar = tqdm(total=total_steps, initial=p.step, desc="train", unit="step", disable=not accelerator.is_local_main_process)
    t0 = time.time()
    masked = torch.zeros(2)  # positions scored, positions trained, since this run (re)started
    start_step = p.step
    check_at = p.step + min(MASKED_CHECK_STEPS, total_steps - p.step)
    try:  # the bar ends its line before any error is printed
        while p.step < total_steps:
            if hasattr(run.train_loader, "set_epoch"):
                run.train_loader.set_epoch(p.epoch)
            run.generator.manual_seed(t["seed"] + p.epoch)  # the shuffle of each epoch is a function of the seed alone
            skip = p.batches_in_epoch
            loader = accelerator.skip_first_batches(run.train_loader, skip) if skip else run.train_loader
            for batch in loader:
                started = time.perf_counter()
                with accelerator.accumulate(draft):
                    aux, logits = run.features(batch, draft)
                    with accelerator.autocast():
                        out = objective(draft, aux, batch, logits, t)
                    accelerator.backward(out.loss)
                    masked += torch.stack([out.step_count.sum(), out.step_trained.sum()]).float().cpu()
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(draft.parameters(), t["grad_clip"])
                    optimizer.step()
                    if accelerator.sync_gradients:
                        scheduler.step()
                    optimizer.zero_grad()
                p.batches_in_epoch += 1
                tokens = int(batch["attention_mask"].sum()) * accelerator.num_processes
                p.tokens += tokens
                run.throughput.add(tokens, time.perf_counter() - started)
                if not accelerator.sync_gradients:
                    continue
                p.step += 1
                bar.update(1)
                if p.step == check_at:
                    counts = accelerator.reduce(masked.to(accelerator.device), "sum")
                    warning = check_masked_share(masked_share(*counts.tolist()), p.step - start_step, run.recipe, vocab_size)
                    if warning:
                        accelerator.print(warning)
                if p.step % t["log_every"] == 0 or p.step == total_steps:
                    acc0 = (out.step_correct[0] / out.step_count[0].clamp(min=1)).item()
                    logs = {
                        "loss": out.loss.item(),
                        "acc0": acc0,
                        "lr": scheduler.get_last_lr()[0],
                        "tokens_per_s": run.throughput.tokens_per_s,
                        "peak_share": run.throughput.peak_share,
                        "masked_share": masked_share(*masked.tolist()),
                    }
                    bar.set_postfix(
                        loss=f"{logs['loss']:.3f}",
                        acc0=f"{acc0:.2f}",
                        masked=f"{logs['masked_share']:.0%}",
                        tok_s=f"{logs['tokens_per_s']:.0f}",
                        peak=f"{logs['peak_share']:.1%}",
                    )
                    accelerator.log(logs, step=p.step)
                if p.step % t["eval_every"] == 0 or p.step in t["eval_steps"] or p.step == total_steps:
                    evaluate_into(run, p.eval_history, p.step, p.tokens)
                if p.step % t["save_every"] == 0 or p.step == total_steps:
                    save_checkpoint(
                        accelerator,
                        ckpt_root,
                        p.step,
                        p.state(p.wall_before + time.time() - t0),
                        t["keep_checkpoints"],
                        run.run_id,
                    )
                if p.step >= total_steps:
                    break
            else:
                p.epoch, p.batches_in_epoch = p.epoch + 1, 0
                continue
            break
    finally:
        bar.close()
    # collective (gathers a sharded FSDP draft on every process): before end_training ends the process group
    state_dict = accelerator.get_state_dict(draft)
    accelerator.end_training()
    return state_dict, p.wall_before + time.time() - t0


def finish(run: Run, progress: Progress, state_dict: dict, wall: float, vocab_info: dict, earlier: list[dict]) -> Path:
    """Write the draft folder (weights or LoRA adapter, ``training_metrics.json``) and mark the run finished."""
    accelerator, recipe = run.accelerator, run.recipe
    out_dir = Path(recipe["output_dir"])
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(run.draft)
        metrics = training_metrics(
            recipe, vocab_info, progress.step, progress.eval_history, wall, earlier, run.throughput.report()
        )
        export_draft(model, out_dir, metrics=metrics, state_dict=state_dict)
        atomic_write_json(
            Path(recipe["work_dir"]) / FINISHED,
            {"output_dir": str(out_dir), "steps": progress.step, "wall_time_s": round(wall, 1), "run_id": run.run_id},
        )
        accelerator.print(f"[done] draft written to {out_dir} ({progress.step} steps, {wall / 60:.1f} min)")
    return out_dir
