#!/usr/bin/env bash
# Tree-shape sweep behind the CPU defaults (TREE_DEFAULTS["cpu"]): the shipped draft on the LAST two MT-bench
# questions (sweep_questions.jsonl), first turns, 128 new tokens, so the shapes are not tuned on the questions
# that run_bench.sh measures (the first ones of each suite). ~7 min on the 2-core CPU.
# Session 4 (default OpenMP wait policy: 4-16 verified tokens cost about the same): depth 2-3, wider trees.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=2
unset OMP_WAIT_POLICY  # PASSIVE makes a multi-token forward ~1.7x slower here (diagnostics/omp_wait_policy.sh)
eagle3-hub bench --suite results/smollm2-135m-instruct/sweep_questions.jsonl --max-turns 1 --max-new-tokens 128 \
  --methods plain,tree --sweep --depth 2,3 --tree-top-k 4,6 --total-tokens 8,12,16 \
  --out results/smollm2-135m-instruct/sweep "$@"
