"""A Hugging Face Space folder for the side-by-side demo that needs nothing but PyPI and itself.

``export_space(DIR)`` (``eagle3-hub demo --export-space DIR``) writes:

- ``app.py``, ``README.md`` (the Space's front matter) and ``pairs.yaml`` from ``spaces/`` in the source tree
  (``pairs`` replaces the last);
- ``eagle3_hub-<version>-py3-none-any.whl``: this package, built here from the source tree (or the ``wheel`` given),
  with the reference draft and the bundled MT-bench inside;
- ``requirements.txt``: the wheel's own dependencies from PyPI. The Space builder mounts ``requirements.txt`` alone
  when it installs them, so a line naming the wheel could not resolve there; ``app.py`` installs the bundled wheel
  (``pip install --no-deps --no-index``, nothing downloaded) when the package is not importable yet;
- ``space-export.json``: the files the export wrote, with their sha256. Nothing else in ``DIR`` is touched (a
  clone's ``.git``, notes), and a file of the names above is replaced only where an export wrote it and it has not
  changed since: exporting again over an earlier export replaces it; a folder holding other such files is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .atomic import atomic_write_bytes, atomic_write_text

logger = logging.getLogger(__name__)

SPACE_TEMPLATE_FILES = ("app.py", "README.md", "pairs.yaml")
# provided by the Space itself: gradio by the README's `sdk_version`
PROVIDED_BY_THE_SPACE = {"gradio"}


def source_root() -> Path | None:
    """The source checkout this package runs from (``pyproject.toml`` and ``spaces/`` beside it), if any."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "spaces" / "app.py").is_file():
        return root
    return None


def _setuptools_builds_in_place() -> bool:
    """Whether this environment's setuptools can build the wheel itself (PEP 639 ``license`` string: >= 77), so
    that no build environment has to be downloaded."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
        importlib.metadata.version("wheel")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


def build_wheel(out_dir: str | Path, root: str | Path | None = None) -> Path:
    """Build this package's wheel from its source tree into ``out_dir``; returns the wheel's path."""
    root = Path(root) if root is not None else source_root()
    if root is None or not (root / "pyproject.toml").is_file():
        raise ValueError(
            "Building the eagle3-hub wheel needs its source tree (pyproject.toml beside the package); this install has "
            "none. Pass a wheel of eagle3-hub (--wheel PATH) or run from a clone of the repository."
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eagle3-hub-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", tmp, str(root)]
        if _setuptools_builds_in_place():
            cmd.insert(4, "--no-build-isolation")
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("eagle3_hub-*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was written"]
            raise OSError(f"pip wheel {root} failed: {last[0]}")
        return Path(shutil.copy2(wheels[0], out_dir / wheels[0].name))


def wheel_requirements(wheel: str | Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel without an extra marker (what ``pip install wheel`` brings)."""
    wheel = Path(wheel)
    try:
        with zipfile.ZipFile(wheel) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = zf.read(name).decode("utf-8")
    except (zipfile.BadZipFile, StopIteration, OSError) as e:
        raise ValueError(f"{wheel} is not a wheel with METADATA ({e}): pass the .whl file of eagle3-hub") from None
    requirements = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1].strip()
            if "extra ==" not in req:
                requirements.append(req)
    return requirements


def _requirement_name(req: str) -> str:
    for i, ch in enumerate(req):
        if not (ch.isalnum() or ch in "-_."):
            return req[:i].lower()
    return req.lower()


