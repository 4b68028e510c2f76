"""`eagle3-hub train`: target + data -> a trained EAGLE-3 draft folder.

    eagle3-hub train --config recipes/smollm2-135m-instruct.yaml [--train.lr 3e-4 ...] [--resume | --overwrite]
    accelerate launch --config_file recipes/accelerate/ddp.yaml -m eagle3_hub.commands.train --config ...

Stages: data (load, regenerate, tokenise; cached in work_dir) -> draft vocabulary -> features (online, or an
offline cache of safetensors shards) -> TTT training with checkpoints -> the draft folder (+ metrics, card).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..extras import missing_extra

try:
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from datasets import Dataset, DatasetDict, load_from_disk
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from .. import Eagle3DraftModel
from ..atomic import atomic_dir, atomic_write_json
from ..targets import check_aux_layer_ids, cpu_has_bf16_units, load_target, num_decoder_layers
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
from .data import GENERATION_REPORT, build_conversations
from .features import OfflineFeatures, aux_features
from .generation import regeneration_draft
from .losses import parse_loss
from .recipe import draft_config_overrides, load_recipe, load_stages
from .sources import DataError
from .tokenise import tokenize_dataset
from .ttt import acceptance_metrics, draft_token_ids, target_logit_positions, ttt_loss
from .vocab import coverage_table, remap_draft_vocab, select_draft_vocab, token_counts


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


class LengthGroupedBatches(torch.utils.data.Sampler):
    """Batches of samples of similar length, in random order: less padding, so less work per token.

    Each epoch shuffles all samples with ``generator``, cuts them into groups of ``group`` batches, sorts
    each group by length, and shuffles the batches. Like transformers' ``group_by_length``; deterministic
    given the generator's state, so a resumed run replays the same batches."""

    def __init__(self, lengths: list[int], batch_size: int, generator: torch.Generator, group: int = 32):
        self.lengths, self.batch_size, self.generator, self.group = lengths, batch_size, generator, group

    def __len__(self) -> int:
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        span = self.batch_size * self.group
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start:start + span], key=lambda i: -self.lengths[i])
            batches += [chunk[b:b + self.batch_size] for b in range(0, len(chunk), self.batch_size)]
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]


# ------------------------------------------------------------------------------------------------- stages
def data_key(recipe: dict, tokenizer) -> dict:
    """What the tokenised data depends on: a different key rebuilds it (the `datasets` cache keeps reruns cheap)."""
    target = {k: v for k, v in recipe["target"].items() if k != "dtype"}
    data = {k: v for k, v in recipe["data"].items()
            if not (k == "seed" and v is None) and k not in ("regenerate_with", "regenerate_draft")}
    return {"data": data, "seed": data_seed(recipe), "target": target,
            "tokenizer": getattr(tokenizer, "name_or_path", None)}


