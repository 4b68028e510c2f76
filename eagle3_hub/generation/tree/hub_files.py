"""``write_custom_generate``: the files a draft folder needs for ``target.generate(custom_generate=folder_or_repo)``."""

from __future__ import annotations

import re
from pathlib import Path

from ...atomic import atomic_copy

HERE = Path(__file__).resolve().parent
ENTRY = HERE / "hub_entry.py"


def _relative_imports(path: Path) -> set[str]:
    # the pattern transformers' dynamic module loader follows (transformers.dynamic_module_utils.get_relative_imports)
    text = path.read_text(encoding="utf-8")
    found = re.findall(r"^\s*import\s+\.(\S+)\s*$", text, flags=re.MULTILINE)
    found += re.findall(r"^\s*from\s+\.(\S+)\s+import", text, flags=re.MULTILINE)
    return set(found)


def custom_generate_files() -> dict[str, Path]:
    """``{path in the draft folder: source file}``: ``custom_generate/generate.py`` (the Hub entry) and every module
    of this package it imports, directly or not, as flat siblings (they import each other as ``from .x import y``)."""
    files = {"custom_generate/generate.py": ENTRY}
    todo = list(_relative_imports(ENTRY))
    while todo:
        name = todo.pop()
        source = HERE / f"{name}.py"
        if f"custom_generate/{name}.py" not in files:
            files[f"custom_generate/{name}.py"] = source
            todo += _relative_imports(source)
    return files


def write_custom_generate(folder: str | Path) -> Path:
    """Write ``folder/custom_generate/`` (see ``custom_generate_files``), each file atomically; returns the path of
    its ``generate.py``. The folder also needs the draft's ``modeling_eagle3.py`` and an ``auto_map`` for
    ``trust_remote_code`` where the package is not installed."""
    folder = Path(folder)
    (folder / "custom_generate").mkdir(parents=True, exist_ok=True)
    for name, source in custom_generate_files().items():
        atomic_copy(source, folder / name)
    return folder / "custom_generate" / "generate.py"