MANIFEST = "space-export.json"  # what the export wrote, file by file: the files a later export may replace
REQUIREMENTS_HEADER = "# Written by `eagle3-hub demo --export-space`"
VCS_DIRS = (".git", ".hg", ".svn")
STAGING_PREFIX = ".eagle3-hub-space.tmp-"  # in DIR: the files of an export, before they are moved into place


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _written_before(dest: Path) -> dict[str, set[str] | None]:
    """The files an earlier export wrote in ``dest``: name -> the sha256 values it may have (an export records the
    contents before and after it swaps files in, so a kill between leaves either); ``None``: an export from before
    the manifest, recognised by its requirements.txt, whose files carry no hash."""
    try:
        files = json.loads((dest / MANIFEST).read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError
        return {
            str(k): {v} if isinstance(v, str) else {str(h) for h in v}
            for k, v in files.items()
            if "/" not in str(k) and str(k) not in ("", ".", "..")
        }
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(
            f"{dest / MANIFEST} is not the manifest eagle3-hub writes: move it away, or export to another folder."
        ) from None
    try:
        legacy = (dest / "requirements.txt").read_text(encoding="utf-8").startswith(REQUIREMENTS_HEADER)
    except (OSError, UnicodeDecodeError):
        legacy = False
    if not legacy:
        return {}
    names = [*SPACE_TEMPLATE_FILES, "requirements.txt", *(p.name for p in dest.glob("eagle3_hub-*.whl"))]
    return {n: None for n in names}


def _check_destination(dest: Path, names: list[str], staging: Path | None = None) -> dict[str, set[str] | None]:
    """Refuse a destination the export would harm: a VCS folder, a file, or one holding a file of a name the export
    writes that an earlier export did not write (or that was changed since). Returns the earlier export's files."""
    if any(part in VCS_DIRS for part in dest.parts):
        raise ValueError(
            f"--export-space {dest}: a version-control folder ({'/'.join(VCS_DIRS)}) is never written "
            "into: give the folder of the Space's clone, not its .git."
        )
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"--export-space {dest} is a file: give a folder (new, empty, or one this command wrote).")
    if not dest.is_dir():
        return {}
    if staging is None:  # the first look: before this export made its own temporary folder
        _recover(dest)
    ours = _written_before(dest)
    clash = []
    for name in dict.fromkeys([*names, MANIFEST]):
        path = dest / name
        if not path.exists() and not path.is_symlink():
            continue
        if name == MANIFEST and path.is_file():
            continue  # read above: ours, or refused there
        if path.is_symlink() or not path.is_file() or name not in ours or (ours[name] and _sha256(path) not in ours[name]):
            clash.append(name)
    if clash:
        raise ValueError(
            f"--export-space {dest} holds {', '.join(clash)}, which an earlier export did not write (or which changed "
            f"since): the export never replaces a file it did not write. Move {'them' if len(clash) > 1 else 'it'} "
            "away, or export to a new folder."
        )
    return ours


def _stale(dest: Path, ours: dict[str, set[str] | None], names: list[str]) -> list[str]:
    """The files an earlier export wrote that this one does not (an older wheel), to remove: only those whose
    contents are still what the manifest recorded; a file of that name the user wrote or changed stays, said so."""
    stale = []
    for name in ours:
        path = dest / name
        if name in names or name == MANIFEST or path.is_symlink() or not path.is_file():
            continue
        if ours[name] and _sha256(path) not in ours[name]:
            logger.warning(
                "--export-space: kept %s: an earlier export wrote a file of that name, but this one has "
                "changed since (or is yours); remove it yourself if the Space does not need it.",
                path,
            )
            continue
        stale.append(name)
    return stale


def _recover(dest: Path) -> None:
    """After an export that was killed: the files it had moved aside and not yet replaced go back; its temporary
    folder goes."""
    for left in dest.glob(STAGING_PREFIX + "*"):
        old = left / "old"
        for f in sorted(old.iterdir()) if old.is_dir() else []:
            if not (dest / f.name).exists():
                os.replace(f, dest / f.name)
        shutil.rmtree(left, ignore_errors=True)


