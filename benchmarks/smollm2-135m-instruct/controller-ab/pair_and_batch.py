"""The pair and the batch both controller-ab scripts run: SmolLM2 with its shipped draft in bfloat16, and the first
``batch_size`` questions of a suite as left-padded chat prompts (first turns)."""

import json

import torch

from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.targets import load_target


def pair_and_batch(suite: str, batch_size: int):
    """(target, draft, encoded batch); a suite with fewer questions than ``batch_size`` is an error."""
    questions = [json.loads(line) for line in open(suite)]
    if len(questions) < batch_size:
        raise SystemExit(f"{suite} holds {len(questions)} questions, fewer than --batch-size {batch_size}")
    target, tok = load_target(None, dtype="bfloat16")
    draft = Eagle3DraftModel.from_pretrained("eagle3_hub/reference_draft/smollm2-135m-instruct",
                                             torch_dtype=torch.bfloat16)
    texts = [tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=False,
                                     add_generation_prompt=True) for q in questions[:batch_size]]
    tok.padding_side = "left"
    return target, draft, tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
