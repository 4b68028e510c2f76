"""Folders today's peers write with their own code (tests/fixtures/peer_exports, see its README), read here, and what
our speculators export carries for speculators' reader. The peers' code itself runs in tests/test_peers.py (side
environment); these tests run everywhere, against the logits the peers' code computed when the fixtures were made.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from engine_spec import vllm_problems
from safetensors.torch import load_file
from tiny_models import make_tiny_target

from eagle3_hub import Eagle3DraftModel, formats
from eagle3_hub.generation.tree.api import generate, load_draft

FIXTURES = Path(__file__).parent / "fixtures" / "peer_exports"
SPECULATORS = FIXTURES / "speculators-0.9.0-trainer-default"
SPECFORGE = FIXTURES / "specforge-0.2.0-sglang"


def step_agreement(draft: Eagle3DraftModel, step: dict) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        logits = draft(input_ids=step["input_ids"], target_hidden_states=step["hidden_states"]).logits
    return (logits.argmax(-1) == step["logits"].argmax(-1)).float().mean().item(), logits


def test_fixtures_are_documented():
    readme = (FIXTURES / "README.md").read_text()
    for folder in FIXTURES.iterdir():
        if folder.is_dir():
            assert f"`{folder.name}`" in readme and (folder / "config.json").is_file()
            assert (FIXTURES / f"{folder.name}.step.safetensors").is_file()


def test_speculators_09_trainer_draft_reads_every_field():
    """speculators 0.9's trainer default (norm_before_fc, norm_before_residual, norm_output, every layer
    sliding_attention with window 2048): every field is read, and one step agrees with speculators' forward."""
    config = json.loads((SPECULATORS / "config.json").read_text())
    assert config["auto_map"] == {"": "config.Eagle3SpeculatorConfig"} and "model_type" not in config
    draft = Eagle3DraftModel.from_pretrained(SPECULATORS)
    assert draft.config.layer_types == ["sliding_attention"] and draft.config.sliding_window == 2048
    assert draft.config.norm_before_fc and draft.config.norm_before_residual and draft.config.norm_output
    assert not draft.config.fc_norm
    assert draft.config.aux_layer_ids == [0, 1, 2]  # speculators' [1, 2, 3] are layer inputs
    assert not draft._embedding_missing  # speculators saves the verifier's embedding with the draft
    agreement, logits = step_agreement(draft, load_file(str(FIXTURES / f"{SPECULATORS.name}.step.safetensors")))
    assert agreement >= 0.999
    torch.testing.assert_close(
        logits, load_file(str(FIXTURES / f"{SPECULATORS.name}.step.safetensors"))["logits"], atol=1e-4, rtol=1e-4
    )


def test_speculators_09_folder_runs_in_tree_decoding_without_remote_code(tmp_path):
    """The folder speculators 0.9 writes (auto_map {"": "config.Eagle3SpeculatorConfig"}, no model_type) loads
    through the one draft loader of generate / bench / the demo without trust_remote_code, and tree decoding with it
    is lossless (float32: the tokens of plain greedy)."""
    folder = shutil.copytree(SPECULATORS, tmp_path / "draft")
    target = make_tiny_target("llama")  # the verifier the fixture was made for (tests' tiny Llama, seed 0)
    draft = load_draft(str(folder), target)
    assert isinstance(draft, Eagle3DraftModel)
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    out = generate(target, str(folder), ids, max_new_tokens=24, eos_token_id=[])
    plain = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert torch.equal(out.sequences, plain)


def test_specforge_02_export_reads_and_agrees():
    """`specforge export --to sglang` (SpecForge 0.2.0's exporter, Llama-3 rope scaling, bfloat16, no embedding):
    read as the SpecForge layout, one step agrees with SpecForge's draft forward."""
    draft = Eagle3DraftModel.from_pretrained(SPECFORGE, dtype=torch.float32, aux_layer_ids=[0, 1, 2])
    assert draft._embedding_missing
    assert draft.config.rope_parameters["rope_type"] == "llama3" and draft.config.draft_vocab_size == 100
    assert not any(getattr(draft.config, flag) for flag in formats.VARIANT_FLAGS)
    step = load_file(str(FIXTURES / f"{SPECFORGE.name}.step.safetensors"))
    draft.embed_tokens.weight = torch.nn.Parameter(step["embed_tokens"], requires_grad=False)
    draft._embedding_missing = False
    agreement, logits = step_agreement(draft, step)
    assert agreement >= 0.999
    torch.testing.assert_close(logits, step["logits"], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- our vllm export
@pytest.fixture
def ours_without_embedding(tmp_path):
    target = make_tiny_target("llama")
    target_dir = tmp_path / "tiny-llama"
    target.save_pretrained(target_dir)
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=200)
    draft.set_vocab_mapping(torch.arange(0, 200))
    draft.save_pretrained(tmp_path / "ours", save_embeddings=False)  # as published: the target's embedding
    return tmp_path / "ours", target_dir, target


def test_vllm_export_carries_the_target_embedding(ours_without_embedding, tmp_path):
    """speculators' loader reads the draft's embed_tokens (without it transformers 5.19 leaves uninitialised memory
    there): `convert --to vllm --target` copies the target's, bit for bit, and names the verifier's architectures."""
    ours, target_dir, target = ours_without_embedding
    out = formats.convert(ours, tmp_path / "vllm", to="vllm", target=str(target_dir), verifier="org/tiny-llama")
    state = load_file(str(out / "model.safetensors"))
    assert torch.equal(state["embed_tokens.weight"], target.get_input_embeddings().weight)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"] == {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]}
    assert config["speculators_version"] == formats.SPECULATORS_VERSION and config["tie_word_embeddings"] is False
    assert vllm_problems(out, num_target_layers=4) == []  # vLLM loads (and shares) an embedding the draft carries
    back = Eagle3DraftModel.from_pretrained(out)
    assert not back._embedding_missing
    source = load_file(str(ours / "model.safetensors"))  # every other tensor unchanged
    assert all(torch.equal(state[k.replace("midlayer.", "layers.0.")], v) for k, v in source.items())


def test_vllm_export_without_a_target_warns_that_it_has_no_embedding(ours_without_embedding, tmp_path, caplog):
    ours, _, target = ours_without_embedding
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.formats"):
        out = formats.convert(ours, tmp_path / "vllm", to="vllm", verifier="org/tiny-llama")
    assert "zero embedding" in caplog.text and "--target" in caplog.text
    assert "embed_tokens.weight" not in formats.tensor_shapes(out)
    bound = Eagle3DraftModel.from_pretrained(ours, target=target)  # bound: the export carries the target's
    out = formats.export_draft(bound, tmp_path / "vllm-bound", to="vllm", verifier="org/tiny-llama")
    assert torch.equal(load_file(str(out / "model.safetensors"))["embed_tokens.weight"], target.get_input_embeddings().weight)
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["architectures"] == [
        "LlamaForCausalLM"
    ]
    sglang = formats.export_draft(bound, tmp_path / "sglang", to="sglang")  # SGLang shares the target's: unchanged
    assert "embed_tokens.weight" not in formats.tensor_shapes(sglang)
