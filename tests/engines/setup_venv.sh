#!/bin/bash
# The optional engines venv for tests/test_engines_loaders.py: vLLM 0.33.0 and SGLang 0.5.23 (--no-deps) next to
# the CPU torch 2.13 build, with only the modules their imported code needs. ~2.5 GB, a few minutes with a pip cache.
set -euo pipefail
VENV=${ENGINES_VENV:-/work/engines-venv}
WHEELS=${ENGINES_WHEELS:-/work/engines-wheels}   # vllm-0.33.0-*.whl, sglang-0.5.23-*.whl (else fetched from PyPI)
HERE=$(cd "$(dirname "$0")" && pwd)
PIN=$(mktemp); echo "torch==2.13.0" > "$PIN"   # never let a dependency pull the CUDA torch
python3 -m venv "$VENV"
PIP="$VENV/bin/pip install -q -c $PIN"
$PIP torch==2.13.0 transformers==5.19.0 numpy safetensors pytest pytest-timeout pyyaml tqdm accelerate datasets
ls "$WHEELS"/vllm-0.33.0-*.whl >/dev/null 2>&1 && ENG=("$WHEELS"/vllm-0.33.0-*.whl "$WHEELS"/sglang-0.5.23-*.whl) || ENG=(vllm==0.33.0 sglang==0.5.23)
$VENV/bin/pip install -q --no-deps "${ENG[@]}"
$PIP pyzmq urllib3 cbor2 aiohttp requests openai_harmony openai pillow pybase64 cachetools msgspec cloudpickle \
     uvloop py-cpuinfo prometheus_client fastapi partial_json_parser llguidance einops orjson xgrammar \
     IPython torchvision==0.28.0 sentencepiece compressed_tensors gguf
SP=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$HERE/torchvision_cpu_ops.py" "$SP/_eagle3_torchvision_cpu_ops.py"
echo "import _eagle3_torchvision_cpu_ops" > "$SP/_eagle3_torchvision_cpu_ops.pth"
"$VENV/bin/python" -c "import vllm.model_executor.models.llama_eagle3, sglang.srt.models.llama_eagle3" 2>/dev/null
echo "engines venv ready: PYTHONPATH=. $VENV/bin/python -m pytest tests/test_engines_loaders.py"