def export_space(dest: str | Path, pairs: str | Path | None = None, wheel: str | Path | None = None) -> Path:
    """Write the Space files into ``dest`` (see the module docstring); returns it.

    ``dest`` may be new, empty, or hold anything else (a clone's ``.git``, notes): only the Space's own files are
    written. A file of one of those names is replaced only when an earlier export wrote it and it has not changed
    since (``space-export.json`` records what an export wrote); otherwise the export refuses before writing. The
    files are built in a temporary folder inside ``dest`` and moved into place at the end; a failure puts back
    what was there and removes the temporary folder."""
    root = source_root()
    if root is None:
        raise ValueError(
            "--export-space needs the Space files (spaces/app.py, README.md, pairs.yaml) of a clone of the "
            "eagle3-hub repository; this install has none."
        )
    if pairs is not None and not Path(pairs).is_file():
        raise FileNotFoundError(f"pairs file {pairs} does not exist: pass a YAML file like spaces/pairs.yaml")
    if pairs is not None:
        from .demo import load_pairs

        load_pairs(pairs)  # a broken pairs file stops here, not on the Space
    if wheel is not None and not Path(wheel).is_file():
        raise FileNotFoundError(f"wheel {wheel} does not exist: pass an eagle3_hub-*.whl file, or leave --wheel out to build one")
    if wheel is not None and not Path(wheel).name.startswith("eagle3_hub-"):
        raise ValueError(f"wheel {wheel} is not a wheel of eagle3-hub (eagle3_hub-*.whl)")
    dest = Path(os.path.abspath(dest))
    fixed = [*SPACE_TEMPLATE_FILES, "requirements.txt"] + ([Path(wheel).name] if wheel is not None else [])
    _check_destination(dest, fixed)  # before the wheel is built: refuse early
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest, prefix=STAGING_PREFIX))
    ok = False
    try:
        new = staging / "new"
        new.mkdir()
        for name in SPACE_TEMPLATE_FILES:
            shutil.copyfile(root / "spaces" / name, new / name)
        if pairs is not None:
            shutil.copyfile(pairs, new / "pairs.yaml")
        built = Path(shutil.copyfile(wheel, new / Path(wheel).name)) if wheel is not None else build_wheel(new, root)
        requirements = [r for r in wheel_requirements(built) if _requirement_name(r) not in PROVIDED_BY_THE_SPACE]
        (new / "requirements.txt").write_text(
            f"{REQUIREMENTS_HEADER}: the dependencies of the bundled wheel\n"
            f"# ({built.name}), which app.py installs with --no-deps at start. gradio comes from README.md's sdk_version.\n"
            + "".join(r + "\n" for r in requirements),
            encoding="utf-8",
        )
        names = sorted(p.name for p in new.iterdir())
        ours = _check_destination(dest, names, staging)  # the built wheel's name, known only now
        stale = _stale(dest, ours, names)  # an older wheel
        written = {n: _sha256(new / n) for n in names}
        # recorded first: while the files are swapped, each is the old one or the new one
        during = {
            n: sorted({*([written[n]] if n in written else []), *([_sha256(dest / n)] if (dest / n).is_file() else [])})
            for n in [*names, *stale]
        }
        before = (dest / MANIFEST).read_bytes() if (dest / MANIFEST).is_file() else None
        try:
            _write_manifest(dest, during)
            _swap_in(dest, new, staging / "old", names, stale, finish=lambda: _write_manifest(dest, written))
        except BaseException:
            if before is None:
                (dest / MANIFEST).unlink(missing_ok=True)
            else:
                atomic_write_bytes(dest / MANIFEST, before)
            raise
        ok = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not ok:
            with contextlib.suppress(OSError):
                dest.rmdir()  # the folder this export made, empty again
    return dest


def _write_manifest(dest: Path, files: dict) -> None:
    atomic_write_text(
        dest / MANIFEST,
        json.dumps({"written_by": "eagle3-hub demo --export-space", "files": files}, indent=2, sort_keys=True) + "\n",
    )


def _swap_in(dest: Path, new: Path, old: Path, names: list[str], stale: list[str], finish) -> None:
    """Move ``names`` from ``new`` into ``dest`` and ``stale`` out of it, the files they replace first moved to
    ``old``, then call ``finish``; an exception on the way moves everything back, so ``dest`` is as it was."""
    old.mkdir()
    done: list[tuple[str, bool]] = []  # (name, whether an older file was moved aside)
    try:
        for name in stale:
            os.replace(dest / name, old / name)
            done.append((name, True))
        for name in names:
            aside = (dest / name).exists()
            if aside:
                os.replace(dest / name, old / name)
            done.append((name, aside))
            os.replace(new / name, dest / name)
        finish()
    except BaseException:
        for name, aside in reversed(done):
            if name not in stale and (dest / name).exists() and not (new / name).exists():
                os.replace(dest / name, new / name)
            if aside and (old / name).exists():
                os.replace(old / name, dest / name)
        raise