def held_out_split(tok: Dataset, eval_samples: int, seed: int) -> DatasetDict:
    """Train/held-out split: ``eval_samples`` (at most a tenth of the data, at least one), drawn from the samples
    whose ``eval_ok`` is true only (the others come from `eval: false` sources, which an earlier stage trained on)."""
    n_eval = min(eval_samples, max(1, len(tok) // 10))
    flags = tok["eval_ok"] if "eval_ok" in tok.column_names else [True] * len(tok)
    eligible = [i for i, ok in enumerate(flags) if ok]
    if len(eligible) == len(tok):
        split = tok.train_test_split(test_size=n_eval, seed=seed)
    elif not eligible:
        raise DataError("Every data source is marked `eval: false`: leave at least one source (or `data.synthesize`) "
                        "without it, so that the held-out split has samples no stage trained on.")
    else:
        held = set(random.Random(seed).sample(eligible, min(n_eval, len(eligible))))
        split = DatasetDict(train=tok.select([i for i in range(len(tok)) if i not in held]), test=tok.select(sorted(held)))
    return split.remove_columns([c for c in ("eval_ok",) if c in tok.column_names])


def data_seed(recipe: dict) -> int:
    """The seed of the data's order and held-out split: ``data.seed``, else ``train.seed``."""
    return recipe["train"]["seed"] if recipe["data"]["seed"] is None else recipe["data"]["seed"]


def prepare_data(recipe: dict, target, tokenizer, accelerator: Accelerator):
    """Conversations -> tokenised train/eval splits, saved under work_dir/data (reruns reuse them)."""
    work = Path(recipe["work_dir"]) / "data"
    final = work / "tokenized"
    key_path = work / "data_key.json"
    d = recipe["data"]
    key = json.loads(json.dumps(data_key(recipe, tokenizer)))
    # a folder written before data_key.json existed is reused as is
    stale = key_path.exists() and json.loads(key_path.read_text()) != key
    if accelerator.is_main_process and (stale or not (final / "dataset_dict.json").exists()):
        if stale:
            print(f"[data] the data settings changed since {final} was written: rebuilding it")
        convs = build_conversations(
            d["sources"], target, tokenizer, work, seed=data_seed(recipe), synthesize=d["synthesize"],
            regenerate_responses=d["regenerate"], max_new_tokens=d["max_new_tokens"], temperature=d["temperature"],
            batch_size=d["gen_batch_size"], max_turns=d["max_turns"], strip_patterns=d["strip_patterns"],
            synthesize_seed=d["synthesize_seed"], synthesize_openers=d["synthesize_openers"],
            synthesize_batch_size=d["synthesize_batch_size"], regenerate_with=d["regenerate_with"],
            regenerate_draft=d["regenerate_draft"], target_name=recipe["target"]["name"],
            answer_sampling=d["answer_sampling"],
        )
        tok, report = tokenize_dataset(convs, tokenizer, d["max_length"], num_proc=d["num_proc"])
        if len(tok) < 2:
            raise DataError(f"Only {len(tok)} usable sample(s) ({report}): training needs at least 2 (train + held-out).")
        tok = tok.add_column("index", list(range(len(tok))))
        split = held_out_split(tok, d["eval_samples"], data_seed(recipe))
        with atomic_dir(final) as tmp:
            split.save_to_disk(str(tmp))
        report["eval_candidates"] = sum(tok["eval_ok"])  # samples of no `eval: false` source
        if (work / GENERATION_REPORT).exists():  # which decoder wrote the answers, and how fast
            report["generation"] = json.loads((work / GENERATION_REPORT).read_text())
        atomic_write_json(work / "data_report.json", {**report, "train": len(split["train"]), "eval": len(split["test"])})
        atomic_write_json(key_path, key)
        print(f"[data] {report}; train {len(split['train'])}, eval {len(split['test'])}")
    accelerator.wait_for_everyone()
    split = load_from_disk(str(final))
    return split["train"], split["test"]


def prepare_vocab(recipe: dict, train_ds, tokenizer, vocab_size: int, draft_ids: torch.Tensor | None = None,
                  reselect: bool = False, write: bool = True) -> tuple[torch.Tensor, dict]:
    """The draft vocabulary (``vocab.json`` in work_dir): the most frequent loss tokens, or ``draft_ids`` (the
    target ids of an existing draft's vocabulary, ``draft.init_from``), with the coverage either achieves.
    ``reselect``: choose anew from this data although there is a draft (``draft.reselect_vocab``); its tokens win
    ties, and its size is the default."""
    path = Path(recipe["work_dir"]) / "vocab.json"
    keep = draft_ids is not None and not reselect
    size = recipe["draft"]["draft_vocab_size"] or vocab_size
    if draft_ids is not None and (keep or recipe["draft"]["draft_vocab_size"] is None):
        size = len(draft_ids)
    data = getattr(train_ds, "_fingerprint", None)
    if path.exists() and not keep:
        saved = json.loads(path.read_text())
        if saved["draft_vocab_size"] == size and saved.get("data", data) == data and not saved.get("from_draft"):
            return torch.tensor(saved["target_ids"]), saved
    counts = token_counts(train_ds, vocab_size)
    old = torch.as_tensor(draft_ids).cpu() if draft_ids is not None else None
    old_coverage = counts[old].sum().item() / max(1, counts.sum().item()) if old is not None else None
    if keep:
        ids, coverage = old, old_coverage
    else:
        ids, coverage = select_draft_vocab(counts, size, always_include=[tokenizer.eos_token_id], prefer=old)
    info = {"draft_vocab_size": size, "coverage": coverage, "coverage_by_size": coverage_table(counts),
            "loss_tokens": int(counts.sum()), "from_draft": keep, "data": data, "target_ids": ids.tolist()}
    if reselect and old is not None:
        info["init_from_coverage"] = old_coverage
    if write:  # every process computes the same selection; one writes it
        atomic_write_json(path, info)
        print(f"[vocab] {size} tokens cover {coverage:.2%} of {int(counts.sum())} loss tokens")
    return ids, info


# temperatures, besides greedy and T=1, at which the held-out split's expected acceptance is reported: where chat
# users sample
EVAL_TEMPERATURES = (0.7,)


def objective(draft, aux, batch, logits, t: dict, temperatures: tuple[float, ...] = ()):
    """The TTT loss of a batch with the recipe's ``train`` settings."""
    return ttt_loss(draft, aux, batch["input_ids"], logits, batch["loss_mask"], batch["attention_mask"],
                    ttt_steps=t["ttt_steps"], step_weight=t["step_weight"], loss=t["loss"], lk_eta=t["lk_eta"],
                    temperatures=temperatures)


@torch.no_grad()
def evaluate(draft, target, loader, recipe, features, accelerator) -> dict:
    draft.eval()
    t = recipe["train"]
    sums = None
    for batch in loader:
        aux, logits = features(batch)
        with accelerator.autocast():
            out = objective(draft, aux, batch, logits, t, EVAL_TEMPERATURES)
        vals = [out.loss.detach() * out.chain_count, out.step_correct, out.step_count, out.chain_correct, out.chain_count,
                out.step_trained, out.step_alpha, out.chain_alpha, out.chain_alpha_at]
        sums = vals if sums is None else [a + b for a, b in zip(sums, vals)]
    draft.train()
    sums = [accelerator.reduce(v.float(), "sum") for v in sums]
    m = acceptance_metrics(sums[1], sums[2], sums[3], sums[4], sums[6], sums[7], sums[8], EVAL_TEMPERATURES)
    m["loss"] = (sums[0] / sums[4].clamp(min=1)).item()
    m["masked_share"] = masked_share(sums[2].sum(), sums[5].sum())
    return m


# Positions whose target token lies outside the draft vocabulary are masked out of the loss. Answers written by the
# target itself keep that share near the vocabulary's coverage gap; a high share means the data's answers are not the
# target's (data.regenerate: false on foreign data), and a run masking nearly everything trains on nothing.
MASKED_WARN, MASKED_STOP, MASKED_CHECK_STEPS = 0.25, 0.99, 10


def masked_share(scored, trained) -> float:
    scored, trained = float(scored), float(trained)
    return 1.0 - trained / scored if scored else 0.0


def check_masked_share(share: float, steps: int, recipe: dict, vocab_size: int) -> str | None:
    """Stop a run that trains on (nearly) nothing (ValueError), or return a warning for one that masks much."""
    if share < MASKED_WARN:
        return None
    d = recipe["draft"]
    fix = ("set data.regenerate: true so that the target writes the answers"
           + (", or draft.reselect_vocab: true" if d["init_from"] else ", or raise draft.draft_vocab_size"))
    what = (f"{share:.1%} of the positions to learn in the first {steps} step(s) are masked out: the target's next "
            f"token there lies outside the draft vocabulary ({vocab_size} tokens)")
    if share >= MASKED_STOP:
        raise ValueError(f"{what}, so the draft learns (nearly) nothing. The data's answers are not the target's own: {fix}.")
    return f"[warn] {what}. If the data's answers were not written by this target: {fix}."


# ------------------------------------------------------------------------------------------------- main
def check_recipe(recipe: dict) -> None:
    """Checks that need no model, made before anything is loaded or written."""
    t, d, data = recipe["train"], recipe["draft"], recipe["data"]
    regeneration_draft(data["regenerate_with"], data["regenerate_draft"], recipe["target"]["name"])  # bad values fail early
    if recipe["features"]["mode"] not in ("online", "offline"):
        raise ValueError(f"features.mode must be `online` or `offline`, got {recipe['features']['mode']!r}")
    reuse = recipe["features"]["reuse_from"]
    if not isinstance(reuse, list) or not all(isinstance(p, str) for p in reuse):
        raise ValueError(f"features.reuse_from must be a list of earlier runs' work_dirs, got {reuse!r}")
    if reuse and recipe["features"]["mode"] != "offline":
        raise ValueError("features.reuse_from copies offline features: set features.mode: offline, or remove it.")
    if recipe["lora"]["enabled"] and not d["init_from"]:
        raise ValueError("lora.enabled adapts an existing draft: set draft.init_from to its folder or Hub id.")
    if not isinstance(d["reselect_vocab"], bool):
        raise ValueError(f"draft.reselect_vocab must be true or false, got {d['reselect_vocab']!r}")
    if d["reselect_vocab"] and not d["init_from"]:
        raise ValueError("draft.reselect_vocab chooses a new vocabulary for the draft of draft.init_from: set "
                         "init_from, or leave reselect_vocab false (a new draft always takes its vocabulary from the data).")
    if d["reselect_vocab"] and recipe["lora"]["enabled"]:
        raise ValueError("draft.reselect_vocab changes the draft's lm_head, but LoRA adapters are saved for the draft "
                         "as it is: turn one of them off.")
    positive = ["ttt_steps", "batch_size", "grad_accum", "save_every", "eval_every", "log_every", "keep_checkpoints", "epochs"]
    bad = [f"train.{k}={t[k]!r}" for k in positive if isinstance(t[k], bool) or not isinstance(t[k], int) or t[k] < 1]
    if t["max_steps"] is not None and (not isinstance(t["max_steps"], int) or t["max_steps"] < 1):
        bad.append(f"train.max_steps={t['max_steps']!r}")
    if data["seed"] is not None and (isinstance(data["seed"], bool) or not isinstance(data["seed"], int)):
        bad.append(f"data.seed={data['seed']!r}")
    if not isinstance(data["max_length"], int) or data["max_length"] < 4:
        bad.append(f"data.max_length={data['max_length']!r}")
    if bad:
        raise ValueError(f"Expected positive integers: {', '.join(bad)}")
    parse_loss(t["loss"])
    if isinstance(t["lk_eta"], bool) or not isinstance(t["lk_eta"], (int, float)) or not t["lk_eta"] >= 0:
        raise ValueError(f"train.lk_eta must be a non-negative number (the paper's eta: 3), got {t['lk_eta']!r}")
    if d["draft_vocab_size"] is not None and (not isinstance(d["draft_vocab_size"], int) or d["draft_vocab_size"] < 1):
        raise ValueError(f"draft.draft_vocab_size must be a positive integer or null, got {d['draft_vocab_size']!r}")
    if not data["sources"] and not data["synthesize"]:
        raise DataError("No data: give `data.sources` and/or `data.synthesize` > 0 in the recipe.")
    openers = data["synthesize_openers"]
    if not isinstance(openers, list) or not all(isinstance(o, str) for o in openers):
        raise ValueError(f"data.synthesize_openers must be a list of strings (e.g. [\"Write\", \"Explain\", \"\"]), got {openers!r}")
    for src in data["sources"]:
        if isinstance(src, dict) and not isinstance(src.get("eval", True), bool):
            raise ValueError(f"`eval` of the data source {src.get('path')!r} must be true or false, got {src['eval']!r}")


@torch.no_grad()
def init_head_from_target(draft: Eagle3DraftModel, target) -> None:
    """``draft.lm_head`` <- the target's output rows of the draft vocabulary, scaled by the target's final norm.

    The draft normalises with a plain RMSNorm (weight 1 here); the target's final norm multiplies each channel
    by its own gain (``w`` for Llama, ``1 + w`` for Gemma). Feeding the norm an all-ones vector (RMS 1) reads
    that gain whatever the parametrisation, and folding it into the rows makes ``lm_head(norm(h))`` equal the
    target's logits of those tokens (before any final soft-capping, which keeps the order)."""
    head = target.get_output_embeddings()
    norm = getattr(target.get_decoder(), "norm", None)
    if head is None or norm is None:
        raise ValueError(f"draft.head_from_target: {type(target).__name__} exposes no output embedding and final norm; "
                         "set draft.head_from_target to false.")
    ids = draft.draft_to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device))
    weight = head.weight.detach().float()
    probe = torch.ones(1, weight.shape[1], device=weight.device, dtype=next(norm.parameters()).dtype)
    gain = norm(probe).float()[0]  # (H,)
    draft.norm.weight.fill_(1.0)
    draft.lm_head.weight.copy_((weight[ids.to(weight.device)] * gain).to(draft.lm_head.weight))


