"""Checkpoints of a training run, and which run they belong to.

A run's identity is the hash of the recipe keys that change what it computes (target, data, draft, objective and
schedule; not how often it logs or saves, nor where it writes). It is recorded in ``<work_dir>/run.json`` and in
every checkpoint, so a run only ever resumes its own checkpoints, and a new run never mixes its checkpoints with
an older run's.

A checkpoint ``checkpoints/step-N`` is whole when its ``trainer_state.json`` exists: that file is written last,
into a temporary folder that is then renamed into place; an existing ``step-N`` is renamed aside first and removed
after, so a kill at any point leaves the old whole ``step-N`` or the new whole one (``recover`` finishes an
interrupted swap on the next start).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from ..atomic import atomic_write_json
from .recipe_schema import without_later_defaults

RUN_FILE = "run.json"  # in work_dir: the identity of the run whose checkpoints are there
STATE_FILE = "trainer_state.json"  # in a checkpoint: written last, so its presence marks the checkpoint whole
FINISHED = "finished.json"  # in work_dir: written last, by a run that completed
DRAFT_DIR = "draft"  # in work_dir: where a run writes its draft unless output_dir says otherwise
# what an older run leaves in work_dir besides its caches (data, features, vocab.json are keyed and checked on reuse);
# its draft goes with it, so that a push of this work_dir's draft never publishes the older run's weights
RUN_OUTPUTS = ("checkpoints", RUN_FILE, FINISHED, "eval_metrics.json", "tensorboard", DRAFT_DIR)
# recipe keys that do not change what a run computes
_NOT_IDENTITY = {
    None: ("work_dir", "output_dir", "push_to_hub", "private", "stages"),
    "train": ("save_every", "eval_every", "eval_steps", "log_every", "keep_checkpoints", "num_threads", "gradient_checkpointing"),
    "features": ("cache_dir", "reuse_from"),
    # which decoder writes the target's answers: in float32 both write the same tokens, and each cached answer records it
    "data": ("regenerate_with", "regenerate_draft"),
}


def run_identity(recipe: dict) -> dict:
    """The recipe without the keys that only say how often to log, save or evaluate, or where to write."""
    ident = {k: copy.deepcopy(v) for k, v in without_later_defaults(recipe).items() if k not in _NOT_IDENTITY[None]}
    for section, keys in _NOT_IDENTITY.items():
        if section is not None and isinstance(ident.get(section), dict):
            ident[section] = {k: v for k, v in ident[section].items() if k not in keys}
    return json.loads(json.dumps(ident, sort_keys=True, default=str))


def run_id(identity: dict) -> str:
    return hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def read_state(ckpt: Path) -> dict | None:
    """The checkpoint's trainer state, or None when the checkpoint is not whole."""
    try:
        state = json.loads((ckpt / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "step" in state else None


def whole_checkpoints(ckpt_root: Path) -> list[tuple[Path, dict]]:
    """(folder, state) of every whole ``step-N`` checkpoint, oldest first."""
    found = []
    for p in ckpt_root.glob("step-*") if ckpt_root.is_dir() else []:
        state = read_state(p) if p.name.split("-", 1)[1].isdigit() else None
        if state is not None:
            found.append((p, state))
    return sorted(found, key=lambda ps: _step(ps[0]))


def latest_checkpoint(ckpt_root: Path, rid: str) -> Path | None:
    """This run's newest whole checkpoint."""
    own = [p for p, s in whole_checkpoints(ckpt_root) if s.get("run_id") == rid]
    return own[-1] if own else None


def _remove(path: Path) -> None:
    """Rename aside, then delete: a kill during the delete never leaves a half folder under a checkpoint's name
    (``recover`` deletes a ``.del-*`` folder, whatever it still holds)."""
    gone = path.with_name(f".del-{path.name}")
    shutil.rmtree(gone, ignore_errors=True)
    os.replace(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def swap_in(tmp: Path, final: Path) -> None:
    """Put the whole folder ``tmp`` in the place of ``final``: old aside, new in, old removed."""
    old = final.with_name(f".old-{final.name}")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def recover(ckpt_root: Path) -> None:
    """Finish or undo what a kill interrupted: a whole ``.tmp-step-N`` whose ``step-N`` is missing is renamed in
    (the kill came between the two renames of ``swap_in``), an ``.old-step-N`` whose ``step-N`` is missing goes
    back (it is whole: ``swap_in`` deletes it only once ``step-N`` is in place); any other temporary folder is a
    checkpoint whose writing or removal was cut short, and is deleted."""
    if not ckpt_root.is_dir():
        return
    for tmp in sorted(ckpt_root.glob(".tmp-step-*")):
        final = ckpt_root / tmp.name[len(".tmp-") :]
        if not final.exists() and read_state(tmp) is not None:
            os.replace(tmp, final)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in sorted(ckpt_root.glob(".old-step-*")):
        final = ckpt_root / old.name[len(".old-") :]
        if not final.exists() and read_state(old) is not None:
            os.replace(old, final)
        else:
            shutil.rmtree(old, ignore_errors=True)
    for gone in ckpt_root.glob(".del-step-*"):
        shutil.rmtree(gone, ignore_errors=True)


def save_checkpoint(accelerator, ckpt_root: Path, step: int, state: dict, keep: int, rid: str) -> None:
    """accelerate's ``save_state`` into a temporary folder, the trainer state written last (the checkpoint is whole
    from then on), a swap into ``step-N``, then the run's own checkpoints beyond the newest ``keep`` removed."""
    tmp = ckpt_root / f".tmp-step-{step}"
    if accelerator.is_main_process:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()  # every process has written its part (RNG states) before the marker
    if accelerator.is_main_process:
        atomic_write_json(tmp / STATE_FILE, {**state, "run_id": rid})
        swap_in(tmp, ckpt_root / f"step-{step}")
        prune(ckpt_root, rid, keep)
    accelerator.wait_for_everyone()


def prune(ckpt_root: Path, rid: str, keep: int) -> None:
    """Remove this run's checkpoints but the newest ``keep``; never another run's."""
    own = [p for p, s in whole_checkpoints(ckpt_root) if s.get("run_id") == rid]
    for p in own[:-keep]:
        _remove(p)


def _describe(identity: dict, other: dict | None) -> str:
    """The recipe keys whose values differ, as ``train.lr 0.001 -> 0.0005`` (at most four)."""
    if not other:
        return "recorded without its recipe"
    diffs = []

    def walk(a, b, path):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}{k}." if path or k else k)
        elif a != b:
            diffs.append(f"{path.rstrip('.')} {json.dumps(a)} -> {json.dumps(b)}")

    walk(other, identity, "")
    shown = "; ".join(diffs[:4]) + (f"; {len(diffs) - 4} more" if len(diffs) > 4 else "")
    return f"its recipe differs: {shown}" if diffs else "the same recipe"


def claim_work_dir(work: Path, identity: dict, resume: bool, overwrite: bool) -> str | None:
    """Check that this run may use ``work``'s checkpoints, before anything is written; return the folder an
    ``overwrite`` should move the older run to (``None``: nothing to move).

    A fresh run refuses a work_dir that holds checkpoints (its own recipe's or another's), as transformers'
    example scripts refuse a non-empty output_dir: ``--resume`` continues it, ``--overwrite`` moves it aside to
    ``<work_dir>/previous-<time>``. A resumed run refuses checkpoints of another recipe likewise."""
    rid = run_id(identity)
    ckpts = whole_checkpoints(work / "checkpoints")
    if not ckpts:
        return None
    foreign = [(p, s) for p, s in ckpts if s.get("run_id") != rid]
    if resume and not foreign:
        return None
    if overwrite:
        init = (identity.get("draft") or {}).get("init_from")
        for name in _run_drafts(work):
            if init and Path(init).resolve() == (work / name).resolve():
                raise ValueError(
                    f"--overwrite moves the run in {work} aside, its draft {work / name} included, but this recipe "
                    f"continues that draft (draft.init_from: {init}): copy it out of {work} and point draft.init_from "
                    "there, or give another work_dir."
                )
        return str(work / f"previous-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        recorded = json.loads((work / RUN_FILE).read_text())
    except (OSError, ValueError):
        recorded = {}
    newest = (foreign or ckpts)[-1]
    other = recorded.get("identity") if recorded.get("run_id") == newest[1].get("run_id") else None
    if not foreign:  # a fresh run over this same recipe's checkpoints
        raise ValueError(
            f"{work} already holds checkpoints of this recipe (up to step {newest[1]['step']}): pass --resume to "
            f"continue that run, --overwrite to move it aside to {work}/previous-<time> and start again, or give "
            "another work_dir."
        )
    what = "an unrecorded run" if "run_id" not in newest[1] else f"another run ({_describe(identity, other)})"
    raise ValueError(
        f"{work} holds checkpoints of {what}, up to step {newest[1]['step']}: "
        + ("resume it with the recipe that started it, " if resume else "")
        + f"pass --overwrite to move that run aside to {work}/previous-<time>, or give another work_dir."
    )


def _run_drafts(work: Path) -> list[str]:
    """The names of the draft folders an older run wrote inside ``work``: ``draft`` and the ``output_dir`` its
    finished marker records, when that lies in ``work`` (a draft written elsewhere is not the work_dir's)."""
    names = [DRAFT_DIR]
    try:
        out = json.loads((work / FINISHED).read_text()).get("output_dir")
    except (OSError, ValueError, AttributeError):
        out = None
    if out:
        try:
            rel = Path(out).resolve().relative_to(work.resolve())
        except ValueError:
            rel = None
        if rel is not None and len(rel.parts) == 1 and rel.parts[0] not in names:
            names.append(rel.parts[0])
    return [n for n in names if (work / n).exists()]


def move_aside(work: Path, dest: str) -> None:
    """Move an older run whole from ``work`` into ``dest``: checkpoints, identity, logs, finished marker and the
    draft it wrote in ``work`` (renames only; nothing is deleted)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    names = [*(n for n in RUN_OUTPUTS if n != DRAFT_DIR), *_run_drafts(work)]
    for name in names:
        if (work / name).exists():
            os.replace(work / name, dest / name)
    print(f"[work_dir] the run that was in {work} moved to {dest}")


def record_run(work: Path, identity: dict) -> str:
    """Write ``run.json`` (before the first checkpoint): which run the checkpoints in ``work`` belong to."""
    rid = run_id(identity)
    atomic_write_json(work / RUN_FILE, {"run_id": rid, "identity": identity})
    return rid


def finished_run(recipe: dict) -> bool:
    """Whether this recipe's run completed in its work_dir (a finished run of another recipe does not count)."""
    try:
        done = json.loads((Path(recipe["work_dir"]) / FINISHED).read_text())
    except (OSError, ValueError):
        return False
    return done.get("run_id", None) in (None, run_id(run_identity(recipe)))  # None: written before run ids


__all__ = [
    "FINISHED",
    "RUN_FILE",
    "STATE_FILE",
    "claim_work_dir",
    "finished_run",
    "latest_checkpoint",
    "move_aside",
    "prune",
    "read_state",
    "record_run",
    "recover",
    "run_id",
    "run_identity",
    "save_checkpoint",
    "swap_in",
    "whole_checkpoints",
]
