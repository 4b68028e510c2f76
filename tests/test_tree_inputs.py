"""Bad inputs to the public tree decoding API: one clear ValueError each, naming the value and the fix."""

from __future__ import annotations

import pytest
import torch
from test_tree_decoding import copy_draft, prompt, random_draft
from tiny_models import make_tiny_target

import eagle3_hub


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_target("llama")
    return target, copy_draft(target)


def test_max_new_tokens_none_or_negative(pair):
    target, draft = pair
    for bad in (None, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"max_new_tokens must be a non-negative integer, got {bad!r}: e\.g\."):
            eagle3_hub.generate(target, draft, prompt(), max_new_tokens=bad)


def test_empty_batches(pair):
    target, draft = pair
    for ids in (torch.zeros(0, 5, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"batch >= 1 and prompt_len >= 1, got shape .*at least one non-empty"):
            eagle3_hub.generate(target, draft, ids, max_new_tokens=4)


def test_no_target(pair):
    _, draft = pair
    with pytest.raises(ValueError, match="target must be a transformers causal LM .*got NoneType"):
        eagle3_hub.generate(None, draft, prompt(), max_new_tokens=4)


def test_input_ids_as_a_list_or_floats(pair):
    target, draft = pair
    with pytest.raises(ValueError, match=r"input_ids must be a tensor of token ids .*got list: use tokenizer"):
        eagle3_hub.generate(target, draft, [[5, 6, 7]], max_new_tokens=4)
    with pytest.raises(ValueError, match="input_ids must hold integer token ids, got dtype torch.float32"):
        eagle3_hub.generate(target, draft, prompt().float(), max_new_tokens=4)


def test_drafts_that_do_not_fit(pair):
    target, draft = pair
    other = make_tiny_target("llama", hidden_size=32, intermediate_size=64)
    with pytest.raises(ValueError, match="does not fit the target.*Use a draft trained for this"):
        eagle3_hub.generate(target, copy_draft(other), prompt(), max_new_tokens=4)
    bad_map = random_draft(target, draft_vocab_size=64)
    with torch.no_grad():
        bad_map.d2t.fill_(1000)  # draft ids sent past the target's 256 tokens (an IndexError at decode time before)
    with pytest.raises(ValueError, match="does not fit the target.*d2t"):
        eagle3_hub.generate(target, bad_map, prompt(), max_new_tokens=4)
    with pytest.raises(ValueError, match="must be an EAGLE-3 draft"):
        eagle3_hub.generate(target, other, prompt(), max_new_tokens=4)