def earlier_stages(init_from: str) -> list[dict]:
    """The lineage of a draft that training continues: its own ``training_metrics.json`` (local folder or Hub
    repo) summarised, after the stages it lists itself. Empty when the draft carries none."""
    path = Path(init_from) / "training_metrics.json"
    if not path.exists():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(init_from, "training_metrics.json"))
        except Exception:  # no such file, no network, not a repo id: the lineage is unknown, training goes on
            return []
    prev = json.loads(path.read_text())
    recipe = prev.get("recipe") or {}
    data = recipe.get("data") or {}
    stage = {
        "init_from": (recipe.get("draft") or {}).get("init_from"),
        "sources": [src if isinstance(src, str) else src.get("path") for src in data.get("sources") or []],
        "synthesize": data.get("synthesize"),
        "training_samples": (prev.get("data") or {}).get("train"),
        "steps": prev.get("steps"),
        "batch_size": (recipe.get("train") or {}).get("batch_size"),
        "lr": (recipe.get("train") or {}).get("lr"),
        "wall_time_s": prev.get("wall_time_s"),
        "expected_acceptance_length": (prev.get("acceptance") or {}).get("expected_acceptance_length"),
    }
    return list(prev.get("earlier_stages") or []) + [stage]


def load_init_draft(path: str, target) -> Eagle3DraftModel:
    """An existing draft to continue from (``draft.init_from``): it must fit the target."""
    draft = Eagle3DraftModel.from_pretrained(path, target=target)  # checks the fit, shares the target's embedding
    return draft.unbind(keep_target=False)  # training calls the target itself: no feature hooks


