"""The command line as a user meets it: every subcommand given bad arguments, missing files and files that do not
parse stops with ONE line on stderr, ``eagle3-hub <cmd>: error: <message naming the value or file>``, and exit
code 2; no traceback (``--debug`` shows one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eagle3_hub import cli


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Hub look-ups fail at once; caches land in the test's folder."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, command: str, *needles: str):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"eagle3-hub {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _files(tmp_path):
    """Bad inputs on disk: a YAML file that does not parse, a JSON file that is not JSON, a folder that is no draft."""
    (tmp_path / "bad.yaml").write_text("train:\n  lr: [1, 2\n  steps: {\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"model_type": "eagle3"}))
    return {"tmp": str(tmp_path), "draft": str(draft)}


CASES = [
    # generate
    (["generate", "--prompt", "hi", "--max-new-tokens", "many"], ["'many'", "--max-new-tokens"]),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], ["--max-new-tokens", "0"]),
    (["generate", "--prompt", "hi", "--target", "{tmp}/no-such-target"], ["{tmp}/no-such-target", "does not exist"]),
    (["generate", "--prompt", "hi", "--draft", "{tmp}/no-such-draft"], ["{tmp}/no-such-draft", "does not exist"]),
    (["generate", "--prompt", "hi", "--device", "npu9"], ["'npu9'", "cpu"]),
    (["generate", "--prompt", "hi", "--dtype", "float64"], ["'float64'"]),
    (["generate"], ["--prompt"]),
    # convert
    (["convert", "{tmp}/no-such-draft", "{tmp}/out"], ["{tmp}/no-such-draft"]),
    (["convert", "{tmp}/empty", "{tmp}/out"], ["{tmp}/empty"]),
    (["convert", "{draft}", "{tmp}/out", "--to", "onnx"], ["'onnx'"]),
    # bench
    (["bench", "--methods", "plain,warp"], ["'warp'"]),
    (["bench", "--temperature", "hot"], ["'hot'", "--temperature"]),
    (["bench", "--max-new-tokens", "-3"], ["--max-new-tokens", "-3"]),
    (["bench", "--trees", "depth=three"], ["'three'"]),
    (["bench", "--methods", "plain", "--target", "{tmp}/no-such-target"], ["{tmp}/no-such-target"]),
    (["bench", "--methods", "plain", "--suite", "{tmp}/no-such-suite.jsonl"], ["{tmp}/no-such-suite.jsonl"]),
    (["bench", "--methods", "plain", "--assistant-model", "{tmp}/no-such-assistant"], ["{tmp}/no-such-assistant"]),
    # train
    (["train", "--config", "{tmp}/no-such-recipe.yaml"], ["{tmp}/no-such-recipe.yaml"]),
    (["train", "--config", "{tmp}/bad.yaml"], ["{tmp}/bad.yaml"]),
    # card
    (["card", "{tmp}/no-such-draft"], ["{tmp}/no-such-draft"]),
    (["card", "{draft}", "--bench", "{tmp}/bad.json"], ["{tmp}/bad.json", "not valid JSON"]),
    (["card", "{draft}", "--training-info", "{tmp}/no-such-info.json"], ["{tmp}/no-such-info.json"]),
    # push
    (["push", "{tmp}/no-such-draft", "me/x"], ["{tmp}/no-such-draft", "is not a folder"]),
    (["push", "{tmp}/empty", "me/x"], ["{tmp}/empty", "config.json"]),
    (["push", "{draft}"], ["repo_id"]),
    # demo
    (["demo", "--pairs", "{tmp}/no-such-pairs.yaml"], ["{tmp}/no-such-pairs.yaml", "not found"]),
    (["demo", "--pairs", "{tmp}/bad.yaml"], ["{tmp}/bad.yaml", "not valid YAML"]),
    (["demo", "--pair", "nope"], ["'nope'"]),
    (["demo", "--queue-size", "0"], ["--queue-size", "0"]),
    (["demo", "--dtype", "float8"], ["'float8'"]),
    (["demo", "--export-space", "{tmp}/space", "--wheel", "{tmp}/no-such.whl"], ["{tmp}/no-such.whl"]),
    (["demo", "--export-space", "{tmp}/space", "--pairs", "{tmp}/bad.yaml"], ["{tmp}/bad.yaml"]),
]


@pytest.mark.parametrize("argv, needles", CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_code_2(argv, needles, tmp_path, capsys):
    where = _files(tmp_path)
    argv = [a.format(**where) for a in argv]
    code, err = run_cli(capsys, argv)
    assert_one_line(code, err, argv[0], *(n.format(**where) for n in needles))


def test_unknown_command_is_one_line(capsys):
    code, err = run_cli(capsys, ["frobnicate"])
    assert code == 2 and err.strip().count("\n") == 0 and "'frobnicate'" in err


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no-such-draft"):
        cli.main(["--debug", "card", str(tmp_path / "no-such-draft")])
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(FileNotFoundError, match="no-such-draft"):
        cli.main(["card", str(tmp_path / "no-such-draft")])


def test_console_script_prints_no_traceback(tmp_path):
    """In a fresh process, as a user runs it: a recipe that is not YAML is one line and exit code 2."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("target: [unclosed\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "EAGLE3_HUB_CACHE": str(tmp_path / "cache")}
    env.pop(cli.DEBUG_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_hub.cli", "train", "--config", str(recipe)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("eagle3-hub train: error: ") and str(recipe) in lines[0], done.stderr


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


CASES_SLOWER = [  # these reach transformers (no download: offline)
    (["bench", "--methods", "plain", "--target", "owner/no-such-model"], ["'owner/no-such-model'"]),
]


@pytest.mark.parametrize("argv, needles", CASES_SLOWER)
def test_a_hub_id_that_cannot_load_is_named(argv, needles, capsys):
    code, err = run_cli(capsys, argv)
    assert_one_line(code, err, argv[0], *needles)


# ----------------------------------------------------------------------------------------- pickles
def _pickle_checkpoint(folder, marker):
    """A model folder whose weights are a pickle that, if unpickled, would write ``marker``."""
    import pickle

    from tiny_models import make_tiny_target

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    model = make_tiny_target("llama")
    model.config.save_pretrained(folder)
    from test_bench import make_tokenizer

    make_tokenizer().save_pretrained(folder)
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump(Payload(), f)
    return folder


def test_targets_and_assistants_stored_as_pickles_are_refused(tmp_path, capsys):
    from eagle3_hub.targets import load_target

    marker = tmp_path / "pwned"
    folder = _pickle_checkpoint(tmp_path / "model", marker)
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\).*safetensors.*allow_pickle=True"):
        load_target(str(folder))
    for flag in ("--target", "--assistant-model"):
        code, err = run_cli(capsys, ["bench", "--methods", "plain", flag, str(folder)])
        assert_one_line(code, err, "bench", str(folder), "pytorch_model.bin", "--allow-pickle")
    assert not marker.exists()


