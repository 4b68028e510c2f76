"""How the package is put together: which imports pull which dependencies (checked in a fresh interpreter, where
``sys.modules`` shows what an import really loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


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
        "eagle3_hub.training",
        "eagle3_hub.training.card_info",
        "eagle3_hub.training.presets",
    }


def test_help_of_the_cli_and_of_every_command_imports_no_torch():
    """``eagle3-hub --help`` and ``eagle3-hub CMD --help`` answer from argparse alone: no torch, no transformers."""
    from eagle3_hub.cli import COMMANDS

    calls = "".join(
        f"\ntry:\n    main({[*argv, '--help']!r})\nexcept SystemExit:\n    pass\n" for argv in ([], *([c] for c in COMMANDS))
    )
    code = (
        "import contextlib, io\nfrom eagle3_hub.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):"
        + calls.replace("\n", "\n    ")
    )
    loaded = _modules_after(code)
    assert not {"torch", "transformers", "gradio", "datasets", "accelerate", "matplotlib"} & loaded


def test_the_convert_command_offers_the_layouts_formats_writes():
    from eagle3_hub import formats
    from eagle3_hub.commands import convert

    assert convert.EXPORTS == formats.EXPORTS


@pytest.mark.parametrize(
    ("blocked", "code", "extra"),
    [
        ("accelerate", "import eagle3_hub.training.train", "train"),
        ("datasets", "import eagle3_hub.training.data", "train"),
        ("gradio", "from eagle3_hub.demo import build_app, pair_cache; build_app(pair_cache())", "demo"),
        ("matplotlib", "from eagle3_hub.benchmark.report import plot_chart; plot_chart({'results': []}, 'x.png')", "bench"),
    ],
)
def test_a_missing_extra_is_one_line_that_names_it(blocked, code, extra):
    probe = f"import sys\nsys.modules[{blocked!r}] = None\n{code}\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("eagle3_hub.extras.MissingExtra:"), done.stderr[-2000:]
    assert f"'{blocked}'" in last and f"pip install 'eagle3-hub[{extra}]'" in last


def test_the_cli_says_which_extra_to_install_in_one_line(tmp_path):
    probe = (
        "import sys\nsys.modules['accelerate'] = None\nfrom eagle3_hub.cli import main\n"
        f"sys.exit(main(['train', '--config', {str(tmp_path / 'recipe.yaml')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr.startswith("eagle3-hub train: error: training") and "eagle3-hub[train]" in done.stderr
