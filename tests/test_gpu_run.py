"""recipes/gpu_run.py, the one-command GPU run, on the CPU with every size shrunk (--tiny) and a tiny random target."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.training.train import check_recipe

SCRIPT = Path(__file__).resolve().parents[1] / "recipes" / "gpu_run.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_gpu_run_writes_a_trained_draft_in_16mib_files_and_its_bench(tmp_path, tiny_target_dir, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    gpu_run = load_script()
    monkeypatch.setattr(gpu_run, "SHARD_BYTES", int(1.1 * 2**20))  # the tiny draft (~1.3 MiB) in two files
    out = tmp_path / "run"
    args = ["--out", str(out), "--tiny", "--target", str(tiny_target_dir), "--init-from", "none", "--device", "cpu"]
    assert gpu_run.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 3 and results["tokens_trained"] > 0 and results["throughput"]["peak_share"] > 0
    cells = {(r["method"], r["mode"], r["batch"]) for r in results["bench"]}
    for method in ("plain", "same_forward", "tree"):
        for batch in (1, 2):
            assert {m for (x, m, b) in cells if x == method and b == batch} >= {"greedy", "T=0.7", "T=1"}, cells
    # the small files hold the draft's weights, exactly, and load as the draft
    assert len(results["weights"]) == 2 and all(f["bytes"] <= 1.1 * 2**20 for f in results["weights"])
    whole = load_file(str(out / "draft" / "model.safetensors"))
    parts = {}
    for f in results["weights"]:
        parts.update(load_file(str(out / "draft-16mib" / f["file"])))
    assert parts.keys() == whole.keys() and all(torch.equal(parts[k], whole[k]) for k in whole)
    loaded = Eagle3DraftModel.from_pretrained(out / "draft-16mib").state_dict()
    assert all(torch.equal(loaded[k], whole[k]) for k in whole)
    # a rerun finds every phase done and writes the same results
    assert gpu_run.main(args) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["bench"] == results["bench"] and "train" not in again["seconds_this_call"]


def test_the_full_size_recipe_is_valid_and_trains_at_least_50x_the_last_stages_tokens(tmp_path):
    gpu_run = load_script()
    steps = gpu_run.steps_for(gpu_run.FULL)
    assert steps * gpu_run.FULL["batch_size"] * gpu_run.FULL["pack_tokens"] * 0.97 >= 50 * 400 * 4 * 384
    recipe = gpu_run.recipe_for(gpu_run.FULL, None, "reference-draft-folder", tmp_path, steps, "cuda")
    check_recipe(recipe)  # what train() checks before it loads anything
    assert recipe["train"]["packing"] and recipe["target"]["dtype"] == "bfloat16"
    assert recipe["draft"]["layer_from_target"] is None  # a continued draft keeps its own weights
    scratch = gpu_run.recipe_for(gpu_run.FULL, None, None, tmp_path, steps, "cuda")
    check_recipe(scratch)
    assert scratch["draft"]["head_from_target"] and scratch["draft"]["layer_from_target"] == -1
    more = gpu_run.recipe_for(gpu_run.FULL, None, None, tmp_path, steps, "cuda", answers=3)
    check_recipe(more)  # several answers of a prompt: every one sampled
    assert more["data"]["answers_per_prompt"] == 3 and all(st["temperature"] > 0 for st in more["data"]["answer_sampling"])
    assert recipe["data"]["answers_per_prompt"] == 1 and recipe["data"]["answer_sampling"][0]["temperature"] == 0