def resolve_mixed_precision(mixed_precision: str) -> str:
    """``train.mixed_precision`` for accelerate: ``auto`` is bf16 autocast on GPUs that have it (fp16 on older ones)
    and on CPUs with bf16 units (AVX512-BF16 / AMX), none on other CPUs, where bf16 matmuls are emulated and
    slower than float32."""
    if mixed_precision != "auto":
        return mixed_precision
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_bf16_units() else "no"


def train(recipe: dict, resume: bool = False, overwrite: bool = False, data_only: bool = False) -> Path:
    """Run a recipe (see ``recipe.DEFAULTS`` and recipes/README.md) and return the draft folder; ``data_only``: stop
    after the data (generated, tokenised, with its reports in work_dir/data) and return that folder.

    Bad input (recipe values, target, draft vocabulary size, aux layers, an existing draft that does not fit,
    missing chat template, empty or malformed data) raises before anything is written to work_dir. With
    ``resume``, training continues from the latest checkpoint in work_dir and ends where an uninterrupted run
    would have ended (same data order, optimizer, scheduler and RNG state). A run only resumes its own checkpoints:
    work_dir's checkpoints of another recipe (or, without ``resume``, of any run) stop it before anything is written,
    unless ``overwrite`` moves that run aside to ``<work_dir>/previous-<time>``."""
    check_recipe(recipe)
    if resume and overwrite:
        raise ValueError("--resume continues the run in work_dir and --overwrite moves it aside: pass one of them.")
    identity = run_identity(recipe)
    rid = run_id(identity)
    ckpt_root = Path(recipe["work_dir"]) / "checkpoints"
    previous = None if data_only else claim_work_dir(Path(recipe["work_dir"]), identity, resume, overwrite)
    t, d = recipe["train"], recipe["draft"]
    if t["num_threads"]:
        torch.set_num_threads(int(t["num_threads"]))
    mp = resolve_mixed_precision(t["mixed_precision"])
    work = Path(recipe["work_dir"])
    # the scheduler is stepped once per optimizer step here (accelerate would step it once per process)
    accelerator = Accelerator(mixed_precision=mp, gradient_accumulation_steps=t["grad_accum"],
                              log_with="tensorboard", project_dir=str(work), step_scheduler_with_optimizer=False)
    set_seed(t["seed"])
    if accelerator.is_main_process:  # before this run's logs start: an older run moves aside whole
        if previous is not None:
            move_aside(work, previous)
        recover(ckpt_root)  # a checkpoint swap or removal cut short by a kill
    accelerator.wait_for_everyone()

    # ---- the target and everything that can be checked before writing
    tg = recipe["target"]
    target, tokenizer = load_target(tg["name"], dtype=tg["dtype"], device=accelerator.device,
                                    gguf_file=tg["gguf_file"], adapter=tg["adapter"])
    if tg["chat_template"]:
        tokenizer.chat_template = tg["chat_template"]
    if not tokenizer.chat_template:
        raise DataError(f"The tokenizer of {tg['name'] or 'the target'} has no chat template: the loss mask needs one. "
                        "Set target.chat_template in the recipe (a base model: e.g. the prompt, a newline, the "
                        "continuation; see recipes/gemma-3-270m.yaml), or use a chat (instruct) model.")
    L = num_decoder_layers(target)
    if d["aux_layer_ids"] is not None:
        check_aux_layer_ids(d["aux_layer_ids"], L)
    vocab_size = target.config.get_text_config().vocab_size
    size = d["draft_vocab_size"]
    if size is not None and not 0 < size <= vocab_size:
        raise ValueError(f"draft.draft_vocab_size={size} must be in 1..{vocab_size} (the target vocabulary)")
    # data_only: the data does not depend on the draft, which a later stage's data may be prepared before
    init = load_init_draft(d["init_from"], target) if d["init_from"] and not data_only else None
    arch = draft_config_overrides(recipe)  # e.g. fc_norm: Eagle3Config keys of the recipe's draft section
    for key, value in arch.items() if init is not None else ():
        if getattr(init.config, key, None) != value:
            raise ValueError(f"draft.{key}={value!r} changes the architecture of draft.init_from ({d['init_from']} has "
                             f"{getattr(init.config, key, None)!r}): a continued draft keeps its own; remove the key, or "
                             "train a new draft (no init_from).")
    earlier = earlier_stages(d["init_from"]) if init is not None else []  # read now: output_dir may be init_from
    if init is not None and not d["reselect_vocab"] and size != init.config.draft_vocab_size and accelerator.is_main_process:
        print(f"[vocab] draft.init_from keeps its own vocabulary of {init.config.draft_vocab_size} tokens "
              f"(draft.draft_vocab_size={size} is not used; draft.reselect_vocab: true chooses a new one)")

    # ---- data (cached in work_dir/data) and the draft vocabulary
    train_ds, eval_ds = prepare_data(recipe, target, tokenizer, accelerator)
    if data_only:
        accelerator.print(f"[data] {len(train_ds)} train and {len(eval_ds)} held-out samples in {work / 'data'}")
        return work / "data"
    init_ids = init.draft_to_target_ids(torch.arange(init.config.draft_vocab_size, device=init.d2t.device)) if init is not None else None
    vocab_ids, vocab_info = prepare_vocab(recipe, train_ds, tokenizer, vocab_size, draft_ids=init_ids,
                                          reselect=d["reselect_vocab"], write=accelerator.is_main_process)
    accelerator.wait_for_everyone()

    # ---- the draft (fresh, from an existing one, or LoRA adapters on an existing one)
    if init is not None:
        draft = init
        if d["reselect_vocab"]:
            draft = draft.float()
            vocab_info["remap"] = remap_draft_vocab(draft, vocab_ids, target.get_output_embeddings().weight)
            if accelerator.is_main_process:
                print(f"[vocab] chosen anew (init_from's covered {vocab_info['init_from_coverage']:.2%}); "
                      f"lm_head rows {vocab_info['remap']}")
    else:
        draft = Eagle3DraftModel.from_target(target, aux_layer_ids=d["aux_layer_ids"], draft_vocab_size=size,
                                             intermediate_size=d["intermediate_size"], **arch)
        draft.set_vocab_mapping(vocab_ids)
        if d["head_from_target"]:
            init_head_from_target(draft, target)
    draft = draft.float().to(accelerator.device)  # fp32 master weights; autocast does the rest
    draft.embed_tokens.weight.requires_grad_(False)
    if recipe["lora"]["enabled"]:
        try:
            from peft import LoraConfig, get_peft_model
        except ModuleNotFoundError as e:
            raise missing_extra("train", e) from None

        lc = recipe["lora"]
        draft.requires_grad_(False)
        draft = get_peft_model(draft, LoraConfig(r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=lc["dropout"],
                                                 target_modules=lc["target_modules"]))
    if t["gradient_checkpointing"]:
        draft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    draft.train()
    aux_ids = draft_aux_ids(draft)

    # ---- features
    features = OfflineFeatures(recipe, target, aux_ids, accelerator) if recipe["features"]["mode"] == "offline" else None
    if features is not None:
        features.build([train_ds, eval_ds], tokenizer.pad_token_id)

    def get_features(batch):
        # the loss reads the target's logits over the draft vocabulary, and of the rest only argmax and log-sum-exp
        at = target_logit_positions(batch["loss_mask"].bool() & batch["attention_mask"].bool())
        ids = draft_token_ids(draft)
        if features is not None:
            return features.load(batch, logits_at=at, draft_ids=ids)
        return aux_features(target, batch["input_ids"], batch["attention_mask"], aux_ids, logits_at=at, draft_ids=ids)

    # ---- loaders, optimizer, schedule
    pad = tokenizer.pad_token_id
    g = torch.Generator().manual_seed(t["seed"])
    if t["group_by_length"]:
        sampler = LengthGroupedBatches([len(x) for x in train_ds["input_ids"]], t["batch_size"], g)
        train_loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=lambda b: collate(b, pad))
    else:
        train_loader = DataLoader(train_ds, batch_size=t["batch_size"], shuffle=True, generator=g, collate_fn=lambda b: collate(b, pad))
    eval_loader = DataLoader(eval_ds, batch_size=t["batch_size"], shuffle=False, collate_fn=lambda b: collate(b, pad))
    train_loader, eval_loader = accelerator.prepare(train_loader, eval_loader)
    steps_per_epoch = math.ceil(len(train_loader) / t["grad_accum"])  # per process: each one sees its shard
    total_steps = t["max_steps"] or steps_per_epoch * t["epochs"]

    def lr_lambda(step):  # linear warmup, cosine to 10%
        if step < t["warmup_steps"]:
            return (step + 1) / t["warmup_steps"]
        progress = min(1.0, (step - t["warmup_steps"]) / max(1, total_steps - t["warmup_steps"]))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    draft, optimizer, scheduler = accelerator.prepare(draft, optimizer, scheduler)
    accelerator.init_trackers("tensorboard")

    # ---- resume (this run's own checkpoints only)
    step, epoch, skip, wall_before = 0, 0, 0, 0.0
    history: list = []
    last = latest_checkpoint(ckpt_root, rid) if resume else None
    if resume and last is None:
        accelerator.print("[resume] no checkpoint found: starting from scratch")
    if last is not None:
        accelerator.load_state(str(last))
        state = read_state(last)
        step, epoch, skip, history = state["step"], state["epoch"], state["batches_in_epoch"], state["eval_history"]
        wall_before = state.get("wall_time_s", 0.0)
        accelerator.print(f"[resume] from {last} (step {step}, epoch {epoch}, batch {skip})")
    if accelerator.is_main_process:
        (work / FINISHED).unlink(missing_ok=True)  # this run is not finished (yet)
        record_run(work, identity)
    accelerator.wait_for_everyone()

    eval_path = work / "eval_metrics.json"

    def run_eval(at_step: int) -> None:
        m = evaluate(draft, target, eval_loader, recipe, get_features, accelerator)
        history.append({"step": at_step, **m})
        accelerator.log({"eval/loss": m["loss"], "eval/acceptance_length": m["expected_acceptance_length"],
                         "eval/masked_share": m["masked_share"], "eval/acceptance_length_sampled": m["expected_acceptance_length_sampled"],
                         **{f"eval/acceptance_length_T{t}": v for t, v in m["expected_acceptance_length_at"].items()},
                         **{f"eval/acc_{k}": a for k, a in enumerate(m["step_accuracy"])}}, step=at_step)
        accelerator.print(f"[eval] step {at_step}: loss {m['loss']:.3f}, expected acceptance length "
                          f"{m['expected_acceptance_length']:.2f}, step accuracy " + " ".join(f"{a:.2f}" for a in m["step_accuracy"])
                          + "".join(f", at T={t} {v:.2f}" for t, v in m["expected_acceptance_length_at"].items())
                          + f", at T=1 {m['expected_acceptance_length_sampled']:.2f}, masked {m['masked_share']:.1%}")
        if accelerator.is_main_process:
            atomic_write_json(eval_path, {"eval_history": history})

    if init is not None and step == 0:  # a continued draft: its score on this held-out split before any step
        run_eval(0)
    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", disable=not accelerator.is_local_main_process)
    tokens_seen, t0 = 0, time.time()
    masked = torch.zeros(2)  # positions scored, positions trained, since this run (re)started
    start_step = step
    check_at = step + min(MASKED_CHECK_STEPS, total_steps - step)
    try:  # the bar ends its line before any error is printed
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
                        out = objective(draft, aux, batch, logits, t)
                    accelerator.backward(out.loss)
                    masked += torch.stack([out.step_count.sum(), out.step_trained.sum()]).float().cpu()
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(draft.parameters(), t["grad_clip"])
                    optimizer.step()
                    if accelerator.sync_gradients:
                        scheduler.step()
                    optimizer.zero_grad()
                batches_in_epoch += 1
                tokens_seen += int(batch["attention_mask"].sum()) * accelerator.num_processes
                if not accelerator.sync_gradients:
                    continue
                step += 1
                bar.update(1)
                if step == check_at:
                    counts = accelerator.reduce(masked.to(accelerator.device), "sum")
                    warning = check_masked_share(masked_share(*counts.tolist()), step - start_step, recipe, len(vocab_ids))
                    if warning:
                        accelerator.print(warning)
                if step % t["log_every"] == 0 or step == total_steps:
                    acc0 = (out.step_correct[0] / out.step_count[0].clamp(min=1)).item()
                    logs = {"loss": out.loss.item(), "acc0": acc0, "lr": scheduler.get_last_lr()[0],
                            "tokens_per_s": tokens_seen / (time.time() - t0), "masked_share": masked_share(*masked.tolist())}
                    bar.set_postfix(loss=f"{logs['loss']:.3f}", acc0=f"{acc0:.2f}", masked=f"{logs['masked_share']:.0%}",
                                    tok_s=f"{logs['tokens_per_s']:.0f}")
                    accelerator.log(logs, step=step)
                if step % t["eval_every"] == 0 or step == total_steps:
                    run_eval(step)
                if step % t["save_every"] == 0 or step == total_steps:
                    save_checkpoint(accelerator, ckpt_root, step, {"step": step, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
                                                                    "eval_history": history,
                                                                    "wall_time_s": wall_before + time.time() - t0},
                                    t["keep_checkpoints"], rid)
                if step >= total_steps:
                    break
            else:
                epoch, skip = epoch + 1, 0
                continue
            break
    finally:
        bar.close()
    # collective (gathers a sharded FSDP draft on every process): before end_training ends the process group
    state_dict = accelerator.get_state_dict(draft)
    accelerator.end_training()
    wall = wall_before + time.time() - t0

    # ---- the draft folder: weights (or the LoRA adapter), training_metrics.json, model card
    out_dir = Path(recipe["output_dir"])
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(draft)
        final = history[-1] if history else {}
        metrics = {
            "recipe": recipe,
            "vocab": {k: v for k, v in vocab_info.items() if k != "target_ids"},
            "data": json.loads((work / "data" / "data_report.json").read_text()),
            "steps": step,
            # the held-out split at the last step: accuracy of draft step k vs the target's argmax, and the
            # expected number of tokens per target forward when a chain of ttt_steps drafts is verified
            "acceptance": {k: final.get(k) for k in ("step", "loss", "step_accuracy", "chain_acceptance", "expected_acceptance_length",
                                                     "step_expected_acceptance", "expected_acceptance_length_sampled",
                                                     "expected_acceptance_length_at", "masked_share")},
            "eval_history": history,
            "wall_time_s": round(wall, 1),
            "earlier_stages": earlier,  # the training of draft.init_from, oldest first
        }
        export_draft(model, out_dir, metrics=metrics, state_dict=state_dict)
        atomic_write_json(work / FINISHED, {"output_dir": str(out_dir), "steps": step, "wall_time_s": round(wall, 1),
                                            "run_id": rid})
        accelerator.print(f"[done] draft written to {out_dir} ({step} steps, {wall / 60:.1f} min)")
    return out_dir


