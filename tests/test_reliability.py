"""Nothing a user owns is deleted, bad values are refused in one line, a draft serves several threads.

Each test names the defect it guards against; each fails on the code before its fix."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from eagle3_hub.training import checkpoints
from eagle3_hub.training.checkpoints import STATE_FILE, claim_work_dir, move_aside, run_id


# ---------------------------------------------------------------------------------------------- train --overwrite


def _old_run(work: Path, rid: str) -> None:
    """A finished older run in ``work``: a whole checkpoint, its identity, its finished marker and its draft."""
    ckpt = work / "checkpoints" / "step-3"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_text(json.dumps({"step": 3, "run_id": rid}))
    (work / checkpoints.RUN_FILE).write_text(json.dumps({"run_id": rid, "identity": {}}))
    (work / checkpoints.FINISHED).write_text(json.dumps({"run_id": rid, "output_dir": str(work / "draft")}))
    (work / "draft").mkdir()
    (work / "draft" / "config.json").write_text('{"old": true}')
    (work / "data").mkdir()
    (work / "data" / "cache.json").write_text("{}")


def test_overwrite_moves_the_old_runs_draft_aside_with_its_checkpoints(tmp_path):
    """The defect: `train --overwrite` left the old run's draft/ in work_dir; a new run killed before writing its
    own left the old weights where `eagle3-hub push <work_dir>/draft` publishes them."""
    work = tmp_path / "work"
    _old_run(work, "old")
    identity = {"draft": {"init_from": None}, "train": {"lr": 1.0}}
    dest = claim_work_dir(work, identity, resume=False, overwrite=True)
    move_aside(work, dest)
    assert not (work / "draft").exists() and not (work / "checkpoints").exists()
    assert json.loads((Path(dest) / "draft" / "config.json").read_text()) == {"old": True}
    assert (Path(dest) / "checkpoints" / "step-3" / STATE_FILE).is_file()
    assert (work / "data" / "cache.json").is_file()  # the caches stay: they are keyed and checked on reuse


def test_overwrite_refuses_to_move_the_draft_the_recipe_continues(tmp_path):
    work = tmp_path / "work"
    _old_run(work, "old")
    identity = {"draft": {"init_from": str(work / "draft")}}
    assert run_id(identity) != "old"
    with pytest.raises(ValueError, match=r"continues that draft \(draft.init_from"):
        claim_work_dir(work, identity, resume=False, overwrite=True)
    assert (work / "draft" / "config.json").is_file()
