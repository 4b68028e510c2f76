"""A training run resumes only its own checkpoints, and a checkpoint is replaced atomically.

Two runs sharing a work_dir, a fresh run over an older run's checkpoints, a kill at every filesystem step of a
checkpoint save (then a resume), and a resume that continues from the run's own last whole checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from training_helpers import recipe_for, run_cli, write_recipe

from eagle3_hub.training import checkpoints
from eagle3_hub.training.checkpoints import STATE_FILE, latest_checkpoint, read_state, recover, run_id, run_identity
from eagle3_hub.training.train import train

SHORT = {"max_steps": 6, "save_every": 3, "eval_every": 3, "keep_checkpoints": 2}


def ckpt_runs(work: Path) -> dict[str, str]:
    """{step-N: run id} of the whole checkpoints in work_dir."""
    return {p.name: s.get("run_id") for p, s in checkpoints.whole_checkpoints(Path(work) / "checkpoints")}


def weights(folder: Path) -> dict:
    return load_file(Path(folder) / "model.safetensors")


def test_run_identity_ignores_bookkeeping_but_not_what_the_run_computes(tmp_path, tiny_target_dir, data_dir):
    base = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"])
    same = recipe_for(
        tmp_path / "elsewhere",
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        train={"save_every": 1, "log_every": 7, "num_threads": 2, "keep_checkpoints": 5},
        output_dir=str(tmp_path / "out"),
    )
    assert run_id(run_identity(base)) == run_id(run_identity(same))
    for change in (
        {"train": {"lr": 1e-3}},
        {"train": {"seed": 1}},
        {"data": {"max_length": 32}},
        {"draft": {"draft_vocab_size": 128}},
        {"target": {"dtype": "bfloat16"}},
    ):
        other = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], **change)
        assert run_id(run_identity(other)) != run_id(run_identity(base)), change


def test_a_run_recorded_before_a_later_key_keeps_its_id_and_its_data_key(tmp_path, tiny_target_dir, data_dir):
    """The defect: a run started before `data.answers_per_prompt` existed was refused on --resume (its recipe
    differs: data.answers_per_prompt null -> 1), though the key at its default changes nothing."""
    from eagle3_hub.training.recipe_schema import LATER_KEYS
    from eagle3_hub.training.splits import data_key

    now = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"])
    before = {**now, "data": {k: v for k, v in now["data"].items() if k not in LATER_KEYS["data"]}}
    assert run_id(run_identity(before)) == run_id(run_identity(now))
    assert data_key(before, None) == data_key(now, None)
    more = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], data={"answers_per_prompt": 2, "temperature": 1})
    hotter = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], data={"temperature": 1})
    assert run_id(run_identity(more)) != run_id(run_identity(hotter)) and data_key(more, None) != data_key(hotter, None)


def test_a_fresh_run_over_another_runs_checkpoints_refuses_and_overwrite_moves_that_run_aside(
    tmp_path, tiny_target_dir, data_dir, capsys
):
    """The defect: a fresh run left the old run's checkpoints in place, pruning deleted its own, and a resume
    loaded the old run's weights as the new draft."""
    regen = {"regenerate": True, "max_new_tokens": 12}  # the target's own tokens: the weights move
    a = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], data=regen, train=SHORT)
    b = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], data=regen, train={**SHORT, "lr": 2e-3})
    work = Path(a["work_dir"])
    train(a)
    a_id, b_id = run_id(run_identity(a)), run_id(run_identity(b))
    assert ckpt_runs(work) == {"step-3": a_id, "step-6": a_id}
    a_draft = weights(a["output_dir"])

    # a fresh run of another recipe: one line naming the work_dir, the differing key and the ways out; nothing moved
    assert run_cli(write_recipe(tmp_path / "b.yaml", b)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("eagle3-hub train: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(
        rf"{re.escape(str(work))} holds checkpoints of another run \(its recipe differs: "
        r"train\.lr 0\.0005 -> 0\.002\), up to step 6: pass --overwrite to move that run aside to "
        rf"{re.escape(str(work))}/previous-<time>, or give another work_dir",
        lines[0],
    ), lines[0]
    assert ckpt_runs(work) == {"step-3": a_id, "step-6": a_id}
    # the same recipe again, fresh: its own checkpoints are not silently mixed with a new run's either
    with pytest.raises(ValueError, match=r"already holds checkpoints of this recipe \(up to step 6\): pass --resume"):
        train(a)
    # --resume and --overwrite contradict each other
    with pytest.raises(ValueError, match="pass one of them"):
        train(b, resume=True, overwrite=True)

    train(b, overwrite=True)
    (previous,) = work.glob("previous-*")
    assert ckpt_runs(previous) == {"step-3": a_id, "step-6": a_id}  # the older run, whole, out of the way
    assert json.loads((previous / "run.json").read_text())["run_id"] == a_id
    assert json.loads((previous / "finished.json").read_text())["run_id"] == a_id
    assert ckpt_runs(work) == {"step-3": b_id, "step-6": b_id}
    assert json.loads((work / "run.json").read_text())["run_id"] == b_id
    b_draft = weights(b["output_dir"])
    assert not torch.equal(a_draft["fc.weight"], b_draft["fc.weight"])

    # resuming the older recipe in this work_dir is refused: its checkpoints are elsewhere now
    with pytest.raises(
        ValueError,
        match=r"holds checkpoints of another run \(its recipe differs: train\.lr 0\.002 -> "
        r"0\.0005\), up to step 6: resume it with the recipe that started it",
    ):
        train(a, resume=True)
    # the run's own resume of a finished run writes its own draft again
    train(b, resume=True)
    assert all(torch.equal(v, weights(b["output_dir"])[k]) for k, v in b_draft.items())


class Killed(Exception):
    """Stands for a SIGKILL: raised at a chosen filesystem step, so what is on disk is what a kill leaves."""


def make_checkpoint(root: Path, step: int, tag: str, rid: str) -> None:
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_text(tag)
    (d / STATE_FILE).write_text(json.dumps({"step": step, "tag": tag, "run_id": rid}))


def check_whole(ckpt: Path) -> str:
    """A checkpoint that looks whole must be whole: its state and its weights belong together."""
    state = read_state(ckpt)
    assert state is not None and (ckpt / "model.safetensors").read_text() == state["tag"], list(ckpt.iterdir())
    return state["tag"]


@pytest.mark.parametrize("partial", [False, True], ids=["before", "half-deleted"])
def test_a_kill_at_any_step_of_a_checkpoint_save_leaves_a_whole_old_or_new_checkpoint(
    tmp_path, monkeypatch, partial, own_accelerator_state
):
    """Replacing step-5 (which exists, e.g. written by an earlier attempt) and pruning step-3, killed before each
    rename, delete and write in turn (``half-deleted``: a delete killed after removing all but the state file);
    the next start's ``recover`` then leaves step-5 whole (old or new), and no temporary folder."""
    rid = "r"
    accelerator = Accelerator(cpu=True)
    real = {"replace": checkpoints.os.replace, "rmtree": checkpoints.shutil.rmtree}
    n_ops = None
    for kill_at in range(100):
        root = tmp_path / f"k{kill_at}" / "checkpoints"
        make_checkpoint(root, 3, "three", rid)
        make_checkpoint(root, 5, "old", rid)
        calls = []

        def op(kind, path, *rest):
            calls.append(kind)
            if len(calls) - 1 == kill_at:
                if partial and kind == "rmtree" and Path(path).is_dir():
                    for f in Path(path).iterdir():
                        if f.name != STATE_FILE:
                            f.unlink()
                raise Killed(kind)
            return real[kind](path, *rest) if kind == "replace" else real[kind](path, ignore_errors=True)

        def save_state(folder):  # what accelerate writes, then the weights this test can tell apart
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "model.safetensors").write_text("new")

        monkeypatch.setattr(checkpoints.os, "replace", lambda a, b: op("replace", a, b))
        monkeypatch.setattr(checkpoints.shutil, "rmtree", lambda p, ignore_errors=False: op("rmtree", p))
        monkeypatch.setattr(accelerator, "save_state", save_state)
        try:
            checkpoints.save_checkpoint(accelerator, root, 5, {"step": 5, "tag": "new"}, keep=1, rid=rid)
            killed = False
        except Killed:
            killed = True
        monkeypatch.setattr(checkpoints.os, "replace", real["replace"])
        monkeypatch.setattr(checkpoints.shutil, "rmtree", real["rmtree"])
        recover(root)
        assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
        assert check_whole(root / "step-5") in ("old", "new")
        if (root / "step-3").exists():
            assert check_whole(root / "step-3") == "three"
        assert latest_checkpoint(root, rid) == root / "step-5"
        if not killed:
            n_ops = kill_at
            assert check_whole(root / "step-5") == "new" and not (root / "step-3").exists()
            break
    assert n_ops is not None and n_ops >= 6  # every rename and delete of the save was a kill point


