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


def _eagle3_modules_after(code: str) -> set[str]:
    """The eagle3_hub modules ``code`` loaded, in a fresh interpreter."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('eagle3_hub'))))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_training_imports_neither_the_card_nor_the_hub_and_the_card_no_training():
    """Imports run one way: the card and the Hub push below training, the publish step above both."""
    trained = _eagle3_modules_after("import eagle3_hub.training.train, eagle3_hub.training.data")
    assert not {"eagle3_hub.card", "eagle3_hub.hub", "eagle3_hub.publish"} & trained
    card = _eagle3_modules_after("import eagle3_hub.card, eagle3_hub.hub")
    assert not [m for m in card if m.startswith("eagle3_hub.training")]
    # the publish step reads training's metrics without the training machinery (the card command needs no extras)
    published = _eagle3_modules_after("import eagle3_hub.publish")
    assert {m for m in published if m.startswith("eagle3_hub.training")} == {
        "eagle3_hub.training", "eagle3_hub.training.card_info", "eagle3_hub.training.presets"}
