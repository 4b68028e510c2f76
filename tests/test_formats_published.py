"""Published draft configs (tests/fixtures/published_configs, see its README): each loads to the right model."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from engine_spec import sglang_problems, vllm_problems
from safetensors.torch import save_file

from eagle3_hub import Eagle3DraftModel, formats

FIXTURES = Path(__file__).parent / "fixtures" / "published_configs"
# tiny sizes; every other key of the published config is kept
SCALE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "head_dim": 16,
    "vocab_size": 512,
    "draft_vocab_size": 128,
}


def scaled_folder(name: str, tmp_path: Path, tensors_for: dict | None = None) -> tuple[Path, dict]:
    """The published config scaled down, with a safetensors file of the names and shapes its layout uses
    (``tensors_for``: take them from this config instead, for drafts the loader refuses)."""
    config = json.loads((FIXTURES / name / "config.json").read_text())
    published = json.loads(json.dumps(config))
    layer = config.get("transformer_layer_config") or config  # speculators nest the draft layer
    layer.update({k: v for k, v in SCALE.items() if k != "draft_vocab_size"})
    config["draft_vocab_size"] = SCALE["draft_vocab_size"]
    layer["num_key_value_heads"] = min(layer.get("num_key_value_heads") or 4, 4)
    layer["max_position_embeddings"] = min(layer["max_position_embeddings"], 4096)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    source = tensors_for or config
    layout = formats.detect_layout(source)
    our = formats.config_from_layout(source, layout, source=name)
    g = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in formats.expected_tensors(Eagle3DraftModel, our).items():
        if key == "embed_tokens.weight":
            continue  # published without it: the target's
        if key == "d2t":
            ids = torch.randperm(our.vocab_size, generator=g)[: our.draft_vocab_size].sort().values
            state[key] = ids - torch.arange(our.draft_vocab_size)
        elif key == "t2d":
            state[key] = torch.zeros(our.vocab_size, dtype=torch.bool)
            state[key][(state["d2t"] + torch.arange(our.draft_vocab_size))] = True
        else:
            state[key] = torch.randn(shape, generator=g).to(torch.bfloat16)
    if layout == "speculators":
        state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder, published


def test_fixtures_are_documented():
    readme = (FIXTURES / "README.md").read_text()
    for folder in FIXTURES.iterdir():
        if folder.is_dir():
            assert f"`{folder.name}`" in readme and (folder / "config.json").is_file()


def test_kimi_k2_reference_input_ids(tmp_path, caplog):
    """[2, 30, 58] for 61 layers are the reference's inputs: read as outputs [1, 29, 57], with a warning."""
    folder, published = scaled_folder("specforge-kimi-k2-eagle3", tmp_path)
    assert published["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.formats"):
        draft = Eagle3DraftModel.from_pretrained(folder)
    assert draft.config.aux_layer_ids == [1, 29, 57]
    assert "aux_layer_convention" in caplog.text
    assert draft.config.rope_parameters == {"rope_type": "default", "rope_theta": 1000000.0}
    assert draft.config.target_hidden_size == 64 and draft.config.draft_vocab_size == 128
    assert draft._embedding_missing and not draft.config.fc_norm and not draft.config.norm_output
    out = formats.export_draft(draft, tmp_path / "sglang", to="sglang")
    assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert sglang_problems(out, num_target_layers=61) == [] and vllm_problems(out, num_target_layers=61) == []


def test_qwen3_30b_eagle31(tmp_path):
    folder, published = scaled_folder("specforge-qwen3-30b-a3b-eagle3.1", tmp_path)
    assert published["fc_norm"] is True and published["norm_output"] is True
    draft = Eagle3DraftModel.from_pretrained(folder)
    assert draft.config.fc_norm and draft.config.norm_output and len(draft.fc_norm) == 3
    assert draft.config.aux_layer_ids is None  # none listed: the target decides (engines' default)
    with pytest.raises(ValueError, match="lists no aux layers"):
        draft.check_fits(_meta_llama(48))
    draft = Eagle3DraftModel.from_pretrained(folder, target=None, aux_layer_ids=[1, 23, 44])
    for to in ("vllm", "sglang"):
        out = formats.export_draft(draft, tmp_path / to, to=to, verifier="Qwen/Qwen3-30B-A3B")
        assert json.loads((out / "config.json").read_text()).get("fc_norm") is True
        assert vllm_problems(out, num_target_layers=48) == []
        if to == "sglang":
            assert sglang_problems(out, num_target_layers=48) == []


def test_qwen3_0_6b_plain(tmp_path):
    folder, _ = scaled_folder("specforge-qwen3-0.6b-eagle3", tmp_path)
    draft = Eagle3DraftModel.from_pretrained(folder)
    assert draft.config.rope_parameters["rope_theta"] == 1000000
    assert not any(getattr(draft.config, f) for f in formats.VARIANT_FLAGS)
    assert draft.config.bos_token_id == 151643 and draft.config.head_dim == 16


