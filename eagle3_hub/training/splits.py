"""The tokenised train and held-out splits of a recipe's data, built once in work_dir/data (with ``data_report.json``)
and reused while the data settings, the seed and the target stay the same."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..extras import missing_extra

try:
    from datasets import Dataset, DatasetDict, load_from_disk
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from ..atomic import atomic_copy, atomic_dir, atomic_write_json
from .data import GENERATION_REPORT, build_conversations
from .recipe_schema import without_later_defaults
from .sources import DataError
from .tokenise import SPLIT_COLUMNS, tokenize_dataset


def take_generations(runs: list, work: Path) -> list[str]:
    """Copy into ``work`` (this run's data folder) the target's generations that the earlier runs of
    ``features.reuse_from`` wrote and this one has not: a cache's name is the hash of its prompts, target and
    sampling settings, so a later stage over the same data reads them instead of generating again (a resumable
    cache, partial or whole). Returns the names copied."""
    taken = []
    for run in runs:
        for cache in sorted((Path(run) / "data").glob("*.jsonl")):
            if not (work / cache.name).exists():
                work.mkdir(parents=True, exist_ok=True)
                atomic_copy(cache, work / cache.name)
                taken.append(cache.name)
    if taken:
        print(f"[data] generations taken from features.reuse_from: {', '.join(taken)}")
    return taken


def data_key(recipe: dict, tokenizer) -> dict:
    """What the tokenised data depends on: a different key rebuilds it (the `datasets` cache keeps reruns cheap)."""
    target = {k: v for k, v in recipe["target"].items() if k != "dtype"}
    data = {
        k: v
        for k, v in without_later_defaults(recipe)["data"].items()
        if not (k == "seed" and v is None) and k not in ("regenerate_with", "regenerate_draft")
    }
    return {"data": data, "seed": data_seed(recipe), "target": target, "tokenizer": getattr(tokenizer, "name_or_path", None)}


def held_out_split(tok: Dataset, eval_samples: int, seed: int) -> DatasetDict:
    """Train/held-out split: ``eval_samples`` (at most a tenth of the data, at least one), drawn from the samples
    whose ``eval_ok`` is true only (the others come from `eval: false` sources, which an earlier stage trained on).
    Where a ``prompt`` column groups the samples (``data.answers_per_prompt``, or a sampled answer beside a kept
    one), a held-out prompt's other samples are left out of training: the draft must not learn the held-out text."""
    n_eval = min(eval_samples, max(1, len(tok) // 10))
    flags = tok["eval_ok"] if "eval_ok" in tok.column_names else [True] * len(tok)
    eligible = [i for i, ok in enumerate(flags) if ok]
    if not eligible:
        raise DataError(
            "Every data source is marked `eval: false`: leave at least one source (or `data.synthesize`) "
            "without it, so that the held-out split has samples no stage trained on."
        )
    if len(eligible) == len(tok):
        split = tok.train_test_split(test_size=n_eval, seed=seed)
    else:
        held = set(random.Random(seed).sample(eligible, min(n_eval, len(eligible))))
        split = DatasetDict(train=tok.select([i for i in range(len(tok)) if i not in held]), test=tok.select(sorted(held)))
    if "prompt" in tok.column_names:
        held_prompts = set(split["test"]["prompt"])
        train = split["train"].filter(lambda p: p not in held_prompts, input_columns="prompt", desc="held-out prompts")
        if len(train) < len(split["train"]):
            print(f"[data] {len(split['train']) - len(train)} other answers of held-out prompts left out of training")
        split["train"] = train
    return split.remove_columns([c for c in SPLIT_COLUMNS if c in tok.column_names])


def data_seed(recipe: dict) -> int:
    """The seed of the data's order and held-out split: ``data.seed``, else ``train.seed``."""
    return recipe["train"]["seed"] if recipe["data"]["seed"] is None else recipe["data"]["seed"]


def prepare_data(recipe: dict, target, tokenizer, accelerator):
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
        take_generations(recipe["features"].get("reuse_from") or [], work)
        convs = build_conversations(
            d["sources"],
            target,
            tokenizer,
            work,
            seed=data_seed(recipe),
            synthesize=d["synthesize"],
            regenerate_responses=d["regenerate"],
            max_new_tokens=d["max_new_tokens"],
            temperature=d["temperature"],
            batch_size=d["gen_batch_size"],
            max_turns=d["max_turns"],
            strip_patterns=d["strip_patterns"],
            synthesize_seed=d["synthesize_seed"],
            synthesize_openers=d["synthesize_openers"],
            synthesize_batch_size=d["synthesize_batch_size"],
            regenerate_with=d["regenerate_with"],
            regenerate_draft=d["regenerate_draft"],
            target_name=recipe["target"]["name"],
            answer_sampling=d["answer_sampling"],
            max_repeat_share=d["max_repeat_share"],
            answers_per_prompt=d["answers_per_prompt"],
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
