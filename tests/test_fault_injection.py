"""A failure at any filesystem step of a writer leaves every file that was there before intact.

Each writer (the Space export, convert, the move of an older run aside, the model card, the card a push writes
before its upload) runs once to count its filesystem steps (renames, removals, copies, folder creations, files
opened for writing), then once per step with a fault injected at that step:

- an exception (``OSError``) in this process: the writer's own error handling runs, and what was there before
  must be there after, unchanged, with no temporary files left (the Space export and the card put everything
  back; convert leaves the old or the new output, whole);
- a kill (``os._exit`` in a forked child, so no ``finally`` and no handler runs): files the writer did not own
  are untouched, each file it owns is its old or its new version, whole, and the next run of the writer finishes
  the job.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import sys
from pathlib import Path

import pytest
from test_reliability import fake_wheel, snapshot

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill runs in a forked child")

PATCHED = {
    os: ("replace", "rename", "remove", "unlink", "rmdir", "mkdir", "makedirs", "open"),
    shutil: ("rmtree", "copyfile", "copy2", "copytree", "move"),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Killed(BaseException):
    pass


class Faults:
    """Counts the filesystem steps of the code under it; at step ``at`` raises ``OSError`` (``kill=False``) or ends
    the process at once (``kill=True``: ``os._exit``, as a SIGKILL would)."""

    def __init__(self, monkeypatch, at: int | None = None, kill: bool = False):
        self.steps = self.quiet = 0
        self.at, self.kill = at, kill
        for module, names in PATCHED.items():
            for name in names:
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, self._wrap(getattr(module, name), name, module is os and name == "open"))
        for module in (builtins, io):
            monkeypatch.setattr(module, "open", self._wrap_open(module.open))

    def _step(self, what: str):
        if self.quiet:
            return
        self.steps += 1
        if self.at is not None and self.steps == self.at:
            if self.kill:
                os._exit(137)
            raise OSError(errno.EIO, f"injected fault at step {self.steps} ({what})")

    def _wrap(self, fn, name: str, is_os_open: bool):
        def wrapped(*args, **kwargs):
            if kwargs.get("ignore_errors"):  # a clean-up that cannot fail (rmtree(..., ignore_errors=True)): the
                self.quiet += 1  # steps inside it are not faults either (a removal that fails leaves litter only)
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.quiet -= 1
            if not is_os_open or (len(args) > 1 and args[1] & WRITE_FLAGS) or kwargs.get("flags", 0) & WRITE_FLAGS:
                self._step(name)
            return fn(*args, **kwargs)

        return wrapped

    def _wrap_open(self, fn):
        def wrapped(file, mode="r", *args, **kwargs):
            if any(c in str(mode) for c in "wax+"):
                self._step(f"open({file}, {mode})")
            return fn(file, mode, *args, **kwargs)

        return wrapped


def count_steps(monkeypatch, writer) -> int:
    with monkeypatch.context() as m:
        faults = Faults(m)
        writer()
    return faults.steps


def run_killed_at(step: int, writer) -> int:
    """Run ``writer`` in a forked child that dies at filesystem step ``step``; its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        code = 0
        try:
            mp = pytest.MonkeyPatch()
            Faults(mp, at=step, kill=True)
            writer()
        except BaseException:  # noqa: BLE001 - a writer that fails on its own is also an outcome
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_failing_at(monkeypatch, step: int, writer) -> bool:
    """Run ``writer`` with an ``OSError`` at filesystem step ``step``; whether it raised."""
    with monkeypatch.context() as m:
        Faults(m, at=step)
        try:
            writer()
        except OSError:
            return True
    return False


def litter(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if ".tmp" in p.name or ".old-" in p.name or p.name.startswith((".del-", ".eagle3-hub-space"))
    )


# ---------------------------------------------------------------------------------------------- the Space export


@pytest.fixture
def space_case(tmp_path):
    """A Space clone (.git, notes) with an earlier export in it, and the wheel of the next export."""
    from eagle3_hub.space import export_space

    dest = tmp_path / "space"
    (dest / ".git").mkdir(parents=True)
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dest / "notes.txt").write_text("mine\n")
    export_space(dest, wheel=fake_wheel(tmp_path / "w1", "0.0.1"))
    wheel = fake_wheel(tmp_path / "w2", "0.0.2")
    reference = tmp_path / "reference"
    shutil.copytree(dest, reference)
    export_space(reference, wheel=wheel)
    return dest, wheel, snapshot(dest), snapshot(reference)


