#!/usr/bin/env bash
# The benchmark behind the reference draft's card (2-core CPU, greedy, --dtype auto: bfloat16 on a CPU with bf16
# units, float32 on others): the three suites of the quality goal, first turns, 256 new tokens, plain vs assisted vs
# tree in one run. ~6 min in bf16, ~12 in float32.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=2
unset OMP_WAIT_POLICY  # PASSIVE makes a multi-token forward ~1.7x slower here (diagnostics/omp_wait_policy.sh)
eagle3-hub bench --suite mt_bench,humaneval,gsm8k --bench-dir "${BENCH_DIR:-../shared/benchmarks}" --num-questions 3 \
  --max-turns 1 --max-new-tokens 256 --methods plain,assisted,tree --out results/smollm2-135m-instruct/bench "$@"
