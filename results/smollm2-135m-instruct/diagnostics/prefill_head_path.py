"""Session 18: two CPU costs behind tree decoding's prefill and acceptance (python results/smollm2-135m-instruct/diagnostics/prefill_head_path.py).

1. SmolLM2's head (49,152 x 576) on the last row of a prompt's hidden states, as transformers hands it over
   (``hidden[:, -1:]``, a (1, 1, H) view whose batch stride is the prompt's), against the same row copied fresh.
   The view takes torch's bmm path, which copies the whole head; a tree-decoding prefill paid it twice (the model's
   own logits and the check that the head alone gives them), hence ``_head_verdicts`` in tree_decoding.py.
2. argmax over 12 rows of bf16 logits, directly and through float32 (``_argmax``), with the same indices.

Median of 9 runs (51 for argmax) after 3 warm-up calls, 2 threads, in the dtype ``--dtype auto`` picks on this CPU.
"""

import json

import torch
import torch.nn.functional as F
from lm_head_kernels import median_ms  # this folder's timer (3 warm-up calls, then the median)

from eagle3_hub.targets import default_dtype, load_target

torch.set_num_threads(2)
dtype = default_dtype("cpu")
target, _ = load_target(None, dtype=dtype)
head = target.get_output_embeddings()


hidden = torch.randn(1, 120, head.in_features, dtype=dtype)  # a 120-token prompt's final hidden states
view = hidden[:, -1:]
fresh = view.clone(memory_format=torch.contiguous_format)
with torch.no_grad():
    result = {
        "dtype": str(dtype),
        "same_logits_both_paths": torch.equal(head(view), head(fresh)),
        "head_on_prompt_slice_ms": round(median_ms(lambda: head(view), reps=9), 2),
        "head_on_fresh_row_ms": round(median_ms(lambda: head(fresh), reps=9), 2),
        "slice_strides": list(view.stride()),
    }
    logits = F.linear(torch.randn(1, 12, head.in_features, dtype=dtype), head.weight)
    assert torch.equal(logits.argmax(-1), logits.float().argmax(-1))
    result["argmax_12_rows_ms"] = round(median_ms(lambda: logits.argmax(-1), reps=51), 2)
    result["argmax_12_rows_via_float32_ms"] = round(median_ms(lambda: logits.float().argmax(-1), reps=51), 2)
print(json.dumps(result, indent=1))
