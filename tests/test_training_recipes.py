"""The shipped recipes: each loads and passes the checks, the reference recipe's stages are changes inside the one
file and its last stage is the shipped draft's training; stages given as changes continue the draft before them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from training_helpers import recipe_for, run_cli, write_recipe

from eagle3_hub.training.presets import PRESETS
from eagle3_hub.training.recipe import load_recipe, load_stages
from eagle3_hub.training.train import check_recipe

ROOT = Path(__file__).parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_loads_passes_the_checks_and_finds_its_data(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipe paths are from the repository root
    chain = load_stages(load_recipe(path))
    for stage in chain:
        check_recipe(stage)
        for src in stage["data"]["sources"]:
            p = src if isinstance(src, str) else src["path"]
            assert p in PRESETS or "/" in p and not p.startswith(("recipes/", "./", "../")) or Path(p).is_file(), p
    assert len({r["work_dir"] for r in chain}) == len(chain)


def test_the_reference_recipe_holds_every_stage_and_its_last_is_the_shipped_drafts_training(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert not list((ROOT / "recipes").glob("smollm2-135m-instruct-*.yaml"))  # one recipe per target
    chain = load_stages(load_recipe("recipes/smollm2-135m-instruct.yaml"))
    assert len(chain) == 12
    shipped = json.loads((ROOT / "eagle3_hub/reference_draft/smollm2-135m-instruct/training_metrics.json").read_text())
    last, trained = chain[-1], shipped["recipe"]
    assert last["output_dir"] == "eagle3_hub/reference_draft/smollm2-135m-instruct"
    assert all(r["draft"]["init_from"] == before["output_dir"] for before, r in zip(chain, chain[1:]))
    for key in ("ttt_steps", "max_steps", "batch_size", "lr", "warmup_steps", "grad_clip", "step_weight", "seed"):
        assert last["train"][key] == trained["train"][key], key
    for key in ("draft_vocab_size", "reselect_vocab"):
        assert last["draft"][key] == trained["draft"][key], key
    assert last["target"]["dtype"] == trained["target"]["dtype"]
    names = [(Path(s["path"]).name, s.get("eval", True)) for s in last["data"]["sources"]]
    assert names == [(Path(s["path"]).name, s.get("eval", True)) for s in trained["data"]["sources"]]
    assert all((ROOT / s["path"]).is_file() for s in last["data"]["sources"])  # the data is in the repository


def test_stages_given_as_changes_continue_the_draft_before_them(tmp_path, tiny_target_dir, data_dir, capsys):
    short = {"max_steps": 2, "eval_every": 2, "save_every": 2}
    first = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train=short)
    first["stages"] = [{"data": {"add_sources": [str(data_dir / "ultrachat.parquet")]}, "train": {"max_steps": 3}}]
    config = write_recipe(tmp_path / "one.yaml", first)
    chain = load_stages(load_recipe(config))
    second = chain[1]
    assert second["work_dir"] == first["work_dir"] + "-stage2" and second["draft"]["init_from"] == first["output_dir"]
    assert second["data"]["sources"] == [
        {"path": str(data_dir / "sharegpt.jsonl"), "eval": False},
        str(data_dir / "ultrachat.parquet"),
    ]
    assert second["train"]["max_steps"] == 3 and second["train"]["eval_every"] == 2  # the rest carried over
    assert run_cli(config, "--train.lr", "0.002") == 0  # an override reaches every stage
    assert "[stages] stage 2/2: " in capsys.readouterr().out
    metrics = json.loads((Path(second["output_dir"]) / "training_metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["recipe"]["train"]["lr"] == 0.002
    assert metrics["data"]["eval_candidates"] == 12  # held out only from the stage's new data
    (lineage,) = metrics["earlier_stages"]
    assert lineage["steps"] == 2
    with pytest.raises(KeyError, match=r"stage 2: Unknown recipe key `train.learning_rate`"):
        load_stages(load_recipe(config, {"stages": [{"train": {"learning_rate": 1}}]}))


def test_from_stage_continues_the_draft_the_stage_before_wrote_and_nothing_else(tmp_path, tiny_target_dir, data_dir, capsys):
    short = {"max_steps": 2, "eval_every": 2, "save_every": 2}
    first = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train=short)
    first["stages"] = [{"data": {"add_sources": [str(data_dir / "ultrachat.parquet")]}, "train": {"max_steps": 3}}]
    config = write_recipe(tmp_path / "one.yaml", first)
    assert run_cli(config, "--from-stage", "2") == 2  # no draft of stage 1 yet
    assert "holds no draft: train the earlier stages first" in capsys.readouterr().err
    assert run_cli(config, "--stages", "[]") == 0  # stage 1 alone: its draft is what stage 2 continues
    capsys.readouterr()
    assert run_cli(config, "--from-stage", "2") == 0
    out = capsys.readouterr().out
    assert "[stages] stage 2/2: " in out and "stage 1/2" not in out
    metrics = json.loads((Path(first["output_dir"]) / "training_metrics.json").read_text())
    assert metrics["steps"] == 3 and len(metrics["earlier_stages"]) == 1
    # output_dir now holds stage 2's draft: starting stage 2 again would train it twice
    assert run_cli(config, "--from-stage", "2", "--overwrite") == 2
    assert "is not the one stage 1 writes" in capsys.readouterr().err
    assert run_cli(config, "--from-stage", "3") == 2
    assert "the recipe has stages 1 to 2" in capsys.readouterr().err


def test_recipe_values_are_yaml_1_2_so_no_is_a_string_and_exponents_are_numbers():
    from eagle3_hub.training.recipe import parse_overrides

    assert parse_overrides(["--train.mixed_precision", "no", "--train.lr", "3e-4", "--data.regenerate", "false"]) == {
        "train": {"mixed_precision": "no", "lr": 3e-4},
        "data": {"regenerate": False},
    }
    recipe = load_recipe(None, {"train": {"mixed_precision": "no"}})
    assert recipe["train"]["mixed_precision"] == "no"


def test_data_only_prepares_every_stages_data_and_trains_nothing(tmp_path, tiny_target_dir, data_dir, capsys):
    first = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"])
    first["stages"] = [{"data": {"add_sources": [str(data_dir / "ultrachat.parquet")]}}]
    config = write_recipe(tmp_path / "one.yaml", first)
    assert run_cli(config, "--data-only") == 0  # stage 2's data too, though stage 1 wrote no draft yet
    assert "train and 4 held-out samples in" in capsys.readouterr().out
    for work in (Path(first["work_dir"]), Path(first["work_dir"] + "-stage2")):
        assert (work / "data" / "tokenized" / "dataset_dict.json").is_file()
        assert json.loads((work / "data" / "generation_report.json").read_text())
        assert not (work / "checkpoints").exists()
    assert not (Path(first["output_dir"]) / "config.json").exists()
