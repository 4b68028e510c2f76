"""EAGLE 3.1 drafts (``fc_norm``: an RMSNorm per target feature before ``fc``; ``norm_output``: the next draft step
reads norm(h)) and ``norm_before_fc``: the model, its engine exports, ``convert`` round trips, tree decoding and
``assistant_model=``, on tiny random configs."""

from __future__ import annotations

import json

import pytest
import torch
from engine_spec import sglang_problems, vllm_problems
from safetensors.torch import load_file, save_file
from test_formats import AUX, convert_cli, inputs_for, randomized_draft, write_foreign
from tiny_models import make_tiny_target

from eagle3_hub import Eagle3DraftModel, formats, generate


@torch.no_grad()
def two_steps(draft, ids, feats):
    """Logits of a step from target features and of the next step from the draft's own output (the feedback)."""
    first = draft(input_ids=ids, target_hidden_states=feats)
    second = draft(input_ids=ids, hidden_states=first.hidden_states, position_ids=torch.arange(1, ids.shape[1] + 1).expand(2, -1))
    return torch.cat([first.logits, second.logits], dim=1)


@pytest.fixture(scope="module")
def target():
    return make_tiny_target("llama")


@pytest.fixture(scope="module")
def draft31(target):
    return randomized_draft(target, fc_norm=True, norm_output=True)


def test_eagle31_forward_is_what_vllm_and_sglang_compute(draft31):
    """fc_norm: one RMSNorm per target feature, then fc; norm_output: the next step reads norm(h)."""
    ids, feats = inputs_for(draft31)
    assert [tuple(n.weight.shape) for n in draft31.fc_norm] == [(64,)] * 3 and draft31.input_norm is None
    with torch.no_grad():
        chunks = feats.chunk(3, dim=-1)
        fused = draft31.fc(torch.cat([norm(c) for norm, c in zip(draft31.fc_norm, chunks)], dim=-1))
        torch.testing.assert_close(draft31.fuse(feats), fused, rtol=0, atol=0)
        plain = Eagle3DraftModel(draft31.config.__class__(**{**draft31.config.to_dict(), "norm_output": False}))
        plain.load_state_dict(draft31.state_dict())
        first = draft31(input_ids=ids, target_hidden_states=feats)
        # the output stays pre-norm (logits = lm_head(norm(h))); the variant normalises it when fed back
        pos = torch.arange(1, 7).expand(2, -1)
        fed = draft31(input_ids=ids, hidden_states=first.hidden_states, position_ids=pos).logits
        by_hand = plain(input_ids=ids, hidden_states=draft31.norm(first.hidden_states), position_ids=pos).logits
    torch.testing.assert_close(fed, by_hand, rtol=0, atol=0)
    assert not torch.allclose(fed, plain(input_ids=ids, hidden_states=first.hidden_states, position_ids=pos).logits)


def test_norm_before_fc_is_one_norm_over_the_concatenated_features(target):
    draft = randomized_draft(target, norm_before_fc=True, seed=2)
    _, feats = inputs_for(draft)
    assert tuple(draft.input_norm.weight.shape) == (192,) and draft.fc_norm is None
    with torch.no_grad():
        torch.testing.assert_close(draft.fuse(feats), draft.fc(draft.input_norm(feats)), rtol=0, atol=0)


@pytest.mark.parametrize("to", ["ours", "vllm", "sglang"])
def test_eagle31_exports_meet_the_engines_and_round_trip(draft31, tmp_path, to):
    out = formats.export_draft(draft31, tmp_path / to, to=to, verifier="org/tiny-llama")
    config = json.loads((out / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True and config["norm_before_residual"] is False
    names = set(load_file(str(out / "model.safetensors")))
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= names
    assert vllm_problems(out, num_target_layers=4, trust_remote_code=True) == []
    if to != "vllm":
        assert sglang_problems(out, num_target_layers=4, trust_remote_code=True) == []
    reloaded = Eagle3DraftModel.from_pretrained(out)
    assert reloaded.config.fc_norm and reloaded.config.norm_output
    ids, feats = inputs_for(draft31)
    torch.testing.assert_close(two_steps(reloaded, ids, feats), two_steps(draft31, ids, feats), rtol=0, atol=0)


def test_eagle31_convert_round_trip_through_every_layout(draft31, tmp_path):
    src = formats.export_draft(draft31, tmp_path / "ours", to="ours")
    convert_cli(src, tmp_path / "vllm", "--to", "vllm", "--verifier", "org/tiny-llama")
    convert_cli(tmp_path / "vllm", tmp_path / "sglang", "--to", "sglang")
    convert_cli(tmp_path / "sglang", tmp_path / "back")
    back = Eagle3DraftModel.from_pretrained(tmp_path / "back")
    ids, feats = inputs_for(draft31)
    torch.testing.assert_close(two_steps(back, ids, feats), two_steps(draft31, ids, feats), rtol=0, atol=0)
    assert back.config.aux_layer_ids == AUX


def test_sglang_legacy_aux_norm_names_load(target, tmp_path):
    """SGLang reads `use_aux_norm` and tensors `aux_norm_{low,mid,high}` as fc_norm."""
    draft = randomized_draft(target, fc_norm=True, seed=4)
    folder = write_foreign(draft, tmp_path / "legacy", "specforge", with_embedding=True)
    state = load_file(str(folder / "model.safetensors"))
    for i, name in enumerate(("low", "mid", "high")):
        state[f"aux_norm_{name}.weight"] = state.pop(f"fc_norm.{i}.weight")
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["use_aux_norm"] = True
    (folder / "config.json").write_text(json.dumps(config))
    assert sglang_problems(folder, num_target_layers=4) == []
    loaded = Eagle3DraftModel.from_pretrained(folder)
    assert loaded.config.fc_norm
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(two_steps(loaded, ids, feats), two_steps(draft, ids, feats), rtol=0, atol=0)


def test_speculators_eagle31_folder_loads(draft31, tmp_path):
    folder = write_foreign(draft31, tmp_path / "spec", "speculators", with_embedding=True)
    config = json.loads((folder / "config.json").read_text())
    config.update(fc_norm=True, norm_output=True)
    (folder / "config.json").write_text(json.dumps(config))
    assert vllm_problems(folder, num_target_layers=4) == []
    loaded = Eagle3DraftModel.from_pretrained(folder)
    ids, feats = inputs_for(draft31)
    torch.testing.assert_close(two_steps(loaded, ids, feats), two_steps(draft31, ids, feats), rtol=0, atol=0)
    # a caller who knows better overrides a key of the file
    assert Eagle3DraftModel.from_pretrained(folder, norm_output=False).config.norm_output is False


def test_eagle31_draft_decodes_losslessly(target, draft31):
    """Tree decoding and transformers' assisted generation run the model's forward: float32 output equals greedy."""
    draft = randomized_draft(target, fc_norm=True, norm_output=True, seed=6).bind(target)
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(5))
    greedy = target.generate(ids, do_sample=False, max_new_tokens=24)
    assisted = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=24)
    assert torch.equal(assisted, greedy)
    tree = generate(target, draft, ids, max_new_tokens=24, eos_token_id=[], depth=3, tree_top_k=4, total_tokens=8)
    sequences = tree.sequences if hasattr(tree, "sequences") else tree
    assert torch.equal(sequences[:, : greedy.shape[1]], greedy)
    draft.unbind()