def _meta_llama(num_layers: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=512,
        num_hidden_layers=num_layers,
    )
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_published_folder_without_weights_is_refused(tmp_path):
    folder = tmp_path / "config-only"
    shutil.copytree(FIXTURES / "specforge-qwen3-0.6b-eagle3", folder)
    with pytest.raises(FileNotFoundError, match="has no weights"):
        Eagle3DraftModel.from_pretrained(folder)


def test_yuhuili_eagle3_llama31_8b(tmp_path):
    """EAGLE's own layout: LlamaForCausalLM, no rope_theta (EAGLE's draft hard-codes base 10000), no aux ids."""
    folder, published = scaled_folder("eagle-llama3.1-instruct-8b", tmp_path)
    assert published["architectures"] == ["LlamaForCausalLM"] and "rope_theta" not in published
    assert formats.detect_layout(published) == "eagle"
    draft = Eagle3DraftModel.from_pretrained(folder, target=_meta_llama(32))
    assert draft.config.aux_layer_ids == [1, 15, 28]  # the engines' default for 32 layers, as vLLM serves it
    assert draft.config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert draft.config.draft_vocab_size == 128 and draft.config.pad_token_id == 0
    assert draft._embedding_missing and not any(getattr(draft.config, f) for f in formats.VARIANT_FLAGS)
    target_ids = draft.d2t + torch.arange(128)
    assert torch.equal(draft.t2d.nonzero().flatten(), target_ids)


def test_specforge_llama3_70b_llama3_rope(tmp_path):
    """Llama-3 rope scaling (factor 8, original 4096 positions) and a list of eos ids reach the draft."""
    folder, published = scaled_folder("specforge-llama3-70b-eagle3", tmp_path)
    draft = Eagle3DraftModel.from_pretrained(folder, target=None, aux_layer_ids=[1, 39, 76])
    rope = draft.config.rope_parameters
    assert rope["rope_type"] == "llama3" and rope["rope_theta"] == 500000.0
    assert (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]) == (8.0, 1.0, 4.0)
    assert rope["original_max_position_embeddings"] == 4096
    assert draft.config.eos_token_id == published["eos_token_id"] == [128001, 128008, 128009]
    out = formats.export_draft(draft, tmp_path / "sglang", to="sglang")
    written = json.loads((out / "config.json").read_text())["rope_scaling"]
    assert written["rope_type"] == written["type"] == "llama3" and written["factor"] == 8.0


def test_speculators_converted_yuhuili(tmp_path, caplog):
    """nm-testing's speculators conversion of yuhuili's draft: layers.0.* tensors, norm_before_residual stated
    false (no ambiguity warning), no aux ids, rope_theta 10000 kept from the original."""
    folder, published = scaled_folder("speculators-llama3.1-8b-eagle3-converted", tmp_path)
    assert published["norm_before_residual"] is False and "eagle_aux_hidden_state_layer_ids" not in published
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.formats"):
        draft = Eagle3DraftModel.from_pretrained(folder, target=_meta_llama(32))
    assert "norm_before_residual" not in caplog.text
    assert not draft.config.norm_before_residual and draft.config.aux_layer_ids == [1, 15, 28]
    assert draft.config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert draft.config.target_hidden_size == 64 and draft.config.draft_vocab_size == 128
    assert draft._embedding_missing


def test_angelslim_qwen3_8b(tmp_path):
    """AngelSlim spells the architecture Eagle3LlamaForCausalLM (vLLM's class name): read as the SpecForge layout."""
    folder, published = scaled_folder("angelslim-qwen3-8b-eagle3", tmp_path)
    assert formats.detect_layout(published) == "specforge"
    draft = Eagle3DraftModel.from_pretrained(folder, target=_meta_llama(36))
    assert draft.config.aux_layer_ids == [1, 17, 32]
    assert draft.config.rope_parameters["rope_theta"] == 1000000 and draft.config.head_dim == 16
    assert not any(getattr(draft.config, f) for f in formats.VARIANT_FLAGS)
    assert (draft.config.bos_token_id, draft.config.eos_token_id) == (151643, 151645)


def test_specforge_moe_draft_is_refused(tmp_path):
    """SpecForge's Qwen3-MoE draft keeps the Llama keys; it must be refused, not loaded as a dense layer."""
    published = json.loads((FIXTURES / "specforge-qwen3-30b-a3b-eagle3-moe-draft" / "config.json").read_text())
    dense = {k: v for k, v in published.items() if k not in formats.MOE_KEYS}
    dense.update(SCALE, num_key_value_heads=4)
    folder, _ = scaled_folder("specforge-qwen3-30b-a3b-eagle3-moe-draft", tmp_path, tensors_for=dense)
    with pytest.raises(ValueError, match=r"mixture-of-experts draft \(num_experts=128") as e:
        Eagle3DraftModel.from_pretrained(folder, target=None, aux_layer_ids=[1, 23, 44])
    assert "\n" not in str(e.value) and "Qwen3MoEForCausalLMEagle3" in str(e.value)


