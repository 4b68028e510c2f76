"""The target's output head never gets a strided (b, 1, H) slice of a batch's hidden states.

For a frozen head, torch multiplies a strided 3D input by a batched product that copies the head's weight once per
row: seconds per call for Gemma-3's 262k-token head, in every batched prefill that asks for the last slot's logits
with ``logits_to_keep=1``. Tree decoding's prefill, the training features and the data's plain generation hand the
head contiguous rows (or ask for no logits at all).
"""

from __future__ import annotations

import torch
from datasets import Dataset
from tiny_models import left_padded, make_tiny_target

from eagle3_hub.generation.tree.same_forward import same_forward_generate
from eagle3_hub.targets import load_target
from eagle3_hub.training.features import aux_features
from eagle3_hub.training.generation import regenerate


def head_inputs(target) -> list[bool]:
    """Whether each input the head multiplies (after any pre-hook) is contiguous, recorded from now on."""
    seen: list[bool] = []
    target.get_output_embeddings().register_forward_hook(lambda _, args, __: seen.append(args[0].is_contiguous()))
    return seen


def batch_of_two(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return left_padded([torch.randint(3, vocab, (9,)), torch.randint(3, vocab, (5,))])


def test_tree_decodings_prefill_gives_the_head_contiguous_rows():
    target = make_tiny_target("gemma3_text")
    ids, mask = batch_of_two(target.config.vocab_size)
    seen = head_inputs(target)
    same_forward_generate(target, ids, 4, attention_mask=mask, pad_token_id=0)
    assert seen and all(seen)


def test_training_features_give_the_head_contiguous_rows():
    target = make_tiny_target("llama")
    ids, mask = batch_of_two(target.config.vocab_size)
    seen = head_inputs(target)
    aux, scores = aux_features(target, ids, mask, [0, 1, 2], draft_ids=torch.arange(64))
    assert aux.shape[:2] == ids.shape and scores.draft.shape == (*ids.shape, 64)
    assert seen and all(seen)


def test_plain_generation_of_training_data_gives_the_head_contiguous_rows(tiny_target_dir, tmp_path):
    target, tok = load_target(str(tiny_target_dir), dtype=torch.float32)
    ds = Dataset.from_list(
        [
            {"messages": [{"role": "user", "content": "Hi"}]},
            {"messages": [{"role": "user", "content": "Name three rivers that cross a border."}]},
        ]
    )
    seen = head_inputs(target)
    regenerate(ds, target, tok, tmp_path / "regen.jsonl", max_new_tokens=3, batch_size=2)
    assert seen and all(seen)
