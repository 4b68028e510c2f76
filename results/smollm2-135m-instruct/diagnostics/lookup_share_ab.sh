#!/usr/bin/env bash
# A/B of the lookup branch's chain length (session 7): the three suites, 3 questions each, first turns, 256 new
# tokens, greedy fp32, stage-5 draft, tree 3/4/8, plain measured in each run.
#   after:  this checkout, LOOKUP_SHARE (3-token match: lookup_tokens, 2-token: 30%, 1-token: 15%), lookup 10 and 20
#   before: commit d765564 (every match proposes lookup_tokens = 10), from a temporary git worktree
# Results: results/smollm2-135m-instruct/bench_lookup_share/{after,before}/. ~15 min on an idle machine.
# REVERSED=1: the old commit first, then this checkout with lookup 20 only, into {before,after}_run2/ (the machine
# drifts by ~10% within minutes: the second run in the other order).
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=2
unset OMP_WAIT_POLICY
OUT=results/smollm2-135m-instruct/bench_lookup_share
COMMON=(--suite mt_bench,humaneval,gsm8k --bench-dir "${BENCH_DIR:-../shared/benchmarks}" --num-questions 3 --max-turns 1
        --max-new-tokens 256 --sweep --depth 3 --tree-top-k 4 --total-tokens 8
        --draft "$PWD/eagle3_hub/reference_draft/smollm2-135m-instruct")
OLD=$(mktemp -d)/before
git worktree add --detach "$OLD" d765564 >/dev/null
trap 'git worktree remove --force "$OLD"' EXIT
if [[ "${REVERSED:-0}" == 1 ]]; then
  PYTHONPATH="$OLD" eagle3-hub bench "${COMMON[@]}" --methods plain,tree --tree-lookup-tokens 10 --out "$OUT/before_run2"
  eagle3-hub bench "${COMMON[@]}" --methods plain,tree --tree-lookup-tokens 20 --out "$OUT/after_run2"
else
  eagle3-hub bench "${COMMON[@]}" --methods plain,tree --tree-lookup-tokens 10,20 --out "$OUT/after"
  PYTHONPATH="$OLD" eagle3-hub bench "${COMMON[@]}" --methods plain,tree --tree-lookup-tokens 10 --out "$OUT/before"
fi
