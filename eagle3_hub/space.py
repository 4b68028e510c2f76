"""A Hugging Face Space folder for the side-by-side demo that needs nothing but PyPI and itself.

``export_space(DIR)`` (``eagle3-hub demo --export-space DIR``) writes:

- ``app.py``, ``README.md`` (the Space's front matter) and ``pairs.yaml`` from ``spaces/`` in the source tree
  (``pairs`` replaces the last);
- ``eagle3_hub-<version>-py3-none-any.whl``: this package, built here from the source tree (or the ``wheel`` given),
  with the reference draft and the bundled MT-bench inside;
- ``requirements.txt``: the wheel's own dependencies from PyPI. The Space builder mounts ``requirements.txt`` alone
  when it installs them, so a line naming the wheel could not resolve there; ``app.py`` installs the bundled wheel
  (``pip install --no-deps --no-index``, nothing downloaded) when the package is not importable yet.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .atomic import atomic_copy, atomic_dir, atomic_write_text

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


def export_space(dest: str | Path, pairs: str | Path | None = None, wheel: str | Path | None = None) -> Path:
    """Write the Space folder ``dest`` (replaced as a whole; see the module docstring); returns it."""
    root = source_root()
    if root is None:
        raise ValueError("--export-space needs the Space files (spaces/app.py, README.md, pairs.yaml) of a clone of the "
                         "eagle3-hub repository; this install has none.")
    if pairs is not None and not Path(pairs).is_file():
        raise FileNotFoundError(f"pairs file {pairs} does not exist: pass a YAML file like spaces/pairs.yaml")
    if pairs is not None:
        from .demo import load_pairs

        load_pairs(pairs)  # a broken pairs file stops here, not on the Space
    if wheel is not None and not Path(wheel).is_file():
        raise FileNotFoundError(f"wheel {wheel} does not exist: pass an eagle3_hub-*.whl file, or leave --wheel out to build one")
    dest = Path(dest)
    with atomic_dir(dest) as tmp:
        for name in SPACE_TEMPLATE_FILES:
            atomic_copy(root / "spaces" / name, tmp / name)
        if pairs is not None:
            atomic_copy(pairs, tmp / "pairs.yaml")
        built = Path(atomic_copy(wheel, tmp / Path(wheel).name)) if wheel is not None else build_wheel(tmp, root)
        requirements = [r for r in wheel_requirements(built) if _requirement_name(r) not in PROVIDED_BY_THE_SPACE]
        atomic_write_text(tmp / "requirements.txt", (
            "# Written by `eagle3-hub demo --export-space`: the dependencies of the bundled wheel\n"
            f"# ({built.name}), which app.py installs with --no-deps at start. gradio comes from README.md's sdk_version.\n"
            + "".join(r + "\n" for r in requirements)
        ))
    return dest
