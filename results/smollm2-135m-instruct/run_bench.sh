#!/usr/bin/env bash
# The benchmark behind the reference draft's card (2-core CPU, float32). Takes ~5 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
eagle3-hub bench --suite mt_bench,humaneval,gsm8k --bench-dir "${BENCH_DIR:-../shared/benchmarks}" --num-questions 1 \
  --max-new-tokens 128 --methods plain,assisted,tree --out results/smollm2-135m-instruct/bench "$@"
