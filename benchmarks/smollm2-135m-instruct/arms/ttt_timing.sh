#!/usr/bin/env bash
# Training tokens/s of the arms' recipe at ttt_steps 5, 2 and 1, 16 steps each, one after the other on an otherwise
# idle machine (the first 16 batches of the same data; evaluations and checkpoints left out of the time):
#   bash benchmarks/smollm2-135m-instruct/arms/ttt_timing.sh > benchmarks/smollm2-135m-instruct/arms/ttt-timing.log
set -euo pipefail
for t in 5 2 1; do
  work=runs/ttt-timing-$t
  rm -rf "$work"
  eagle3-hub train --config benchmarks/smollm2-135m-instruct/arms/ttt-2/recipe.yaml --train.ttt_steps "$t" \
    --train.max_steps 16 --train.eval_every 1000 --train.save_every 1000 --work_dir "$work" --output_dir "$work/draft" \
    >"$work.log" 2>&1
  python -c "
import json, sys
m = json.load(open('$work/draft/training_metrics.json'))['throughput']
print(f\"ttt_steps $t: {m['tokens']} tokens in {m['train_seconds']} s, {m['tokens_per_s']} tokens/s, \"
      f\"{m['model_flops_per_token'] / 1e6:.0f} MFLOP a token, {m['peak_share']:.1%} of the measured peak\")"
done
