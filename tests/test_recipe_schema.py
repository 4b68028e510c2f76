"""The recipe's schema (training/recipe_schema.py): one declaration of every key that checks recipes, stages and
flags, prints itself (`eagle3-hub train --show-recipe-schema`) and writes the key tables of docs/training.md."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_hub import cli
from eagle3_hub.training.recipe import DEFAULTS, RecipeLoader, load_recipe, load_stages, parse_overrides
from eagle3_hub.training.recipe_docs import update_docs
from eagle3_hub.training.recipe_schema import AnswerSetting, Recipe, Source, field_info, sections

ROOT = Path(__file__).parents[1]


def test_the_docs_key_tables_are_the_schemas():
    """Regenerate with: python -m eagle3_hub.training.recipe_docs docs/training.md"""
    text = (ROOT / "docs" / "training.md").read_text()
    assert update_docs(text) == text, (
        "docs/training.md's key tables differ from the schema: run python -m eagle3_hub.training.recipe_docs docs/training.md"
    )


def test_every_key_has_a_meaning_and_the_defaults_are_the_schemas():
    for name, section in [("", Recipe), *sections().items(), ("source", Source), ("setting", AnswerSetting)]:
        for key, info in section.model_fields.items():
            assert info.description and len(info.description) > 10, f"{name}.{key}"
    assert json.loads(Recipe().model_dump_json()) == DEFAULTS


def test_show_recipe_schema_prints_a_recipe_of_the_defaults_without_torch():
    code = (
        "import sys; from eagle3_hub import cli; rc = cli.main(['train', '--show-recipe-schema']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = done.stdout
    assert yaml.load(printed, Loader=RecipeLoader) == DEFAULTS
    for needle in (
        "# a positive number: peak learning rate (AdamW)",
        "  lr: 0.0005",
        "# - share (a positive number, default 1.0)",
        "# one of online, offline: `online`",
    ):
        assert needle in printed, needle


@pytest.mark.parametrize(
    "text, says",
    [
        # the gap the schema closes: every number is finite, in every section and in every list entry
        (
            "data:\n  answer_sampling: [{temperature: .inf}]\n",
            "data.answer_sampling[0].temperature must be a non-negative number (default 0.0), got Infinity",
        ),
        (
            "data:\n  answer_sampling: [{temperature: 1, share: .nan}]\n",
            "data.answer_sampling[0].share must be a positive number (default 1.0), got NaN",
        ),
        ("train:\n  loss: {kl: .inf}\n", "train.loss must be an objective name"),
        ("lora:\n  alpha: .inf\n", "lora.alpha must be a positive number (default 32), got Infinity"),
        ("train:\n  betas: [0.9, .nan]\n", "train.betas must be a list of two numbers in [0, 1)"),
        ("data:\n  max_repeat_share: .nan\n", "data.max_repeat_share must be a number in (0, 1]"),
        # values that reached the run before: a choice, a dtype, a source's options
        ("target:\n  dtype: f32\n", "target.dtype must be one of auto, float32, fp32, bfloat16, bf16, float16, fp16"),
        ("train:\n  mixed_precision: bf17\n", "train.mixed_precision must be one of auto, no, bf16, fp16"),
        (
            "data:\n  sources: [a.jsonl, {path: docs, max_chars: 100}]\n",
            "data.sources[1]: max_chars belong to documents: add `kind: text`",
        ),
        ("data:\n  sources: [{path: docs, kind: text, suffixes: [py]}]\n", "data.sources[0]: suffixes must list the endings"),
        ("data:\n  sources: [{kind: text}]\n", "data.sources must be a list of sources"),
        (
            "data:\n  answer_sampling: [{temperature: 1, topp: 0.9}]\n",
            "data.answer_sampling[0] has no key `topp` (did you mean `top_p`?): its keys are temperature, top_p, share",
        ),
        ("draft:\n  init_from: d\n  layer_from_target: -1\n", "layer_from_target initialises a new draft"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_key(tmp_path, capsys, text, says):
    config = tmp_path / "r.yaml"
    config.write_text(f"work_dir: {tmp_path / 'w'}\n" + text)
    with pytest.raises(ValueError) as e:
        load_recipe(config)
    assert str(e.value).startswith(f"{config}: ") and says in str(e.value), str(e.value)
    assert cli.main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_an_unknown_key_names_the_nearest_known_one():
    with pytest.raises(
        KeyError,
        match=r"Unknown recipe key `train.warmup_step` \(did you mean `train.warmup_steps`\?\)"
        r"\. Known keys: train.ttt_steps, ",
    ):
        load_recipe(None, parse_overrides(["--train.warmup_step", "5"]))
    with pytest.raises(KeyError, match=r"Unknown recipe key `data.sorces` \(did you mean `data.sources`\?\)"):
        load_recipe(None, {"data": {"sorces": []}})


def test_flags_are_read_as_the_schema_says(tmp_path):
    # a key that holds text takes the text as given: a chat template is no YAML (it failed to parse as a mapping)
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    flags = [
        "--target.chat_template",
        template,
        "--target.name",
        "null",
        "--push_to_hub",
        "2024/draft",
        "--train.lr",
        "3e-4",
        "--lora.enabled",
    ]
    assert parse_overrides(flags) == {
        "target": {"chat_template": template, "name": None},
        "push_to_hub": "2024/draft",
        "train": {"lr": 3e-4},
        "lora": {"enabled": True},
    }
    assert load_recipe(None, parse_overrides(flags))["target"]["chat_template"] == template
    with pytest.raises(ValueError, match=r"--train.lr needs a value"):  # only a true/false key stands alone
        parse_overrides(["--train.lr", "--lora.enabled"])
    with pytest.raises(ValueError, match=r"train.lr must be a positive number \(default 0.0005\), got --train.lr=Infinity"):
        load_recipe(None, parse_overrides(["--train.lr", ".inf"]))
    assert field_info("train.lr") is not None and field_info("train.nothing") is None


def test_every_shipped_and_benchmark_recipe_loads_with_its_stages(monkeypatch):
    monkeypatch.chdir(ROOT)  # recipe paths are from the repository root
    recipes = sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "benchmarks").rglob("recipe.yaml"))
    assert len(recipes) >= 8
    for path in recipes:
        chain = load_stages(load_recipe(path))
        assert chain and all(set(stage) == set(DEFAULTS) for stage in chain), path


@pytest.mark.parametrize("added", ["more.jsonl", [{"kind": "text"}], [{"path": "a.txt", "max_chars": 0, "kind": "text"}]])
def test_a_stages_added_sources_are_checked_by_the_sources_schema(added):
    """`data.add_sources` of a later stage takes what `data.sources` takes, refused in one line naming the stage."""
    recipe = copy.deepcopy(DEFAULTS)
    recipe["data"]["sources"] = ["chats.jsonl"]
    recipe["stages"] = [{"data": {"add_sources": added}}]
    with pytest.raises(ValueError) as e:
        load_stages(recipe)
    line = str(e.value)
    assert line.startswith("stage 2: data.add_sources") and "\n" not in line
