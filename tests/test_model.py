"""Eagle3DraftModel: forward contract, caching, vocabulary maps, sizing from targets of every architecture,
save/reload, embedding sharing, and one round trip on the real SmolLM2 target."""

from __future__ import annotations

import pytest
import torch
from engine_spec import sglang_problems, vllm_problems
from safetensors.torch import load_file
from test_formats import inputs_for, logits_of, randomized_draft
from tiny_models import make_tiny_target

from eagle3_hub import Eagle3DraftModel


@pytest.fixture(scope="module")
def target():
    return make_tiny_target("llama")


@pytest.fixture(scope="module")
def draft(target):
    return randomized_draft(target)


# ------------------------------------------------------------------------------ forward contract
def test_forward_shapes(draft):
    ids, feats = inputs_for(draft, length=5)
    out = draft(input_ids=ids, target_hidden_states=feats)
    assert out.logits.shape == (2, 5, 200)  # draft vocabulary
    assert out.hidden_states.shape == (2, 5, 64)  # pre-norm, feeds the next step
    assert draft(input_ids=ids, target_hidden_states=feats, logits_to_keep=1).logits.shape == (2, 1, 200)
    keep = torch.tensor([[True, False, True, False, False], [False, False, False, True, True]])
    kept = draft(input_ids=ids, target_hidden_states=feats, logits_to_keep=keep)  # training: scored positions only
    torch.testing.assert_close(kept.logits, out.logits[keep])
    torch.testing.assert_close(kept.hidden_states, out.hidden_states)
    # the next draft step reads the previous output directly (no fc)
    step = draft(input_ids=ids[:, -1:], hidden_states=out.hidden_states[:, -1:], position_ids=torch.full((2, 1), 5))
    assert step.logits.shape == (2, 1, 200)


def test_fused_feature_path_equals_raw_feature_path(draft):
    ids, feats = inputs_for(draft)
    with torch.no_grad():
        a = draft(input_ids=ids, target_hidden_states=feats).logits
        b = draft(input_ids=ids, hidden_states=draft.fuse(feats)).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_feature_inputs_are_checked(draft):
    ids, feats = inputs_for(draft)
    with pytest.raises(ValueError, match="exactly one of"):
        draft(input_ids=ids)
    with pytest.raises(ValueError, match="exactly one of"):
        draft(input_ids=ids, target_hidden_states=feats, hidden_states=feats[..., :64])
    with pytest.raises(ValueError, match=r"width 128.*3 \* target_hidden_size = 192"):
        draft(input_ids=ids, target_hidden_states=feats[..., :128])


@torch.no_grad()
def test_cached_steps_match_one_full_forward(draft):
    ids, feats = inputs_for(draft, length=7)
    full = draft(input_ids=ids, target_hidden_states=feats).logits
    first = draft(input_ids=ids[:, :4], target_hidden_states=feats[:, :4], use_cache=True)
    cache = first.cache
    rest = draft(input_ids=ids[:, 4:6], target_hidden_states=feats[:, 4:6], cache=cache, use_cache=True)
    last = draft(input_ids=ids[:, 6:], target_hidden_states=feats[:, 6:], cache=rest.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits, last.logits], 1), full, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_explicit_causal_mask_equals_default(draft):
    ids, feats = inputs_for(draft, length=6)
    mask = torch.full((6, 6), float("-inf")).triu(1)[None, None].expand(2, 1, 6, 6)
    torch.testing.assert_close(
        draft(input_ids=ids, target_hidden_states=feats, attention_mask=mask).logits,
        draft(input_ids=ids, target_hidden_states=feats).logits,
        rtol=1e-5,
        atol=1e-5,
    )


def test_vocabulary_maps(target):
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=4)
    assert torch.equal(draft.draft_to_target_ids(torch.arange(4)), torch.arange(4))  # identity until set
    draft.set_vocab_mapping(torch.tensor([3, 10, 42, 255]))
    assert draft.d2t.tolist() == [3, 9, 40, 252]  # offsets: target id = i + d2t[i]
    assert torch.equal(draft.draft_to_target_ids(torch.tensor([[0, 3], [2, 1]])), torch.tensor([[3, 255], [42, 10]]))
    assert draft.t2d.nonzero().flatten().tolist() == [3, 10, 42, 255]
    with pytest.raises(ValueError, match="got 3 ids for a draft vocabulary of 4"):
        draft.set_vocab_mapping(torch.tensor([1, 2, 3]))