def draft_aux_ids(draft) -> list[int]:
    model = draft
    while not hasattr(model, "config") or not hasattr(model.config, "aux_layer_ids"):
        model = model.base_model if hasattr(model, "base_model") and model.base_model is not model else model.module
    return model.config.aux_layer_ids


def export_draft(model, out_dir: Path, metrics: dict | None = None, state_dict: dict | None = None) -> None:
    """bf16 weights without the target's embedding (+ ``training_metrics.json``), written to a temporary folder
    and renamed into place. A LoRA draft is saved as its adapter (a ``PeftModel`` of the draft), in fp32.
    ``state_dict``: the full weights when ``model`` is sharded (``accelerator.get_state_dict``)."""
    with atomic_dir(out_dir) as tmp:
        if hasattr(model, "peft_config"):
            model.save_pretrained(tmp, state_dict=state_dict)
        else:
            model = model.to(torch.bfloat16)  # (config.json says bfloat16)
            state_dict = model.state_dict() if state_dict is None else state_dict
            state_dict = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).cpu().contiguous()
                          for k, v in state_dict.items() if k != "embed_tokens.weight"}
            model.save_pretrained(tmp, state_dict=state_dict)
        if metrics is not None:
            atomic_write_json(tmp / "training_metrics.json", metrics)


