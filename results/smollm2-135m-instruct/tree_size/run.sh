#!/usr/bin/env bash
# Tree size against acceptance and speed in bfloat16 (session 17): 16 MT-bench first turns (questions 6-7 of each
# category: none of the 40 the float32 A/Bs score), plain greedy in the same run. DRAFT: the draft folder.
set -euo pipefail
DRAFT=${1:?usage: run.sh DRAFT [OUT]}
OUT=${2:-results/smollm2-135m-instruct/tree_size/run_a}
eagle3-hub bench --draft "$DRAFT" --suite results/smollm2-135m-instruct/tree_size/questions.jsonl --max-turns 1 \
  --methods plain,tree --no-float32-check --out "$OUT" \
  --trees 'depth=3,tree_top_k=8,total_tokens=6;depth=4,tree_top_k=8,total_tokens=10;depth=5,tree_top_k=8,total_tokens=16;depth=6,tree_top_k=10,total_tokens=24;depth=6,tree_top_k=10,total_tokens=32;depth=6,tree_top_k=10,total_tokens=60'