# ------------------------------------------------------------------------------ sizing, save, reload
def test_draft_for_each_architecture_saves_and_reloads(tiny_target, tmp_path):
    target = tiny_target
    text = target.config.get_text_config()
    draft = randomized_draft(target, draft_vocab_size=128, seed=5)
    c = draft.config
    assert (c.hidden_size, c.target_hidden_size, c.vocab_size) == (text.hidden_size, text.hidden_size, text.vocab_size)
    assert c.num_attention_heads == text.num_attention_heads
    assert c.num_key_value_heads == text.num_key_value_heads
    assert c.head_dim == (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    assert (c.target_num_hidden_layers, c.target_model_type) == (4, text.model_type)
    assert c.hidden_act == "silu"  # the draft is a Llama layer whatever the target's MLP
    assert torch.equal(draft.embed_tokens.weight, target.get_input_embeddings().weight)

    draft.save_pretrained(tmp_path)
    assert vllm_problems(tmp_path, 4, trust_remote_code=True) == []
    assert sglang_problems(tmp_path, 4, trust_remote_code=True) == []
    reloaded = Eagle3DraftModel.from_pretrained(tmp_path, target=target)
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(logits_of(reloaded, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    real = torch.cat([out.hidden_states[i + 1] for i in c.aux_layer_ids], -1)  # features from the target itself
    torch.testing.assert_close(logits_of(reloaded, ids, real), logits_of(draft, ids, real), rtol=0, atol=0)


def test_aux_layer_ids_out_of_range(target):
    with pytest.raises(ValueError, match=r"aux_layer_ids \[0, 1, 4\] out of range.*4 decoder layers.*0..3"):
        Eagle3DraftModel.from_target(target, aux_layer_ids=[0, 1, 4])
    with pytest.raises(ValueError, match="exactly 3 target layers"):
        Eagle3DraftModel.from_target(target, aux_layer_ids=[0, 1])


def test_draft_saved_without_embedding_uses_the_targets(target, draft, tmp_path):
    draft.save_pretrained(tmp_path, save_embeddings=False)
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "model.safetensors"))
    alone = Eagle3DraftModel.from_pretrained(tmp_path)
    ids, feats = inputs_for(draft)
    with pytest.raises(RuntimeError, match="without `embed_tokens.weight`.*bind"):
        alone(input_ids=ids, target_hidden_states=feats)
    bound = Eagle3DraftModel.from_pretrained(tmp_path, target=target)
    assert torch.equal(bound.embed_tokens.weight, target.get_input_embeddings().weight)
    torch.testing.assert_close(logits_of(bound, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)
    # bound drafts save without the embedding again (it is the target's)
    bound.save_pretrained(tmp_path / "again")
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "again" / "model.safetensors"))


# ------------------------------------------------------------------------------ real target
def test_smollm2_draft_round_trip(tmp_path, smollm2):
    target, tokenizer = smollm2
    text = target.config.get_text_config()
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=4096)
    assert draft.config.aux_layer_ids == [1, text.num_hidden_layers // 2 - 1, text.num_hidden_layers - 4]
    draft.set_vocab_mapping(torch.arange(4096) * (text.vocab_size // 4096))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an untrained draft has all-ones norms: randomise them too
        for p in draft.parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    draft.save_pretrained(tmp_path / "draft", save_embeddings=False)  # as published: the target's embedding
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "draft" / "model.safetensors"))
    assert vllm_problems(tmp_path / "draft", text.num_hidden_layers, trust_remote_code=True) == []
    assert sglang_problems(tmp_path / "draft", text.num_hidden_layers, trust_remote_code=True) == []

    reloaded = Eagle3DraftModel.from_pretrained(tmp_path / "draft", target=target)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hidden[i + 1] for i in draft.config.aux_layer_ids], -1)
    torch.testing.assert_close(logits_of(reloaded, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)
    reloaded.unbind()
