"""Which model's assisted generation is calling a draft: eagle3-hub's one look at the call stack.

``target.generate(ids, assistant_model=draft)`` hands the assistant no reference to ``target``, yet a draft
reads that target's features. The caller says which target by binding the draft (``draft.bind(target)``,
``Eagle3DraftModel.from_pretrained(path, target=target)``); a draft nobody bound looks here once, on its first
call, and binds itself to the model found. transformers' assisted decoding loop is then a few frames up the
stack: its frame is recognised by its code object (``GenerationMixin._assisted_decoding``, not a name) and by
its ``assistant_model`` being this very draft, so nothing else is ever taken for the target. When transformers
renames or restructures that loop, nothing is found and the draft asks to be bound
(``tests/test_reliability.py`` checks both).
"""

from __future__ import annotations

import inspect
import sys

import torch
from transformers.generation.utils import GenerationMixin

MAX_DEPTH = 12  # frames between the assisted decoding loop and the draft's generate (the candidate generator)


def assisting_model(draft, max_depth: int = MAX_DEPTH) -> torch.nn.Module | None:
    """The model whose ``generate(..., assistant_model=draft)`` is running in this thread's call stack, or None."""
    code = inspect.unwrap(GenerationMixin._assisted_decoding).__code__
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        if frame.f_code is code and frame.f_locals.get("assistant_model") is draft:
            model = frame.f_locals.get("self")
            return model if isinstance(model, torch.nn.Module) else None
        frame = frame.f_back
    return None
