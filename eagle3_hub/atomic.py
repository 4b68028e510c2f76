"""Atomic writes: a reader, or a run resumed after a kill, sees the old file or the new one, never half of one.

Every file or folder eagle3-hub writes for others to read goes through here: the bytes go to a temporary
name in the destination's own folder (same filesystem, so ``os.replace`` is atomic) and are renamed at the end.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yields a temporary path next to ``path``; on a clean exit it replaces ``path``, on an error it is removed.

    For writers that take a file name (``safetensors.torch.save_file``, ``plt.savefig``): pass ``suffix`` where the
    writer infers the format from it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f"{suffix}.tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | Path, obj, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=str) + "\n")


def atomic_copy(src: str | Path, dst: str | Path) -> Path:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
    return Path(dst)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yields an empty temporary folder next to ``path``; on a clean exit it takes ``path``'s place (an existing
    ``path`` is moved aside first and removed after the swap), on an error it is removed and ``path`` is untouched.

    Between the two renames a kill leaves the old folder under ``.<name>.old-*`` and no ``path``: never a half one.
    The temporary folders carry the writer's process id; the next call for ``path`` removes those a killed writer
    left (and puts back an old folder that a kill left moved aside), so a kill leaves nothing behind for good."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-"))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    try:
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old-{os.getpid()}-"))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
    except BaseException:  # the swap failed: the old folder back in place, no temporary folder left
        if old is not None and (old / path.name).exists() and not path.exists():
            os.replace(old / path.name, path)
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            with contextlib.suppress(OSError):
                old.rmdir()  # empty once the old folder is back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _writer_is_gone(folder: Path, kind: str, name: str) -> bool:
    """Whether ``folder`` (``.<name>.<kind>-<pid>-*``) was left by a process that no longer runs."""
    pid = folder.name[len(f".{name}.{kind}-") :].split("-", 1)[0]
    if not pid.isdigit():
        return False  # not named by this module: not ours to remove
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: still running
        return False
    return False


def _clear_leftovers(path: Path) -> None:
    """What killed writers of ``path`` left beside it: their temporary folders go; an old folder moved aside goes
    back when ``path`` is missing (the kill came between the two renames), or goes when ``path`` is in place."""
    for left in sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*")):
        if left.is_dir() and _writer_is_gone(left, "old", path.name):
            if (left / path.name).exists() and not path.exists():
                os.replace(left / path.name, path)
            shutil.rmtree(left, ignore_errors=True)
    for left in sorted(path.parent.glob(f".{glob.escape(path.name)}.tmp-*")):
        if left.is_dir() and _writer_is_gone(left, "tmp", path.name):
            shutil.rmtree(left, ignore_errors=True)
