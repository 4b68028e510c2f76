"""Published draft configs (tests/fixtures/published_configs, see its README): each loads to the right model."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_hub import Eagle3DraftModel
from eagle3_hub import formats
from engine_spec import sglang_problems, vllm_problems

FIXTURES = Path(__file__).parent / "fixtures" / "published_configs"
# tiny sizes; every other key of the published config is kept
SCALE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "vocab_size": 512,
         "draft_vocab_size": 128}


def scaled_folder(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """The published config scaled down, with a safetensors file of the names and shapes its layout uses."""
    config = json.loads((FIXTURES / name / "config.json").read_text())
    published = dict(config)
    config.update(SCALE)
    config["num_key_value_heads"] = min(config.get("num_key_value_heads") or 4, 4)
    config["max_position_embeddings"] = min(config["max_position_embeddings"], 4096)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    our = formats.config_from_layout(config, formats.detect_layout(config), source=name)
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

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                         vocab_size=512, num_hidden_layers=num_layers)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_published_folder_without_weights_is_refused(tmp_path):
    folder = tmp_path / "config-only"
    shutil.copytree(FIXTURES / "specforge-qwen3-0.6b-eagle3", folder)
    with pytest.raises(FileNotFoundError, match="has no weights"):
        Eagle3DraftModel.from_pretrained(folder)
