#!/usr/bin/env bash
# forward_cost.py under each OpenMP wait policy. PASSIVE (threads sleep between parallel regions) makes a
# multi-token forward ~1.7x slower on this 2-core CPU, a one-token forward ~1.2x: it penalises verification far
# more than plain decoding. The benchmark scripts ran with it until session 4; they now keep the default.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for policy in default PASSIVE ACTIVE; do
  echo "== OMP_WAIT_POLICY=$policy"
  if [ "$policy" = default ]; then env -u OMP_WAIT_POLICY OMP_NUM_THREADS=2 python results/smollm2-135m-instruct/diagnostics/forward_cost.py
  else OMP_NUM_THREADS=2 OMP_WAIT_POLICY=$policy python results/smollm2-135m-instruct/diagnostics/forward_cost.py; fi
done
