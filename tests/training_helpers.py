"""Recipes and data files for the training tests (the fixtures that use them are in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from datasets import Dataset

from eagle3_hub import cli
from eagle3_hub.training.recipe import load_recipe


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_data_files(d: Path) -> Path:
    """Local files in the shapes of the presets and the common chat formats, in folder ``d``."""
    write_jsonl(
        d / "sharegpt.jsonl",
        [  # ShareGPT: conversations with from/value (+ an id)
            {
                "id": f"s{i}",
                "conversations": [
                    {"from": "human", "value": f"What is {i} plus {i + 1}?"},
                    {"from": "gpt", "value": f"{i} plus {i + 1} is {2 * i + 1}."},
                ],
            }
            for i in range(40)
        ],
    )
    Dataset.from_list(
        [  # UltraChat-200k: prompt, prompt_id, messages (role/content)
            {
                "prompt": f"Name a colour number {i}.",
                "prompt_id": str(i),
                "messages": [
                    {"role": "user", "content": f"Name a colour number {i}."},
                    {"role": "assistant", "content": "Blue." if i % 2 else "Green, like grass."},
                    {"role": "user", "content": "Another one?"},
                    {"role": "assistant", "content": "Red."},
                ],
            }
            for i in range(12)
        ]
    ).to_parquet(str(d / "ultrachat.parquet"))
    (d / "prompts.json").write_text(json.dumps([{"prompt": f"Write a haiku about the number {i}."} for i in range(6)]))
    write_jsonl(d / "alpaca.jsonl", [{"instruction": "Translate to French.", "input": "cat", "output": "chat"}])
    return d


def recipe_for(tmp_path: Path, target_dir: Path, sources: list, **sections) -> dict:
    """A small recipe on the tiny target; `sections` override recipe sections key by key."""
    recipe = {
        "target": {"name": str(target_dir), "dtype": "float32"},
        "draft": {"draft_vocab_size": 256},
        # answers written by the target: the loss trains on its own tokens (foreign answers mask nearly every position)
        "data": {
            "sources": [str(s) if isinstance(s, Path) else s for s in sources],
            "regenerate": True,
            "max_new_tokens": 12,
            "max_length": 64,
            "eval_samples": 4,
        },
        "train": {
            "ttt_steps": 3,
            "max_steps": 6,
            "batch_size": 4,
            "warmup_steps": 2,
            "save_every": 3,
            "eval_every": 3,
            "log_every": 1,
            "num_threads": 1,
        },
        "work_dir": str(tmp_path / "work"),
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            recipe.setdefault(section, {}).update(values)
        else:
            recipe[section] = values
    return load_recipe(None, recipe)


def write_recipe(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_cli(config: Path, *overrides: str, resume: bool = False) -> int:
    """``eagle3-hub train --config CONFIG [--resume] [--section.key VALUE ...]`` in this process: its exit code
    (2 with one line on stderr for bad input)."""
    return cli.main(["train", "--config", str(config), *(["--resume"] if resume else []), *overrides])
