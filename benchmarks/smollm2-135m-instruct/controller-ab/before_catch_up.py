"""The adaptive tree's controller of commit 247d00a, driven as its decoder drove it: a tree after steps without one
was neither priced as such nor timed. The baseline of catch-up-*.log (``ab_controller.py --baseline``); it reads
247d00a's controller.py from a worktree beside this checkout: ``git worktree add ../base 247d00a``."""

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[4] / "base" / "eagle3_hub" / "generation" / "tree" / "controller.py"
if not _path.is_file():
    raise SystemExit(f"{_path} not found: create the worktree first (git worktree add ../base 247d00a)")
_name = "eagle3_hub.generation.tree.controller_247d00a"  # a sibling module, so its relative imports resolve
_spec = importlib.util.spec_from_file_location(_name, _path)
_before = importlib.util.module_from_spec(_spec)
sys.modules[_name] = _before
_spec.loader.exec_module(_before)


class TreeController(_before.TreeController):
    def choose(self, rows, lookup=0, max_depth=None, proposed=None, behind=False):
        return super().choose(rows, lookup, max_depth, proposed)

    def observe(self, rows, shape, accepted, seconds=None, looked_up=None, proposed=None, behind=False):
        timed = not (behind and shape.depth >= 1)
        return super().observe(rows, shape, accepted, seconds if timed else None, looked_up, proposed)