def test_space_export_survives_a_fault_at_every_step(space_case, monkeypatch):
    from eagle3_hub.space import export_space

    dest, wheel, before, after = space_case
    work = dest.parent / "work"
    shutil.copytree(dest, work)
    steps = count_steps(monkeypatch, lambda: export_space(work, wheel=wheel))
    assert steps >= 8
    for step in range(1, steps + 1):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(dest, work)
        raised = run_failing_at(monkeypatch, step, lambda: export_space(work, wheel=wheel))
        # as it was (nothing changed, nothing left behind), or done where the step's failure was harmless
        assert snapshot(work) == (before if raised else after), step
        assert litter(work) == [], step

        shutil.rmtree(work)
        shutil.copytree(dest, work)
        run_killed_at(step, lambda: export_space(work, wheel=wheel))
        now = snapshot(work)
        for name in (".git/HEAD", "notes.txt"):
            assert now[name] == before[name], (step, name)
        for name, data in now.items():  # every file the export owns is its old or its new version, whole
            if not name.startswith((".eagle3-hub-space.tmp-", ".space-export.json.", "space-export.json")):
                assert data in (before.get(name), after.get(name)), (step, name)
        # the manifest may list both versions of each file (the swap was under way); the next export, which refuses
        # files the manifest does not vouch for, finishes the job
        export_space(work, wheel=wheel)
        assert {k: v for k, v in snapshot(work).items() if not k.startswith(".space-export.json.")} == after, step


# ---------------------------------------------------------------------------------------------- convert --force


