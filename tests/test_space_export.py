"""``eagle3-hub demo --export-space DIR``: a Space folder that needs nothing but PyPI and itself, checked by
installing it into a fresh virtual environment offline."""

from __future__ import annotations

import json
import os
import site
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

from eagle3_hub import cli
from eagle3_hub.space import source_root, wheel_requirements

pytestmark = pytest.mark.skipif(source_root() is None, reason="needs the source tree (pyproject.toml, spaces/)")


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    dest = tmp_path_factory.mktemp("export") / "space"
    assert cli.main(["demo", "--export-space", str(dest)]) == 0
    return dest


@pytest.mark.slow
def test_export_writes_a_self_sufficient_folder(space):
    names = sorted(p.name for p in space.iterdir())
    (wheel,) = [n for n in names if n.endswith(".whl")]
    assert {"app.py", "README.md", "pairs.yaml", "requirements.txt"} <= set(names)
    assert not [n for n in names if n.startswith(".")]  # no temporary leftovers
    with zipfile.ZipFile(space / wheel) as zf:
        inside = set(zf.namelist())
    # the package with what the demo loads at run time: the reference draft and the bundled questions
    assert "eagle3_hub/demo/racing.py" in inside and "eagle3_hub/commands/demo.py" in inside
    assert "eagle3_hub/reference_draft/smollm2-135m-instruct/model.safetensors" in inside
    assert "eagle3_hub/benchmark/data/mt_bench.jsonl" in inside
    # requirements: the wheel's dependencies from PyPI, no guessed URL, no line the Space builder cannot resolve
    lines = [line for line in (space / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert lines == [r for r in wheel_requirements(space / wheel) if not r.startswith("gradio")]
    assert any(line.startswith("torch") for line in lines) and not any("git+" in line or ".whl" in line for line in lines)
    front = (space / "README.md").read_text().split("---")[1]
    assert "sdk: gradio" in front and "app_file: app.py" in front


@pytest.mark.slow
def test_the_folder_installs_into_a_fresh_venv_offline(space, tmp_path):
    """A fresh venv (no system site-packages); the bundled wheel goes in through app.py's own start-up step with
    --no-index; the third-party dependencies come from this environment's site-packages through a path file (the
    only way offline), which holds no eagle3_hub: the package imported must be the wheel's copy."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    fresh_site = Path(
        subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    )
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (fresh_site / "zz_offline_deps.pth").write_text("".join(p + "\n" for p in deps))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1", SPACE_ID="test/space")
    probe = (
        "import importlib.util, json, runpy, sys\n"
        "before = importlib.util.find_spec('eagle3_hub')\n"
        "runpy.run_path('app.py', run_name='space_app')\n"  # the start-up step: installs the bundled wheel
        "import eagle3_hub, eagle3_hub.demo\n"
        "from eagle3_hub.targets import reference_draft\n"
        "print(json.dumps({'before': before is not None, 'file': eagle3_hub.__file__, 'prefix': sys.prefix,"
        " 'draft': (reference_draft() / 'config.json').is_file(), 'build_app': callable(eagle3_hub.demo.build_app)}))\n"
    )
    done = subprocess.run([str(py), "-c", probe], cwd=space, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] is False  # nothing of the source tree or the dev install leaked in
    assert result["file"].startswith(str(env_dir)) and result["draft"] and result["build_app"]
