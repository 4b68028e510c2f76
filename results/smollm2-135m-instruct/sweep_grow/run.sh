#!/usr/bin/env bash
# grow_min_prob sweep (session 14): deep trees where the draft is sure, shallow ones where it is not. Stage-9 draft,
# bf16 target, greedy, 256 new tokens, on 12 of the 32 prompts held out from stage 9's training (the target's own
# seed-8 prompts, heldout_seed8_questions.jsonl: no draft has trained on them, and they are not benchmark questions),
# plain `generate` in the same run. ~15 min per run on the 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=2
unset OMP_WAIT_POLICY
here=results/smollm2-135m-instruct/sweep_grow
run=${1:-run_a}
case "$run" in
  run_a) grid=(--depth 3,6,8 --tree-top-k 8 --total-tokens 6 --min-node-prob 0 --grow-min-prob 0,0.25,0.4) ;;
  *) echo "unknown run $run" >&2; exit 2 ;;
esac
eagle3-hub bench --dtype bfloat16 --suite "$here/heldout_seed8_questions.jsonl" --num-questions 12 --max-turns 1 \
  --max-new-tokens 256 --methods plain,tree --sweep "${grid[@]}" --out "$here/$run"
