"""How the package is put together: which imports pull which dependencies (checked in a fresh interpreter, where
``sys.modules`` shows what an import really loaded)."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after(code: str, block: tuple[str, ...] = ()) -> set[str]:
    """Top-level module names loaded by ``code`` in a fresh interpreter; ``block``: names that fail to import."""
    probe = (
        "import json, sys\n"
        + "".join(f"sys.modules[{name!r}] = None\n" for name in block)  # None in sys.modules: ImportError
        + code
        + "\nprint(json.dumps(sorted({m.split('.')[0] for m, v in sys.modules.items() if v is not None})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_demo_race_imports_without_gradio():
    loaded = _modules_after(
        "from eagle3_hub.demo.racing import race, PlainDecoder, Settings\n"
        "from eagle3_hub.demo import race, serve_request, validate_request, load_pair\n",
        block=("gradio",),
    )
    assert "gradio" not in loaded and "torch" in loaded