def _modelopt_folder(tmp_path: Path, with_t2d: bool = False) -> tuple[Path, dict]:
    """The ModelOpt export fixture scaled down, with the tensors ModelOpt's EagleExporter writes: ``layers.0.*``
    names, ``d2t`` and no ``t2d`` (``with_t2d``: the same folder with a ``t2d`` added, as other layouts ship it)."""
    from safetensors.torch import load_file

    folder, published = scaled_folder("modelopt-llama3.1-8b-eagle3-export", tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    if not with_t2d:
        del state["t2d"]
    state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder, published


def test_modelopt_export_d2t_without_t2d(tmp_path, caplog):
    """ModelOpt writes d2t but never t2d: a reduced-vocabulary export loads, t2d rebuilt from d2t; the aux ids
    (forward hooks on layer outputs) and the yarn rope_scaling its exporter injects are read as written."""
    from safetensors import safe_open

    folder, published = _modelopt_folder(tmp_path)
    assert published["rope_scaling"] == {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048}
    assert published["rope_theta"] == 10000 and published["eagle_config"]["use_last_layernorm"] is True
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        d2t = f.get_tensor("d2t")
    assert "d2t" in names and "t2d" not in names and "layers.0.hidden_norm.weight" in names
    assert formats.detect_layout(published) == "specforge"
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.formats"):
        draft = Eagle3DraftModel.from_pretrained(folder, target=_meta_llama(32))
    assert "aux_layer_convention" not in caplog.text
    assert draft.config.aux_layer_ids == [1, 15, 28]
    assert draft.config.rope_parameters == {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 2048,
        "rope_theta": 10000,
    }
    assert draft.rotary_emb.attention_scaling == pytest.approx(0.1 * math.log(32.0) + 1.0)  # yarn applied
    target_ids = d2t + torch.arange(128)
    expected_t2d = torch.zeros(512, dtype=torch.bool)
    expected_t2d[target_ids] = True
    assert torch.equal(draft.d2t, d2t) and torch.equal(draft.t2d, expected_t2d)
    assert torch.equal(draft.draft_to_target_ids(torch.arange(128)), target_ids)

    # the same tensors with t2d shipped: the same model, and the file's t2d kept as loaded
    (tmp_path / "both").mkdir()
    both, _ = _modelopt_folder(tmp_path / "both", with_t2d=True)
    with safe_open(str(both / "model.safetensors"), framework="pt") as f:
        shipped_t2d = f.get_tensor("t2d")
    reference = Eagle3DraftModel.from_pretrained(both, target=_meta_llama(32))
    assert torch.equal(reference.t2d, shipped_t2d)
    ours, theirs = draft.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if k != "embed_tokens.weight")

    out = formats.export_draft(draft, tmp_path / "sglang", to="sglang")
    written = json.loads((out / "config.json").read_text())["rope_scaling"]
    assert written["rope_type"] == "yarn" and written["factor"] == 32.0
    assert sglang_problems(out, num_target_layers=32) == [] and vllm_problems(out, num_target_layers=32) == []


def test_ours_without_t2d_still_refused(tmp_path):
    """Only foreign layouts may omit t2d: our folders always write it, so its absence there is damage."""
    from safetensors.torch import load_file

    folder, _ = _modelopt_folder(tmp_path)
    draft = Eagle3DraftModel.from_pretrained(folder, target=_meta_llama(32))
    draft.save_pretrained(tmp_path / "ours")
    state = load_file(str(tmp_path / "ours" / "model.safetensors"))
    del state["t2d"]
    save_file(state, str(tmp_path / "ours" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensors: \['t2d'\]"):
        Eagle3DraftModel.from_pretrained(tmp_path / "ours")


def test_angelslim_vl_mrope_is_refused_for_mrope(tmp_path):
    """AngelSlim's Qwen3-VL draft: multimodal rope (mrope_section, interleaved) is the reason it cannot load, not
    the tie_word_embeddings it copies from the target (its lm_head covers the 32000-token draft vocabulary)."""
    published = json.loads((FIXTURES / "angelslim-qwen3-vl-4b-eagle3-mrope" / "config.json").read_text())
    assert published["tie_word_embeddings"] is True and published["rope_scaling"]["mrope_section"] == [24, 20, 20]
    text_only = {k: v for k, v in published.items() if k not in ("tie_word_embeddings", "rope_scaling")}
    text_only.update(SCALE, num_key_value_heads=4)
    folder, _ = scaled_folder("angelslim-qwen3-vl-4b-eagle3-mrope", tmp_path, tensors_for=text_only)
    with pytest.raises(ValueError, match=r"multimodal rope \(mrope: mrope_section=\[24, 20, 20\] interleaved") as e:
        Eagle3DraftModel.from_pretrained(folder, target=None, aux_layer_ids=[1, 17, 32])
    assert "\n" not in str(e.value) and "ties lm_head" not in str(e.value) and "qwen3_vl" in str(e.value)
