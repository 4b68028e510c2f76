"""Rough edges of `eagle3-hub train`: a recipe that is not valid YAML, and data whose answers the target would not
write (nearly every position masked out of the loss)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from training_helpers import recipe_for, run_cli, write_recipe

from eagle3_hub.training.recipe import load_recipe, parse_overrides
from eagle3_hub.training.train import train


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("eagle3-hub train: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "text, where",
    [
        ("train:\n  lr: 0.1\n   max_steps: 3\n", r"line 3, column 13: mapping values are not allowed here"),
        ("train: {lr: [1, 2}\n", r"line 1, column 18: expected ',' or '\]', but got '\}'"),
    ],
)
def test_a_recipe_that_is_not_yaml_fails_in_one_line_naming_file_and_line(tmp_path, capsys, text, where):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not valid YAML at {where}\. Fix that line"):
        load_recipe(path)
    assert run_cli(path) == 2
    assert re.search(rf"recipe.yaml is not valid YAML at {where}", one_error_line(capsys.readouterr().err))


def test_a_recipe_of_the_wrong_shape_or_a_bad_override_fails_clearly(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- train\n- data\n")
    with pytest.raises(ValueError, match=r"list.yaml must hold sections of keys .* not a list"):
        load_recipe(path)
    path.write_text("train: 5\n")
    with pytest.raises(ValueError, match=r"`train` is a section of keys \(ttt_steps, .*\), got 5"):
        load_recipe(path)
    with pytest.raises(ValueError, match=r"the value of --train.betas is not valid YAML at line 1"):
        parse_overrides(["--train.betas", "[0.9, 0.95"])


def test_answers_the_target_would_not_write_stop_the_run_with_the_masked_share(tmp_path, tiny_target_dir, data_dir, capsys):
    """Foreign answers (regenerate: false) and a draft vocabulary chosen from them: the tiny target's next token is
    almost never among those tokens, so a run trained on nothing (loss 0.000 every step) before; now it stops at
    its first check, in one line that says why and the fix."""
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        data={"regenerate": False},
        train={"max_steps": 20, "save_every": 20, "eval_every": 20},
    )
    assert run_cli(write_recipe(tmp_path / "recipe.yaml", recipe)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert re.search(
        r"error: (99\.\d|100\.0)% of the positions to learn in the first 10 step\(s\) are masked out: the "
        r"target's next token there lies outside the draft vocabulary \(256 tokens\), so the draft learns "
        r"\(nearly\) nothing\. The data's answers are not the target's own: set data.regenerate: true",
        line,
    ), line
    assert not (Path(recipe["work_dir"]) / "checkpoints").exists() and not Path(recipe["output_dir"]).exists()


def test_the_masked_share_is_reported_and_a_high_one_is_warned_about(tmp_path, tiny_target_dir, data_dir, capsys):
    """A draft vocabulary of 8 tokens from the target's own answers: most positions are masked, the run warns once
    and goes on; the share is in the eval history and the final metrics. Its own answers, full vocabulary: no word."""
    small = recipe_for(
        tmp_path / "small",
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        draft={"draft_vocab_size": 8},
        train={"max_steps": 10, "save_every": 10, "eval_every": 5},
    )
    out = train(small)
    printed = capsys.readouterr().out
    share = json.loads((out / "training_metrics.json").read_text())["acceptance"]["masked_share"]
    assert 0.25 <= share < 0.99, share
    assert printed.count("[warn] ") == 1 and "of the positions to learn in the first 10 step(s) are masked out" in printed
    assert "raise draft.draft_vocab_size" in printed and "masked " in printed

    full = recipe_for(tmp_path / "full", tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"max_steps": 3})
    metrics = json.loads((train(full) / "training_metrics.json").read_text())
    # (held-out answers hold tokens the training answers never had: some positions are masked there)
    assert 0.0 <= metrics["acceptance"]["masked_share"] < share
    assert all("masked_share" in h for h in metrics["eval_history"])
    assert "[warn] " not in capsys.readouterr().out