@pytest.fixture
def convert_case(tmp_path):
    from test_reliability import _tiny_pair

    _, draft = _tiny_pair()
    src = tmp_path / "src"
    draft.save_pretrained(src)
    (tmp_path / "keep.txt").write_text("a file beside the output\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "old-output.txt").write_text("what an earlier convert wrote\n")
    return src, out


def test_convert_force_survives_a_fault_at_every_step(convert_case, monkeypatch):
    from eagle3_hub.formats import convert

    src, out = convert_case
    root = src.parent
    before = snapshot(root)
    old_out = {k: v for k, v in before.items() if k.startswith("out/")}
    run = lambda: convert(str(src), str(out), force=True)  # noqa: E731
    steps = count_steps(monkeypatch, run)
    new_out = {k: v for k, v in snapshot(root).items() if k.startswith("out/")}
    assert steps >= 3

    def reset():  # the earlier output again; what a kill left is cleared
        for left in root.iterdir():
            if left.name.startswith("."):
                shutil.rmtree(left)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        (out / "old-output.txt").write_text("what an earlier convert wrote\n")

    for step in range(1, steps + 1):
        reset()
        raised = run_failing_at(monkeypatch, step, run)
        now = snapshot(root)
        outside = {k: v for k, v in now.items() if not k.startswith("out/")}
        assert outside == {k: v for k, v in before.items() if not k.startswith("out/")}, step  # src, keep.txt
        assert {k: v for k, v in now.items() if k.startswith("out/")} in (old_out, new_out), step
        assert not [p.name for p in root.iterdir() if p.name.startswith(".")], step  # no temporary folders
        assert raised or {k: v for k, v in now.items() if k.startswith("out/")} == new_out, step

        reset()
        run_killed_at(step, run)
        now = snapshot(root)
        assert {k: now[k] for k in before if k.startswith("src/") or k == "keep.txt"} == {
            k: before[k] for k in before if k.startswith("src/") or k == "keep.txt"
        }, step
        kept = {k: v for k, v in now.items() if k.startswith("out/")}
        moved = {k.split("/", 1)[1]: v for k, v in now.items() if k.startswith(".out.old-")}
        # the old output whole, in place or under .out.old-* (the kill came between the two renames), or the new one
        assert kept in (old_out, new_out) or moved == {k: v for k, v in old_out.items()}, (step, sorted(now))


# ---------------------------------------------------------------------------------------------- train --overwrite


def test_moving_an_older_run_aside_loses_nothing_at_any_step(tmp_path, monkeypatch):
    from test_reliability import _old_run

    from eagle3_hub.training.checkpoints import move_aside

    work = tmp_path / "work"
    _old_run(work, "old")
    (work / "tensorboard").mkdir()
    (work / "tensorboard" / "events").write_text("e")
    pristine = tmp_path / "pristine"
    shutil.copytree(work, pristine)
    before = snapshot(work)
    dest = work / "previous-1"

    def reset():
        shutil.rmtree(work)
        shutil.copytree(pristine, work)

    steps = count_steps(monkeypatch, lambda: move_aside(work, str(dest)))
    assert steps >= 5
    for step in range(1, steps + 1):
        for kill in (False, True):
            reset()
            if kill:
                run_killed_at(step, lambda: move_aside(work, str(dest)))
            else:
                run_failing_at(monkeypatch, step, lambda: move_aside(work, str(dest)))
            now = snapshot(work)
            for name, data in before.items():  # each file of the older run: where it was, or moved aside, whole
                assert now.get(name) == data or now.get(f"previous-1/{name}") == data, (step, kill, name)


# ---------------------------------------------------------------------------------------------- the model card


def test_the_model_card_survives_a_fault_at_every_step(tmp_path, monkeypatch):
    from test_reliability import _tiny_pair

    from eagle3_hub.card import write_model_card

    _, draft = _tiny_pair()
    folder = tmp_path / "draft"
    draft.save_pretrained(folder)
    write_model_card(folder, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", license="apache-2.0")
    (folder / "notes.txt").write_text("mine\n")
    chart = tmp_path / "bench.png"
    chart.write_bytes(b"\x89PNG not really")
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    before = snapshot(folder)
    run = lambda: write_model_card(
        folder,
        license="apache-2.0",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",  # noqa: E731
        repo_id="alice/smol-eagle3",
        chart=chart,
    )
    steps = count_steps(monkeypatch, run)
    after = snapshot(folder)
    assert after["README.md"] != before["README.md"] and steps >= 2
    for step in range(1, steps + 1):
        for kill in (False, True):
            shutil.rmtree(folder)
            shutil.copytree(pristine, folder)
            if kill:
                run_killed_at(step, run)
            else:
                run_failing_at(monkeypatch, step, run)
            now = {k: v for k, v in snapshot(folder).items() if ".tmp" not in k or kill}
            for name, data in before.items():  # nothing lost; the card and the copied bench whole, old or new
                assert now.get(name) in (data, after.get(name)), (step, kill, name)
            if not kill:
                assert litter(folder) == [], step


# ---------------------------------------------------------------------------------------------- push


def test_a_push_that_fails_at_any_local_step_keeps_the_folder(tmp_path, monkeypatch):
    """A push writes the card into the folder before the upload: a fault there or later (the upload reads the
    files) leaves the folder's files, the card old or new."""
    import huggingface_hub.constants
    from hub_server import FakeHub
    from test_reliability import _tiny_pair

    from eagle3_hub.hub import HubPushError, push_draft

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the fake Hub is local
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _, draft = _tiny_pair()
    folder = tmp_path / "draft"
    draft.save_pretrained(folder)
    (folder / "notes.txt").write_text("mine\n")
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    before = snapshot(folder)
    with FakeHub({"hf_alice": "alice"}) as hub:
        run = lambda: push_draft(folder, "smol", token="hf_alice", endpoint=hub.url)  # noqa: E731
        steps = count_steps(monkeypatch, run)
        after = snapshot(folder)
        assert steps >= 2 and "README.md" in after
        for step in range(1, steps + 1):
            shutil.rmtree(folder)
            shutil.copytree(pristine, folder)
            with monkeypatch.context() as m:
                Faults(m, at=step)
                try:
                    run()
                except (OSError, HubPushError):
                    pass
            now = snapshot(folder)
            for name, data in before.items():
                assert now.get(name) == data, (step, name)
            assert set(now) <= set(after) and now.get("README.md") in (None, after.get("README.md")), step
            assert litter(folder) == [], step


# ---------------------------------------------------------------------------------------------- training checkpoints


def test_a_checkpoint_write_survives_a_fault_at_every_step(tmp_path, monkeypatch, own_accelerator_state):
    """A run saves step 3 beside its steps 1 and 2 (it keeps 2) and another run's step 9. Whatever step of the save
    fails or is killed, after `recover` (what a resumed run does first) every checkpoint there is whole, the newest
    is step 2 as it was or step 3 as written, step 2 is untouched, and the other run's checkpoint too."""
    import torch
    from accelerate import Accelerator

    from eagle3_hub.training.checkpoints import latest_checkpoint, read_state, recover, save_checkpoint

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    root = tmp_path / "checkpoints"

    def save(step, rid="run"):
        with torch.no_grad():
            model.weight.fill_(step)
        save_checkpoint(accelerator, root, step, {"step": step}, keep=2, rid=rid)

    save(9, rid="other")
    save(1)
    save(2)
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine)
    before = snapshot(root)
    complete = tmp_path / "complete"  # what an uninterrupted save of step 3 leaves
    shutil.copytree(pristine, complete)

    def finish():
        save_checkpoint(accelerator, complete, 3, {"step": 3}, keep=2, rid="run")

    with torch.no_grad():
        model.weight.fill_(3)
    finish()
    after = snapshot(complete)

    def reset():
        shutil.rmtree(root)
        shutil.copytree(pristine, root)

    steps = count_steps(monkeypatch, lambda: save(3))
    assert steps >= 4
    for step in range(1, steps + 1):
        for kill in (False, True):
            reset()
            if kill:
                run_killed_at(step, lambda: save(3))
            else:
                run_failing_at(monkeypatch, step, lambda: save(3))
            recover(root)
            now = snapshot(root)
            assert not litter(root) and not list(root.glob(".*")), (step, kill, sorted(now))
            for ckpt in root.iterdir():
                assert read_state(ckpt) is not None, (step, kill, ckpt.name)  # every checkpoint left is whole
            newest = latest_checkpoint(root, "run")
            assert newest is not None and newest.name in ("step-2", "step-3"), (step, kill)
            for name, data in before.items():
                if name.startswith(("step-2/", "step-9/")) or newest.name == "step-2":
                    assert now.get(name) == data, (step, kill, name)  # untouched until step 3 is whole
            if newest.name == "step-3":
                for name, data in after.items():
                    if name.startswith("step-3/") and not name.endswith(".pkl"):  # RNG states differ per call
                        assert now.get(name) == data, (step, kill, name)