def train_recipe(config: str | None, overrides: dict | None = None, resume: bool = False, overwrite: bool = False,
                 from_stage: int = 1, data_only: bool = False, after_stage=None):
    """Train every stage of a recipe file in turn (``--resume`` skips the stages that finished in their work_dir).
    ``from_stage`` N starts at stage N, continuing the draft that stage N - 1 wrote (a shipped draft, say);
    ``data_only`` prepares each stage's data and trains nothing. ``after_stage(recipe, output_dir)`` runs after
    each stage that trained (``eagle3-hub train`` writes the card and pushes there: training knows neither).

    Raises ``ValueError`` / ``DataError`` / ``OSError`` for bad input, and what ``after_stage`` raises."""
    overrides = overrides or {}
    chain = load_stages(load_recipe(config, overrides), overrides)
    for stage in chain:
        check_recipe(stage)
    from .recipe import check_stage_number

    check_stage_number(chain, from_stage)  # 0, or past the last stage, would train nothing (--data-only too)
    if from_stage > 1 and not data_only:
        check_stage_start(chain, from_stage)
    names = [config] + [st if isinstance(st, str) else f"{config} stage {i}"
                        for i, st in enumerate(chain[0]["stages"], start=2)]
    for i, (name, recipe) in enumerate(zip(names, chain), start=1):
        if i < from_stage:
            continue
        if len(chain) > 1:
            print(f"[stages] stage {i}/{len(chain)}: {name}", flush=True)
        if data_only:
            train(recipe, data_only=True)
            continue
        if resume and finished_run(recipe):
            print(f"[resume] {name} finished earlier ({Path(recipe['work_dir']) / FINISHED}): skipped; "
                  "run with --overwrite instead of --resume to train it again", flush=True)
            continue
        out = train(recipe, resume=resume, overwrite=overwrite)
        if after_stage is not None:
            after_stage(recipe, out)