@pytest.mark.parametrize("where", ["writing", "renaming"])
def test_a_run_killed_while_saving_resumes_from_its_own_last_whole_checkpoint(
    where, tmp_path, tiny_target_dir, data_dir, monkeypatch
):
    """Killed while accelerate writes step 6's files (the half checkpoint is dropped: the resume starts at step 3)
    or after they are whole but before the rename (the resume takes step 6): either way the run ends with the
    weights of an uninterrupted run."""
    common = dict(data={"regenerate": True, "max_new_tokens": 12}, train={**SHORT, "max_steps": 9})
    full = recipe_for(tmp_path / "full", tiny_target_dir, [data_dir / "sharegpt.jsonl"], **common)
    killed = recipe_for(tmp_path / "killed", tiny_target_dir, [data_dir / "sharegpt.jsonl"], **common)
    ckpts = Path(killed["work_dir"]) / "checkpoints"

    if where == "writing":
        real = Accelerator.save_state

        def save_state(self, folder, *a, **kw):
            out = real(self, folder, *a, **kw)
            if folder.endswith("step-6"):
                (Path(folder) / "model.safetensors").unlink()  # cut short: the weights never landed
                raise Killed(folder)
            return out

        monkeypatch.setattr(Accelerator, "save_state", save_state)
    else:
        real = checkpoints.swap_in

        def swap_in(tmp, final):
            if final.name == "step-6":
                raise Killed(final)
            return real(tmp, final)

        monkeypatch.setattr(checkpoints, "swap_in", swap_in)
    with pytest.raises(Killed):
        train(killed)
    monkeypatch.undo()
    assert ckpt_runs(killed["work_dir"]) == {"step-3": run_id(run_identity(killed))}
    assert (ckpts / ".tmp-step-6").is_dir()

    train(killed, resume=True)
    train(full)
    a, b = weights(Path(full["work_dir"]) / "checkpoints" / "step-9"), weights(ckpts / "step-9")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma = json.loads((Path(full["output_dir"]) / "training_metrics.json").read_text())
    mb = json.loads((Path(killed["output_dir"]) / "training_metrics.json").read_text())
    assert ma["eval_history"] == mb["eval_history"] and [h["step"] for h in mb["eval_history"]] == [3, 6, 9]
    assert sorted(ckpt_runs(killed["work_dir"])) == ["step-6", "step-9"]
