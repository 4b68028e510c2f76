"""The learning curve's pieces that need no training: a draft's chain of stages, the log fit, the command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from training_helpers import recipe_for

from eagle3_hub.commands import learning_curve
from eagle3_hub.training.curve import chain_points, log_fit
from eagle3_hub.training.train import train

SHIPPED = "eagle3_hub/reference_draft/smollm2-135m-instruct"


def test_the_shipped_draft_gives_its_chain_of_stages_in_order():
    metrics = json.loads(Path(SHIPPED, "training_metrics.json").read_text())
    earlier, last = metrics["earlier_stages"], metrics["eval_history"]
    points = chain_points(SHIPPED, tokens_per_step=1000)
    assert len(points) == len(earlier) + len(last)
    assert [p["greedy"] for p in points[: len(earlier)]] == [s["expected_acceptance_length"] for s in earlier]
    assert points[0]["tokens"] == earlier[0]["steps"] * 1000
    steps = sum(s["steps"] for s in earlier) + last[-1]["step"]
    assert points[-1]["tokens"] == steps * 1000 and points[-1]["step1_accuracy"] == last[-1]["step_accuracy"][0]
    assert [p["tokens"] for p in points] == sorted(p["tokens"] for p in points)


def test_the_log_fit_recovers_a_line_in_log_tokens():
    points = [{"tokens": 10**k, "greedy": 1.2 + 0.3 * k} for k in range(1, 7)]
    a, b = log_fit(points, "greedy")
    assert a == pytest.approx(1.2) and b == pytest.approx(0.3)
    with pytest.raises(ValueError, match="at least two points"):
        log_fit(points[:1], "greedy")


def test_the_command_draws_a_run_beside_a_chain_and_extrapolates(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    history = [
        {
            "step": s,
            "tokens": 1100 * s,
            "step_accuracy": [0.1 * math.log10(s)],
            "expected_acceptance_length": 1 + 0.2 * math.log10(1100 * s),
            "expected_acceptance_length_at": {"0.7": 1.1},
            "expected_acceptance_length_sampled": 1.05,
        }
        for s in (10, 20, 40, 80)
    ]
    (run / "eval_metrics.json").write_text(json.dumps({"eval_history": history}))
    out = tmp_path / "curve.png"
    assert learning_curve.main([str(run), "--chain", SHIPPED, "--fit", "1.1e7", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert out.stat().st_size > 0 and result["chain_tokens_per_step"] == 1100
    assert len(result["chains"]["smollm2-135m-instruct"]) > 10
    assert result["fit"]["greedy"]["value"] == pytest.approx(1 + 0.2 * math.log10(1.1e7)) and result["fit"]["greedy"][
        "per_tenfold"
    ] == pytest.approx(0.2)


def test_a_chain_without_tokens_to_go_by_is_one_clear_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval_metrics.json").write_text(
        json.dumps({"eval_history": [{"step": 0, "tokens": 0, "step_accuracy": [0.5], "expected_acceptance_length": 2.0}]})
    )
    assert learning_curve.main([str(run), "--chain", SHIPPED, "--out", str(tmp_path / "c.png")]) == 2
    assert "--tokens-per-step" in capsys.readouterr().err


def test_arms_are_drawn_side_by_side_and_tabled_at_their_common_steps(tmp_path, capsys):
    runs = []
    for name, gain, steps in (("a", 0.1, (10, 20, 40)), ("b", 0.2, (10, 40, 80))):
        run = tmp_path / name
        run.mkdir()
        history = [
            {
                "step": s,
                "tokens": 1000 * s,
                "step_accuracy": [gain * math.log10(s)],
                "expected_acceptance_length": 1 + gain * math.log10(s),
                "expected_acceptance_length_sampled": 1 + gain,
            }
            for s in steps
        ]
        (run / "eval_metrics.json").write_text(json.dumps({"eval_history": history}))
        runs.append(run)
    out = tmp_path / "arms.png"
    assert learning_curve.main([str(runs[0]), "--label", "plain", "--arm", f"wider={runs[1]}", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| step | plain | wider |" in table and "| 40 | 0.160 / 1.160 / 1.100 | 0.320 / 1.320 / 1.200 |" in table
    assert "| 20 |" not in table and "| 80 |" not in table  # only the steps both were evaluated at
    assert out.stat().st_size > 0 and list(json.loads(out.with_suffix(".json").read_text())["arms"]) == ["plain", "wider"]
    assert learning_curve.main([str(runs[0]), "--arm", str(runs[1])]) == 2
    assert "write LABEL=RUN" in capsys.readouterr().err


def test_eval_steps_add_evaluations_between_the_regular_ones(tmp_path, tiny_target_dir, data_dir, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    recipe = recipe_for(
        tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"max_steps": 5, "eval_every": 4, "eval_steps": [1, 2]}
    )
    train(recipe)
    history = json.loads(Path(recipe["work_dir"], "eval_metrics.json").read_text())["eval_history"]
    assert [h["step"] for h in history] == [1, 2, 4, 5]
    assert [h["tokens"] for h in history] == sorted({h["tokens"] for h in history})
