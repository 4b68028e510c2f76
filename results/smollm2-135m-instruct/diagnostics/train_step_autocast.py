"""One TTT training step (forward + backward, 5 steps, batch 4 x 320 tokens) of the reference draft on random
features: float32 against bf16 autocast, on this CPU. Median of 5 after 2 warm-ups.

    python results/smollm2-135m-instruct/diagnostics/train_step_autocast.py
"""
import statistics
import time

import torch

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.targets import cpu_has_bf16_units, load_target
from eagle3_hub.training.ttt import ttt_loss

torch.set_num_threads(2)
torch.manual_seed(0)
target, _ = load_target(None, dtype="float32")
draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct", target=target).float()
cfg = draft.config
b, s, V = 4, 320, cfg.vocab_size
aux = torch.randn(b, s, 3 * cfg.hidden_size)
ids = torch.randint(0, V, (b, s))
logits = torch.randn(b, s, V) * 4
loss_mask = torch.ones(b, s, dtype=torch.long)
print(f"cpu bf16 units: {cpu_has_bf16_units()}")
for name, ctx in [("float32", lambda: torch.autocast("cpu", enabled=False)),
                  ("bf16 autocast", lambda: torch.autocast("cpu", dtype=torch.bfloat16))]:
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        with ctx():
            out = ttt_loss(draft, aux, ids, logits, loss_mask, ttt_steps=5)
        out.loss.backward()
        draft.zero_grad()
        times.append(time.perf_counter() - t0)
    print(f"{name}: {statistics.median(times[2:]) * 1000:.0f} ms per step, loss {out.loss.item():.3f}")