def test_allow_pickle_is_the_callers_word(tmp_path):
    """With ``allow_pickle=True`` a .bin target loads (through transformers' weights-only loader)."""
    import torch
    from test_bench import make_tokenizer
    from tiny_models import make_tiny_target

    from eagle3_hub.targets import load_target

    model = make_tiny_target("llama")
    folder = tmp_path / "model"
    model.config.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only pickled weights"):
        load_target(str(folder))
    loaded, _ = load_target(str(folder), allow_pickle=True)
    key = "model.embed_tokens.weight"
    assert torch.equal(loaded.state_dict()[key], model.state_dict()[key])


# ----------------------------------------------------------------------------------------- one place each
def test_device_and_dtype_have_one_place(monkeypatch):
    """targets' names are devices' own (re-exports, not copies), and every command's ``auto`` follows devices."""
    import torch

    from eagle3_hub import devices, targets

    assert targets.default_dtype is devices.default_dtype and targets.cpu_has_bf16_units is devices.cpu_has_bf16_units
    monkeypatch.setattr(devices, "cpu_has_bf16_units", lambda: True)
    assert targets.default_dtype("cpu") == torch.bfloat16
    assert devices.resolve_device_dtype("cpu", "auto") == (torch.device("cpu"), torch.bfloat16)
    monkeypatch.setattr(devices, "cpu_has_bf16_units", lambda: False)
    assert devices.resolve_device_dtype("cpu", "auto") == (torch.device("cpu"), torch.float32)
    assert devices.resolve_device_dtype("cpu", "bfloat16")[1] == torch.bfloat16
    import eagle3_hub.benchmark.bench as bench_lib
    import eagle3_hub.demo as demo

    for module in (bench_lib, demo):  # no private copies left
        assert not hasattr(module, "_resolve_device_dtype") and not hasattr(module, "_pick_device")


def test_reference_draft_has_one_place():
    from eagle3_hub import targets
    from eagle3_hub.demo import ModelPair, resolve_draft

    assert targets.reference_draft() == targets.REFERENCE_DRAFT_ROOT / targets.EMBEDDED_TARGET
    assert targets.reference_draft("owner/name").parent == targets.REFERENCE_DRAFT_ROOT  # never outside it
    assert targets.reference_draft("/abs/path/model").parent == targets.REFERENCE_DRAFT_ROOT
    if (targets.reference_draft() / "config.json").is_file():
        assert targets.default_draft(None) == str(targets.reference_draft())
        assert resolve_draft(ModelPair(name="p")) == str(targets.reference_draft())
    with pytest.raises(ValueError, match="needs an EAGLE-3 draft for owner/name.*--draft"):
        targets.default_draft("owner/name")
