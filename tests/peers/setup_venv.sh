#!/bin/bash
# The peers' side environment for tests/test_peers.py: speculators 0.9.0 (--no-deps) with the pins it declares
# (transformers<=5.19, datasets<=5.1, ...), next to the CPU torch 2.13 build. .ci/run builds it; rerun by hand with
#   bash tests/peers/setup_venv.sh
# The dependencies are named one by one: speculators' own metadata also asks for torchvision and torchaudio (never
# imported by the code the tests run), whose resolution would pull a CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PEERS_VENV:-.venv-peers}
PIN=$(mktemp); echo "torch==2.13.0" > "$PIN"   # never let a dependency replace the CPU torch
python3 -m venv "$VENV"
PIP="$VENV/bin/pip install -q -c $PIN"
$PIP torch==2.13.0
$PIP transformers==5.19.0 "datasets>=4,<=5.1.0" "numpy>=2,<=2.5.4" "tqdm>=4.66.3,<=4.70.1" "loguru>=0.7.2,<=0.7.3" \
     "pydantic>=2" "pydantic-settings>=2" "typer>=0.12" rich click safetensors huggingface-hub psutil protobuf httpx \
     "openai>=2" aiohttp hs-connectors==0.9.0
$VENV/bin/pip install -q --no-deps speculators==0.9.0
"$VENV/bin/python" -c "import speculators, transformers, torch; print('peers venv ready: speculators', speculators.__version__ if hasattr(speculators, '__version__') else '0.9.0', '| transformers', transformers.__version__, '| torch', torch.__version__)"
