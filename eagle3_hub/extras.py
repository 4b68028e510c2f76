"""The optional parts of eagle3-hub (``pyproject.toml``'s extras) and the one line a missing package gets.

Using a draft needs the core dependencies only; training, the benchmark's charts and Hub dataset suites, and the
demo need more. Where library code imports one of those packages, a missing one is ``MissingExtra``: one line that
names the extra to install (the CLI prints it and exits 2).
"""

from __future__ import annotations

# extra -> what needs it
EXTRAS = {
    "train": "training (eagle3-hub train)",
    "bench": "the benchmark's charts and Hub dataset suites (eagle3-hub bench)",
    "demo": "the demo (eagle3-hub demo)",
}


class MissingExtra(ImportError):
    """A package of an extra is not installed; the message names the extra."""


def missing_extra(extra: str, error: ModuleNotFoundError) -> MissingExtra:
    """``raise missing_extra("train", e) from None`` in ``except ModuleNotFoundError as e`` around an import."""
    return MissingExtra(
        f"{EXTRAS[extra]} needs the Python package {error.name!r}, which is not installed: pip install 'eagle3-hub[{extra}]'"
    )
