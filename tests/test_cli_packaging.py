"""pyproject.toml names only files that exist, and its console script is the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


@pytest.mark.skipif(not PYPROJECT.is_file(), reason="runs from the source tree")
def test_package_data_patterns_all_match_files():
    config = tomllib.loads(PYPROJECT.read_text())
    for package, patterns in config["tool"]["setuptools"]["package-data"].items():
        base = ROOT / package.replace(".", "/")
        for pattern in patterns:
            assert [p for p in base.glob(pattern) if p.is_file()], f"{package}: {pattern!r} matches no file"
    assert config["project"]["scripts"]["eagle3-hub"] == "eagle3_hub.cli:main"
    assert (ROOT / config["project"]["readme"]).is_file()
