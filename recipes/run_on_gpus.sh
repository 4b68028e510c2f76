#!/usr/bin/env bash
# A draft for a Hub target trained on the GPUs of one machine (FSDP2), exported for vLLM, and served by vLLM next to
# its plain decoding, with vLLM's acceptance beside ours on the same prompts.
#
#   bash recipes/run_on_gpus.sh RECIPE [NUM_GPUS]        e.g. recipes/llama-3.1-8b-instruct.yaml 8
#
# Rerun the same command after an interruption: training resumes from its last checkpoint (--resume), a finished
# step is skipped. Needs `pip install -e ".[train]"` and, for step 3, vLLM with EAGLE-3 (VLLM_PYTHON: its python,
# default this one). Run on CPUs only (2 processes, gloo, tests/test_training_fsdp.py; vLLM's CPU build,
# tests/engines/test_vllm_serving.py); on GPUs it is the same code, not yet run there.
set -euo pipefail
RECIPE=${1:?usage: bash recipes/run_on_gpus.sh RECIPE [NUM_GPUS]}
GPUS=${2:-$(python -c "import torch; print(torch.cuda.device_count())")}
VLLM_PYTHON=${VLLM_PYTHON:-python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
read -r TARGET WORK OUT < <(python - "$RECIPE" <<'PY'
import sys
from eagle3_hub.training.recipe import load_recipe
r = load_recipe(sys.argv[1])
print(r["target"]["name"] or "smollm2-135m-instruct", r["work_dir"], r["output_dir"])
PY
)

# 1. train: accelerate's FSDP2 (the draft sharded per decoder layer, the frozen target on every GPU)
if [ ! -f "$OUT/config.json" ]; then
  RESUME=(); [ -d "$WORK/checkpoints" ] && RESUME=(--resume)
  accelerate launch --config_file "$HERE/recipes/accelerate/fsdp.yaml" --num_processes "$GPUS" \
    -m eagle3_hub.commands.train --config "$RECIPE" "${RESUME[@]}"
fi

# 2. export: vLLM's speculators layout, naming its target (`vllm serve "$OUT-vllm"` finds the target by itself)
[ -f "$OUT-vllm/config.json" ] || eagle3-hub convert "$OUT" "$OUT-vllm" --to vllm --verifier "$TARGET"

# 3. vLLM greedy with and without the draft (a chain of 3) on 8 MT-bench first turns, and ours on the same prompts
python "$HERE/tests/engines/vllm_vs_ours.py" --vllm-python "$VLLM_PYTHON" --target "$TARGET" --draft "$OUT" \
  --layout vllm --k 3 --max-tokens 128 --prompts 8 --dtype bfloat16 --out "$OUT-vllm-check"
echo "serve it: vllm serve $OUT-vllm   (or: vllm serve $TARGET --speculative-config '{\"method\": \"eagle3\", \"model\": \"$OUT-vllm\", \"num_speculative_tokens\": 3}')"