def check_stage_start(chain: list[dict], from_stage: int) -> None:
    """Stage ``from_stage`` can start only from a draft that stage ``from_stage - 1`` wrote: the draft in its
    ``init_from`` must record, in its ``training_metrics.json``, that many stages of training on that stage's data
    sources (another draft there would be trained on silently)."""
    if not 1 <= from_stage <= len(chain):
        raise ValueError(f"--from-stage {from_stage}: the recipe has stages 1 to {len(chain)}")
    before, init = chain[from_stage - 2], chain[from_stage - 1]["draft"]["init_from"]
    metrics = Path(init) / "training_metrics.json"
    if not (Path(init) / "config.json").is_file():
        raise ValueError(f"--from-stage {from_stage} continues the draft of stage {from_stage - 1} in {init}, which "
                         f"holds no draft: train the earlier stages first, or drop --from-stage")
    try:
        prev = json.loads(metrics.read_text())
    except (OSError, ValueError):
        prev = {}
    paths = lambda srcs: [src if isinstance(src, str) else src.get("path") for src in srcs or []]  # noqa: E731
    depth = len(prev.get("earlier_stages") or []) + 1 if prev else 0
    sources = paths(((prev.get("recipe") or {}).get("data") or {}).get("sources"))
    if depth != from_stage - 1 or sources != paths(before["data"]["sources"]):
        raise ValueError(f"--from-stage {from_stage}: the draft in {init} is not the one stage {from_stage - 1} "
                         f"writes ({metrics} records {depth} stage(s) of training, the last on {len(sources)} "
                         f"source(s); stage {from_stage - 1} is stage {from_stage - 1} on "
                         f"{len(before['data']['sources'])}): train from an earlier stage")


def finished_run(recipe: dict) -> bool:
    """Whether this recipe's run completed in its work_dir (a finished run of another recipe does not count)."""
    try:
        done = json.loads((Path(recipe["work_dir"]) / FINISHED).read_text())
    except (OSError, ValueError):
        return False
    return done.get("run_id", None) in (None, run_id(run_identity(recipe)))  # None: written before run ids
