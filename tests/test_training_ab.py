"""The A/B harness: every arm trains from the same init on the same data and held-out split, seed by seed; the
report has each arm's mean and run-to-run spread; a rerun resumes (finished runs are read back, not retrained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from training_helpers import recipe_for, write_recipe

from eagle3_hub.training.ab import base_recipe, bench_commands, parse_arm, plan_runs, run_all, summarize, write_report
from eagle3_hub.training.ab.__main__ import main as ab_main
from eagle3_hub.training.train import train


def test_arms_train_from_the_same_init_on_the_same_data_and_the_report_has_mean_and_spread(
    tmp_path, tiny_target_dir, data_dir, capsys
):
    base = recipe_for(
        tmp_path / "base",
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        features={"mode": "offline"},
        train={"max_steps": 3, "lr": 5e-3},
    )
    init = train(base)  # the draft every arm continues
    out = tmp_path / "ab"
    arms = [parse_arm("kl"), parse_arm("mix={train: {loss: {kl: 0.5, lk_log: 0.5}}}")]
    runs = plan_runs(base, arms, [0, 1], steps=3, out=out)
    assert [(r["arm"], r["seed"]) for r in runs] == [("kl", 0), ("kl", 1), ("mix", 0), ("mix", 1)]
    assert all(r["recipe"]["draft"]["init_from"] == str(init) and r["recipe"]["data"]["seed"] == 0 for r in runs)
    assert runs[2]["recipe"]["train"]["loss"] == {"kl": 0.5, "lk_log": 0.5} and runs[1]["recipe"]["train"]["seed"] == 1
    results = run_all(runs, out)

    # one tokenised copy of the data and one feature cache for every run: the same held-out split
    assert all((Path(r["recipe"]["work_dir"]) / "data").is_symlink() for r in runs)
    assert len(list((out / "shared" / "features").glob("split1-*.safetensors"))) == 1
    # the same draft scored on the same samples (its loss is each arm's objective)
    inits = {json.dumps({k: v for k, v in r["init"].items() if k != "loss"}, sort_keys=True) for r in results}
    assert len(inits) == 1 and results[0]["init"]["step"] == 0
    finals = [r["final"] for r in results]
    assert all(f["step"] == 3 for f in finals) and finals[0] != finals[1]  # seeds change the batches

    summary = summarize(results)
    kl, mix = summary["arms"]["kl"], summary["arms"]["mix"]
    values = [f["expected_acceptance_length_sampled"] for f in finals[:2]]
    assert kl["sampled_length"]["values"] == values
    assert kl["sampled_length"]["mean"] == pytest.approx(sum(values) / 2)
    assert kl["sampled_length"]["spread"] == pytest.approx(abs(values[0] - values[1]) / 2)
    assert len(kl["sampled_acceptance"]) == 3 and kl["delta"]["greedy_length"]["mean"] == 0
    assert mix["delta"]["sampled_length"]["mean"] == pytest.approx(mix["sampled_length"]["mean"] - kl["sampled_length"]["mean"])
    commands = bench_commands(results, out, questions=10)
    assert len(commands) == 8 and commands[0].startswith(f"eagle3-hub bench --draft {results[0]['draft']} --max-turns 1")
    assert "--temperature 0.7,1 --seed 0" in commands[1] and "--dtype float32 --temperature 0 " in commands[0]
    json_path, md_path = write_report(summary, results, out, commands)
    md = md_path.read_text()
    assert "| (init, step 0) |" in md and "| mix | 0,1 |" in md and "Δ T=1 vs kl" in md
    assert json.loads(json_path.read_text())["summary"]["arms"]["mix"]["seeds"] == [0, 1]

    # rerun: every run finished, nothing is trained again
    before = [(Path(r["draft"]) / "model.safetensors").stat().st_mtime_ns for r in results]
    capsys.readouterr()
    assert run_all(runs, out) == results
    assert capsys.readouterr().out.count("finished earlier") == 4
    assert before == [(Path(r["draft"]) / "model.safetensors").stat().st_mtime_ns for r in results]


def test_the_command_line_runs_the_comparison_and_refuses_bad_arms(tmp_path, tiny_target_dir, data_dir, capsys):
    base = recipe_for(tmp_path / "base", tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"max_steps": 2})
    train(base)
    config = write_recipe(tmp_path / "recipe.yaml", base)
    out = tmp_path / "ab"
    argv = [
        "--recipe",
        str(config),
        "--arm",
        "kl",
        "--arm",
        "lk_hybrid",
        "--seeds",
        "0",
        "--steps",
        "2",
        "--out",
        str(out),
        "--max-samples",
        "20",
        "--train.lk_eta",
        "2",
    ]
    assert ab_main(argv) == 0
    printed = capsys.readouterr().out
    assert "| lk_hybrid | 0 |" in printed and (out / "ab.md").exists()
    runs = json.loads((out / "ab.json").read_text())["runs"]
    assert [r["arm"] for r in runs] == ["kl", "lk_hybrid"]
    metrics = json.loads((Path(runs[1]["draft"]) / "training_metrics.json").read_text())
    assert metrics["recipe"]["train"]["lk_eta"] == 2 and metrics["data"]["samples"] == 20
    assert ab_main(["--recipe", str(config), "--arm", "ce", "--steps", "2", "--out", str(out)]) == 2
    assert "--arm 'ce': give a loss name (kl, lk, lk_log, lk_hybrid) or NAME=YAML" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--stage 3"):
        base_recipe(str(config), stage=3)
