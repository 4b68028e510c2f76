#!/usr/bin/env bash
# The CUDA check behind benchmarks/cuda-h200/ (one GPU), run from the repository root:
#   bash benchmarks/cuda-h200/run_check.sh         # writes into $OUT or ./cuda-check
# Needs torch, transformers, pytest and scipy; the package runs from the checkout (PYTHONPATH), no install needed.
# 1. the CUDA tests (tree decoding: greedy = plain greedy with and without the draft's CUDA graph, batches,
#    bf16, sampling; assisted generation); 2. a random ~1B Llama target: float32 lossless (256 new tokens, three
#    prompts and a left-padded batch), bf16 agreement, target forward cost by tokens verified; 3. bf16 timing
#    (128 new tokens, 2 prompts) of plain / assisted / tree decoding variants (benchmarks/README.md).
# Dry run on a CPU: SIZE=tiny DEVICE=cpu bash benchmarks/cuda-h200/run_check.sh
set -uo pipefail
out=${OUT:-cuda-check}
size=${SIZE:-1b}
device=${DEVICE:-cuda}
mkdir -p "$out/lossless" "$out/timing"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=$(command -v python3 || command -v python)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  "$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"
if [ "$device" = cuda ]; then
  timeout 240 "$py" -m pytest -q -p no:cacheprovider tests -k cuda -rfEp \
    >"$out/pytest_cuda.log" 2>&1
  tail -12 "$out/pytest_cuda.log"
fi
timeout 240 "$py" -m eagle3_hub.commands.random_target --size "$size" --device "$device" --new-tokens 256 \
  --phases lossless,bf16,forward --out "$out/lossless" 2>&1 | grep -v Warning | tee "$out/lossless/log.txt"
timeout 300 "$py" -m eagle3_hub.commands.random_target --size "$size" --device "$device" --new-tokens 128 \
  --prompts 2 --phases timing --out "$out/timing" 2>&1 | grep -v Warning | tee "$out/timing/log.txt"
