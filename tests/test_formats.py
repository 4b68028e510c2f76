"""Draft layouts: our folder (transformers, remote code, engines), the foreign layouts we load, `convert`,
the aux-layer convention, and clear errors for bad input."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from engine_spec import sglang_aux_layer_inputs, sglang_problems, vllm_aux_layer_inputs, vllm_problems
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_target
from transformers import AutoModel

from eagle3_hub import Eagle3DraftModel, formats
from eagle3_hub.commands import convert as convert_command

AUX = [0, 1, 2]  # 4-layer tiny targets: layer outputs 0..2 (engines cannot capture the last layer's output)


def randomized_draft(target, aux_layer_ids=AUX, draft_vocab_size=200, seed=0, **variant) -> Eagle3DraftModel:
    """A draft for ``target`` (with the given variant keys, e.g. ``fc_norm=True``) whose every weight is random (norms
    included) and whose vocabulary map is a random subset, so that any swapped or dropped tensor changes the logits."""
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=aux_layer_ids, draft_vocab_size=draft_vocab_size, **variant)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name != "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
    vocab = draft.config.vocab_size
    draft.set_vocab_mapping(torch.randperm(vocab, generator=g)[:draft_vocab_size].sort().values)
    return draft.eval()


def inputs_for(draft, seed=1, length=6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, draft.config.vocab_size, (2, length), generator=g)
    feats = torch.randn(2, length, 3 * draft.config.target_hidden_size, generator=g)
    return ids, feats


@torch.no_grad()
def logits_of(draft, ids, feats):
    return draft(input_ids=ids, target_hidden_states=feats).logits


@pytest.fixture(scope="module")
def target():
    return make_tiny_target("llama")


@pytest.fixture(scope="module")
def draft(target):
    return randomized_draft(target)


@pytest.fixture(scope="module")
def native(tmp_path_factory, draft):
    path = tmp_path_factory.mktemp("native") / "draft"
    draft.save_pretrained(path)
    return path


def convert_cli(*argv):
    parser = argparse.ArgumentParser()
    convert_command.add_arguments(parser)
    return convert_command.run(parser.parse_args([str(a) for a in argv]))


# ------------------------------------------------------------------------------ synthetic foreign layouts
def _llama_layer(draft) -> dict:
    """The draft layer as the projects spell it in a LlamaConfig dict (transformers v4 rope keys)."""
    c = draft.config
    return {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_parameters["rope_theta"],
        "rope_scaling": None,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def write_foreign(draft, folder: Path, layout: str, with_embedding: bool = False) -> Path:
    """A checkpoint as the official EAGLE-3 releases, SpecForge or speculators write it (key names and config
    fields of those projects), from ``draft``'s weights."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in draft.state_dict().items()}
    if not with_embedding:
        del state["embed_tokens.weight"]
    layer = _llama_layer(draft)
    if layout == "eagle":  # yuhuili/EAGLE3-*: LlamaForCausalLM, draft_vocab_size, no aux ids, no embedding
        config = {
            **layer,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "draft_vocab_size": draft.config.draft_vocab_size,
            "transformers_version": "4.28.1",
        }
    elif layout == "specforge":  # SpecForge configs/*-eagle3.json + eagle_config as in gpt-oss / qwen3 configs
        config = {
            **layer,
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "draft_vocab_size": draft.config.draft_vocab_size,
            "attention_bias": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": draft.config.aux_layer_ids},
            "target_model_type": "llama",
        }
    elif layout == "speculators":  # speculators Eagle3SpeculatorConfig + eagle3_converter output
        layer = {**layer, "model_type": "llama", "attention_bias": False, "mlp_bias": False}
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0",
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]},
            },
            "transformer_layer_config": layer,
            "draft_vocab_size": draft.config.draft_vocab_size,
            "norm_before_residual": False,
            "target_hidden_size": draft.config.target_hidden_size,
            # vLLM convention: layer inputs
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in draft.config.aux_layer_ids],
        }
        state = {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    else:
        raise ValueError(layout)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# ------------------------------------------------------------------------------ our folder
def test_native_folder_holds_weights_code_and_engine_keys(native, draft):
    files = sorted(p.name for p in native.iterdir())
    assert "model.safetensors" in files and not [f for f in files if f.endswith((".bin", ".pt", ".pth"))]
    package = Path(formats.__file__).parent.parent  # eagle3_hub/: formats is a package inside it
    for name in formats.CODE_FILES:
        assert (native / name).read_text() == (package / name).read_text()
    from eagle3_hub.generation.tree_decoding import write_custom_generate  # owned by tree decoding: same files

    fresh = write_custom_generate(native.parent / "fresh_custom_generate").parent
    for file in fresh.iterdir():
        assert (native / "custom_generate" / file.name).read_bytes() == file.read_bytes()
    config = json.loads((native / "config.json").read_text())
    assert config["model_type"] == "eagle3_draft"
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["auto_map"]["AutoModel"] == "modeling_eagle3.Eagle3DraftModel"
    assert config["auto_map"]["AutoConfig"] == "configuration_eagle3.Eagle3Config"
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX  # SGLang: layer outputs
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in AUX]  # vLLM: layer inputs
    assert config["draft_vocab_size"] == 200 and config["vocab_size"] == 256
    assert config["norm_before_residual"] is False
    # the draft owns a copy of the target's embedding (from_target): it is saved
    assert "embed_tokens.weight" in load_file(str(native / "model.safetensors"))


def test_automodel_loads_native_folder_once_package_imported(native, draft):
    model = AutoModel.from_pretrained(native, dtype=torch.float32)
    assert type(model) is Eagle3DraftModel
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(logits_of(model, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)


REMOTE_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys

    class BlockPackage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "eagle3_hub" or name.startswith("eagle3_hub."):
                raise ImportError("eagle3_hub is blocked in this process")

    sys.meta_path.insert(0, BlockPackage())
    try:
        import eagle3_hub  # noqa: F401
        sys.exit("eagle3_hub is importable: the test would prove nothing")
    except ImportError:
        pass
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    folder, inputs, out = sys.argv[1:4]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    x = load_file(inputs)
    with torch.no_grad():
        logits = model(input_ids=x["ids"], target_hidden_states=x["feats"]).logits
    save_file({"logits": logits.contiguous()}, out)
    print(type(model).__module__)
    """
)


def test_trust_remote_code_loads_without_package(native, draft, tmp_path):
    ids, feats = inputs_for(draft)
    save_file({"ids": ids, "feats": feats}, str(tmp_path / "inputs.safetensors"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "PYTHONPATH"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            REMOTE_SCRIPT,
            str(native),
            str(tmp_path / "inputs.safetensors"),
            str(tmp_path / "out.safetensors"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    remote = load_file(str(tmp_path / "out.safetensors"))["logits"]
    torch.testing.assert_close(remote, logits_of(draft, ids, feats), rtol=0, atol=0)


# ------------------------------------------------------------------------------ engines
def test_native_folder_meets_engine_spec_except_remote_code(native):
    # the one trade-off of our layout: model_type eagle3_draft needs the engines' --trust-remote-code
    assert vllm_problems(native, num_target_layers=4) == [
        "vllm: model_type 'eagle3_draft' is unknown to transformers: needs --trust-remote-code (V1)"
    ]
    assert sglang_problems(native, num_target_layers=4) == [
        "sglang: model_type 'eagle3_draft' is unknown to transformers: needs --trust-remote-code (S1)"
    ]
    assert vllm_problems(native, num_target_layers=4, trust_remote_code=True) == []
    assert sglang_problems(native, num_target_layers=4, trust_remote_code=True) == []


@pytest.mark.parametrize("to", ["sglang", "vllm"])
def test_convert_to_engine_layout_meets_spec_and_round_trips(native, draft, tmp_path, to):
    out = tmp_path / to
    assert convert_cli(native, out, "--to", to, "--verifier", "org/tiny-llama") == 0
    assert vllm_problems(out, num_target_layers=4) == []  # both exports are served by vLLM
    if to == "sglang":
        assert sglang_problems(out, num_target_layers=4) == []
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == "llama" and "auto_map" not in config
        assert not list(out.glob("*.py"))  # engine folders never run our code
    else:
        config = json.loads((out / "config.json").read_text())
        assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
        assert config["norm_before_residual"] is False
        assert any(k.startswith("layers.0.") for k in load_file(str(out / "model.safetensors")))
    reloaded = Eagle3DraftModel.from_pretrained(out)
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(logits_of(reloaded, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)
    assert reloaded.config.aux_layer_ids == AUX


def test_aux_layer_ids_map_to_the_same_target_tensors_in_every_engine(native, target, draft, tmp_path):
    """Our ids are layer outputs; vLLM and SGLang capture the input of layer id + 1. Check the +1 on a real
    forward: the output of layer i is the input of layer i + 1, and every folder makes both engines read the
    layers our hooks read."""
    convert_cli(native, tmp_path / "sglang", "--to", "sglang")
    convert_cli(native, tmp_path / "vllm", "--to", "vllm")
    for folder in (native, tmp_path / "sglang", tmp_path / "vllm"):
        assert vllm_aux_layer_inputs(folder) == [i + 1 for i in AUX]
    for folder in (native, tmp_path / "sglang"):
        assert sglang_aux_layer_inputs(folder) == [i + 1 for i in AUX]

    layers = target.model.layers
    outputs, inputs = {}, {}
    hooks = [
        layers[i].register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
        for i in AUX
    ]
    hooks += [
        layers[j].register_forward_pre_hook(
            lambda m, a, kw, j=j: inputs.__setitem__(j, (a[0] if a else kw["hidden_states"])), with_kwargs=True
        )
        for j in vllm_aux_layer_inputs(native)
    ]
    with torch.no_grad():
        hidden = target(torch.randint(0, 256, (1, 7)), output_hidden_states=True).hidden_states
    for h in hooks:
        h.remove()
    for i in AUX:
        torch.testing.assert_close(inputs[i + 1], outputs[i], rtol=0, atol=0)
        torch.testing.assert_close(hidden[i + 1], outputs[i], rtol=0, atol=0)  # = HF output_hidden_states[i + 1]
    assert formats.to_vllm_aux_layer_ids(AUX) == [1, 2, 3]
    assert formats.from_vllm_aux_layer_ids([2, 16, 29]) == [1, 15, 28]
    assert formats.engine_default_aux_layer_ids(32) == [1, 15, 28]  # inputs (2, 16, 29), the EAGLE-3 reference


def test_last_layer_aux_exports_for_vllm_only(tmp_path, caplog):
    """vLLM 0.33 captures the last layer's output (input id L); SGLang captures the input of layer id + 1 only."""
    target = make_tiny_target("llama")
    draft = randomized_draft(target, aux_layer_ids=[0, 1, 3])  # 3 = output of the last layer
    with pytest.raises(ValueError, match="last layer.*--to vllm.*0..2"):
        formats.export_draft(draft, tmp_path / "x", to="sglang")
    assert not (tmp_path / "x").exists()
    with caplog.at_level("WARNING", logger="eagle3_hub.formats"):
        out = formats.export_draft(draft, tmp_path / "vllm", to="vllm", verifier="org/tiny-llama")
    assert "before the target's final norm" in caplog.text  # vLLM's id L is hidden + residual, HF's is normed
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert vllm_problems(out, num_target_layers=4) == []
    draft.save_pretrained(tmp_path / "ours")  # fine for transformers
    assert vllm_problems(tmp_path / "ours", num_target_layers=4, trust_remote_code=True) == []
    assert any("1..3" in p for p in sglang_problems(tmp_path / "ours", num_target_layers=4, trust_remote_code=True))
    ids, feats = inputs_for(draft)
    reloaded = Eagle3DraftModel.from_pretrained(out)
    assert reloaded.config.aux_layer_ids == [0, 1, 3]
    torch.testing.assert_close(logits_of(reloaded, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)


def test_rope_scaling_survives_every_layout(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    target = make_tiny_target("llama", rope_parameters=rope)
    draft = randomized_draft(target)
    assert draft.config.rope_parameters == rope
    ids, feats = inputs_for(draft, length=12)
    expected = logits_of(draft, ids, feats)
    for to in formats.EXPORTS:
        out = formats.export_draft(draft, tmp_path / to, to=to)
        config = json.loads((out / "config.json").read_text())
        layer = config.get("transformer_layer_config", config)
        assert layer["rope_theta"] == 500000.0  # engines on transformers v4 read these two keys
        assert layer["rope_scaling"]["rope_type"] == "llama3" and layer["rope_scaling"]["factor"] == 8.0
        reloaded = Eagle3DraftModel.from_pretrained(out)
        assert reloaded.config.rope_parameters == rope
        torch.testing.assert_close(logits_of(reloaded, ids, feats), expected, rtol=0, atol=0)


# ------------------------------------------------------------------------------ foreign layouts
@pytest.fixture(scope="module")
def deep_target():
    return make_tiny_target("llama", num_hidden_layers=8)


@pytest.fixture(scope="module")
def deep_draft(deep_target):
    # the reference layers of an 8-layer target: inputs of 2, 4, 5 = outputs of 1, 3, 4
    return randomized_draft(deep_target, aux_layer_ids=[1, 3, 4], seed=3)


@pytest.mark.parametrize("layout", ["eagle", "specforge", "speculators"])
def test_foreign_layout_loads_to_the_same_model(deep_target, deep_draft, tmp_path, layout):
    folder = write_foreign(deep_draft, tmp_path / layout, layout)
    assert formats.detect_layout(json.loads((folder / "config.json").read_text())) == layout
    loaded = Eagle3DraftModel.from_pretrained(folder, target=deep_target)
    assert type(loaded) is Eagle3DraftModel
    # the official releases list no aux layers: the engines' default for the target's depth
    assert loaded.config.aux_layer_ids == [1, 3, 4]
    assert torch.equal(loaded.embed_tokens.weight, deep_target.get_input_embeddings().weight)
    torch.testing.assert_close(loaded.d2t, deep_draft.d2t, rtol=0, atol=0)
    ids, feats = inputs_for(deep_draft)
    torch.testing.assert_close(logits_of(loaded, ids, feats), logits_of(deep_draft, ids, feats), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["eagle", "specforge", "speculators"])
def test_convert_foreign_layout_to_ours(deep_target, deep_draft, tmp_path, layout):
    src = write_foreign(deep_draft, tmp_path / layout, layout)
    dst = tmp_path / "ours"
    extra = ["--aux-layer-ids", "1,3,4"] if layout == "eagle" else []
    assert convert_cli(src, dst, *extra) == 0
    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "eagle3_draft" and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert "embed_tokens.weight" not in load_file(str(dst / "model.safetensors"))  # still the target's
    loaded = Eagle3DraftModel.from_pretrained(dst, target=deep_target)
    ids, feats = inputs_for(deep_draft)
    torch.testing.assert_close(logits_of(loaded, ids, feats), logits_of(deep_draft, ids, feats), rtol=0, atol=0)


def test_convert_official_release_without_aux_ids_needs_target(deep_target, deep_draft, tmp_path):
    src = write_foreign(deep_draft, tmp_path / "eagle", "eagle")
    with pytest.raises(ValueError, match="does not list its aux layers.*--target"):
        convert_cli(src, tmp_path / "out")
    deep_target.save_pretrained(tmp_path / "target")
    convert_cli(src, tmp_path / "out", "--target", tmp_path / "target", "--to", "sglang")
    assert sglang_problems(tmp_path / "out", num_target_layers=8) == []
    assert vllm_problems(tmp_path / "out", num_target_layers=8) == []
    assert sglang_aux_layer_inputs(tmp_path / "out") == [2, 4, 5]  # the reference: inputs of 2, L//2, L-3


def test_full_vocabulary_draft_without_maps(tmp_path, target):
    draft = randomized_draft(target, draft_vocab_size=256)
    folder = write_foreign(draft, tmp_path / "full", "specforge", with_embedding=True)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k not in ("d2t", "t2d")}, str(folder / "model.safetensors"))
    loaded = Eagle3DraftModel.from_pretrained(folder)
    assert torch.equal(loaded.d2t, torch.zeros(256, dtype=torch.long)) and bool(loaded.t2d.all())
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(logits_of(loaded, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)


def test_hub_repo_id_resolves_through_the_hub_cache(tmp_path, deep_target, deep_draft):
    """A repo id goes through huggingface_hub (here its cache, offline): foreign and our layouts."""
    cache = tmp_path / "hub"
    for repo, writer in (("org/specforge-draft", "specforge"), ("org/our-draft", "ours")):
        commit = "0123456789abcdef0123456789abcdef01234567"
        repo_dir = cache / f"models--{repo.replace('/', '--')}"
        snapshot = repo_dir / "snapshots" / commit
        if writer == "ours":
            deep_draft.save_pretrained(snapshot)
        else:
            write_foreign(deep_draft, snapshot, writer)
        (repo_dir / "refs").mkdir(parents=True)
        (repo_dir / "refs" / "main").write_text(commit)
        loaded = Eagle3DraftModel.from_pretrained(repo, cache_dir=cache, local_files_only=True, target=deep_target)
        ids, feats = inputs_for(deep_draft)
        torch.testing.assert_close(logits_of(loaded, ids, feats), logits_of(deep_draft, ids, feats), rtol=0, atol=0)


# ------------------------------------------------------------------------------ bad input
def _copy_native(native, tmp_path) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(native, dst)
    return dst


def test_missing_tensor_is_named(native, tmp_path):
    folder = _copy_native(native, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    del state["fc.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing tensors: \['fc.weight'\]"):
        Eagle3DraftModel.from_pretrained(folder)


def test_misshaped_tensor_is_named_with_its_config_fields(native, tmp_path):
    folder = _copy_native(native, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["draft_vocab_size"] = 100  # the weights say 200
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"lm_head.weight is \[200, 64\], expected \[100, 64\] \[draft_vocab_size, hidden_size\]"
    ):
        Eagle3DraftModel.from_pretrained(folder)


def test_misshaped_foreign_fc_is_named(deep_draft, tmp_path):
    folder = write_foreign(deep_draft, tmp_path / "sf", "specforge")
    config = json.loads((folder / "config.json").read_text())
    config["target_hidden_size"] = 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"fc.weight is \[64, 192\], expected \[64, 96\] \[hidden_size, 3 \* target_hidden_size\]"
    ):
        Eagle3DraftModel.from_pretrained(folder)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=32, intermediate_size=64), "features of width 64, the target's hidden size is 32"),
        (dict(vocab_size=300), "vocabulary of 256 tokens, the target has 300"),
        (dict(num_hidden_layers=2), r"aux layers \[0, 1, 2\] do not exist in a target with 2 decoder layers"),
    ],
)
def test_draft_that_does_not_fit_the_target(native, overrides, message):
    other = make_tiny_target("llama", **overrides)
    with pytest.raises(ValueError, match=message):
        Eagle3DraftModel.from_pretrained(native, target=other)


def test_convert_checks_the_target(native, tmp_path):
    make_tiny_target("llama", hidden_size=32, intermediate_size=64).save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match="does not fit the target.*width 64.*hidden size is 32"):
        convert_cli(native, tmp_path / "out", "--target", tmp_path / "small")
    make_tiny_target("llama").save_pretrained(tmp_path / "same")
    with pytest.raises(ValueError, match=r"aux_layer_ids \[0, 1, 9\] out of range.*4 decoder layers"):
        convert_cli(native, tmp_path / "out", "--target", tmp_path / "same", "--aux-layer-ids", "0,1,9")


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        Eagle3DraftModel.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        Eagle3DraftModel.from_pretrained(tmp_path / "empty")


def test_checkpoint_of_another_model_is_refused(tmp_path, target):
    target.save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="is not an EAGLE-3 draft.*pass it as `target=`"):
        Eagle3DraftModel.from_pretrained(tmp_path / "llama")


def test_eagle2_draft_is_refused(deep_draft, tmp_path):
    folder = write_foreign(deep_draft, tmp_path / "e2", "eagle")
    state = load_file(str(folder / "model.safetensors"))
    state["fc.weight"] = torch.zeros(64, 128)  # EAGLE-1/2: fc reads [embedding ; feature]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="EAGLE-1/EAGLE-2 draft"):
        Eagle3DraftModel.from_pretrained(folder)


class _Tripwire:
    """Unpickling this touches a file: proves whether a loader unpickled the checkpoint."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_pickled_checkpoint_is_refused_without_unpickling(deep_draft, tmp_path):
    folder = write_foreign(deep_draft, tmp_path / "release", "eagle")
    (folder / "model.safetensors").unlink()
    tripwire = tmp_path / "unpickled"
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"fc.weight": _Tripwire(tripwire)}, f)
    with pytest.raises(ValueError, match="only pickled weights.*safetensors"):
        Eagle3DraftModel.from_pretrained(folder)
    with pytest.raises(ValueError, match="only pickled weights"):
        convert_cli(folder, tmp_path / "out")
    assert not tripwire.exists()


def test_disagreeing_aux_keys_are_refused(native, tmp_path):
    folder = _copy_native(native, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = AUX  # outputs written where vLLM expects inputs
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"disagrees with itself.*should be \[1, 2, 3\]"):
        Eagle3DraftModel.from_pretrained(folder)


@pytest.mark.parametrize("flag, tensors", [("fc_norm", "fc_norm.0.weight"), ("norm_before_fc", "input_norm.weight")])
def test_variant_flag_without_its_tensors_is_refused(deep_draft, tmp_path, flag, tensors):
    folder = write_foreign(deep_draft, tmp_path / "spec", "speculators")
    config = json.loads((folder / "config.json").read_text())
    config[flag] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"(?s)missing tensors: \[.*'{tensors}'.*fc_norm / norm_before_fc"):
        Eagle3DraftModel.from_pretrained(folder)


def test_inconsistent_vocabulary_maps_are_not_saved(target, tmp_path):
    draft = randomized_draft(target)
    with torch.no_grad():
        draft.t2d.zero_()
    with pytest.raises(ValueError, match="t2d and d2t describe different draft vocabularies"):
        draft.save_pretrained(tmp_path / "broken")


def test_convert_does_not_overwrite_without_force(native, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="--force"):
        convert_cli(native, out)
    assert (out / "keep.txt").exists()
    convert_cli(native, out, "--force")
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


# ------------------------------------------------------------------------------ issue 30: what the engines load
@pytest.mark.parametrize("to", ["ours", "vllm", "sglang"])
def test_full_vocabulary_draft_ships_no_vocabulary_maps(target, tmp_path, to):
    """vLLM builds no draft_id_to_target_id for a full-vocabulary draft and fails on a shipped d2t."""
    draft = randomized_draft(target, draft_vocab_size=256)
    draft.set_vocab_mapping(torch.arange(256))  # full vocabulary, identity map
    out = formats.export_draft(draft, tmp_path / to, to=to, verifier="org/tiny-llama")
    names = set(load_file(str(out / "model.safetensors")))
    assert not names & {"d2t", "t2d"}
    assert vllm_problems(out, num_target_layers=4, trust_remote_code=True) == []
    if to != "vllm":
        assert sglang_problems(out, num_target_layers=4, trust_remote_code=True) == []
    reloaded = Eagle3DraftModel.from_pretrained(out)
    assert torch.equal(reloaded.d2t, torch.zeros(256, dtype=torch.long)) and bool(reloaded.t2d.all())
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(logits_of(reloaded, ids, feats), logits_of(draft, ids, feats), rtol=0, atol=0)


def test_full_vocabulary_draft_with_a_permuted_map_is_refused_for_engines(target, tmp_path):
    draft = randomized_draft(target, draft_vocab_size=256)
    draft.set_vocab_mapping(torch.randperm(256, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="whole target vocabulary.*not the identity"):
        formats.export_draft(draft, tmp_path / "vllm", to="vllm")


def test_official_release_folder_is_not_an_sglang_draft_as_is(deep_draft, tmp_path):
    """SGLang 0.5.23 builds the class `architectures` names: LlamaForCausalLM would be a plain Llama."""
    folder = write_foreign(deep_draft, tmp_path / "eagle", "eagle")
    assert any("architectures ['LlamaForCausalLM']" in p for p in sglang_problems(folder, num_target_layers=8))
    out = tmp_path / "sglang"
    convert_cli(folder, out, "--to", "sglang", "--aux-layer-ids", "1,3,4")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert sglang_problems(out, num_target_layers=8) == []


def test_sglang_loads_both_layer_spellings(deep_draft, tmp_path):
    folder = write_foreign(deep_draft, tmp_path / "spec", "specforge", with_embedding=True)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in state.items()}, str(folder / "model.safetensors"))
    assert sglang_problems(folder, num_target_layers=8) == []
    loaded = Eagle3DraftModel.from_pretrained(folder)
    ids, feats = inputs_for(deep_draft)
    torch.testing.assert_close(logits_of(loaded, ids, feats), logits_of(deep_draft, ids, feats), rtol=0, atol=0)


@pytest.mark.parametrize("to, convention", [("ours", "output"), ("sglang", "output"), ("vllm", "input")])
def test_every_folder_states_its_conventions(draft, tmp_path, to, convention):
    out = formats.export_draft(draft, tmp_path / to, to=to, verifier="org/tiny-llama")
    config = json.loads((out / "config.json").read_text())
    assert config["aux_layer_convention"] == convention
    for flag in formats.VARIANT_FLAGS:  # engines default some differently: never left implicit
        assert config[flag] is False


def _set_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def test_reference_input_ids_in_eagle_config_are_read_as_inputs(deep_target, deep_draft, tmp_path, caplog):
    """AQ-MedAI's Kimi-K2 drafts store the reference's input layers ([2, 30, 58] of 61) in eagle_config."""
    folder = write_foreign(deep_draft, tmp_path / "kimi", "specforge")
    _set_config(folder, eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5], "use_aux_hidden_state": True})
    with caplog.at_level("WARNING", logger="eagle3_hub.formats"):
        loaded = Eagle3DraftModel.from_pretrained(folder)
    assert loaded.config.aux_layer_ids == [1, 3, 4]  # inputs 2, L//2, L-3 of an 8-layer target
    assert "aux_layer_convention" in caplog.text and "as inputs" in caplog.text
    assert Eagle3DraftModel.from_pretrained(folder, target=deep_target).config.aux_layer_ids == [1, 3, 4]
    assert formats.resolve_aux_layer_ids({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}, "specforge") == [
        1,
        29,
        57,
    ]
    # the caller's word wins
    assert Eagle3DraftModel.from_pretrained(folder, aux_layer_convention="output").config.aux_layer_ids == [2, 4, 5]


def test_sglang_ids_copied_to_the_top_level_are_read_as_outputs(deep_draft, tmp_path, caplog):
    """A converted speculators draft (Qwen3-235B) copied SGLang's output ids [1, 46, 90] to vLLM's top-level key."""
    folder = write_foreign(deep_draft, tmp_path / "spec", "speculators")
    _set_config(folder, eagle_aux_hidden_state_layer_ids=[1, 3, 4])
    with caplog.at_level("WARNING", logger="eagle3_hub.formats"):
        assert Eagle3DraftModel.from_pretrained(folder).config.aux_layer_ids == [1, 3, 4]
    assert "as outputs" in caplog.text and "aux_layer_convention" in caplog.text
    assert formats.resolve_aux_layer_ids({"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}, "speculators") == [1, 46, 90]
    assert Eagle3DraftModel.from_pretrained(folder, aux_layer_convention="input").config.aux_layer_ids == [0, 2, 3]


def test_ambiguous_eagle_config_ids_warn_and_take_the_override(deep_draft, tmp_path, caplog):
    folder = write_foreign(deep_draft, tmp_path / "spec", "specforge")
    _set_config(folder, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 5]})
    with caplog.at_level("WARNING", logger="eagle3_hub.formats"):
        assert Eagle3DraftModel.from_pretrained(folder).config.aux_layer_ids == [1, 2, 5]
    assert "reading them as outputs" in caplog.text and "aux_layer_convention='input'" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="eagle3_hub.formats"):
        assert Eagle3DraftModel.from_pretrained(folder, aux_layer_convention="input").config.aux_layer_ids == [0, 1, 4]
    assert "reading them" not in caplog.text  # the caller said: no guess
    out = tmp_path / "out"
    convert_cli(folder, out, "--aux-layer-convention", "input")
    assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 4]
    # a stated convention is read as stated, without a guess
    _set_config(folder, aux_layer_convention="input")
    assert Eagle3DraftModel.from_pretrained(folder).config.aux_layer_ids == [0, 1, 4]
    with pytest.raises(ValueError, match="aux_layer_convention must be 'output' or 'input'"):
        Eagle3DraftModel.from_pretrained(folder, aux_layer_convention="outputs")


def test_speculators_config_without_norm_before_residual_warns(deep_draft, tmp_path, caplog):
    folder = write_foreign(deep_draft, tmp_path / "spec", "speculators", with_embedding=True)
    _set_config(folder, norm_before_residual=None)
    assert any("norm_before_residual" in p for p in vllm_problems(folder, num_target_layers=8))  # vLLM reads True
    with caplog.at_level("WARNING", logger="eagle3_hub.formats"):
        loaded = Eagle3DraftModel.from_pretrained(folder)
    assert "vLLM as True" in caplog.text
    assert loaded.config.norm_before_residual is False  # as the speculators library, and as before
    ids, feats = inputs_for(deep_draft)
    torch.testing.assert_close(logits_of(loaded, ids, feats), logits_of(deep_draft, ids, feats), rtol=0, atol=0)
    out = tmp_path / "vllm"
    convert_cli(folder, out, "--to", "vllm", "--verifier", "org/tiny-llama")
    assert json.loads((out / "config.json").read_text())["norm_before_residual"] is False
    assert vllm_problems(out, num_target_layers=8) == []


def test_norm_before_residual_draft_exports_for_vllm_not_sglang(target, tmp_path):
    draft = randomized_draft(target)
    draft.config.norm_before_residual = True
    twin = Eagle3DraftModel(draft.config)
    twin.load_state_dict(draft.state_dict())
    twin.eval()
    with pytest.raises(ValueError, match="norm_before_residual.*--to vllm"):
        formats.export_draft(twin, tmp_path / "sglang", to="sglang")
    out = formats.export_draft(twin, tmp_path / "vllm", to="vllm", verifier="org/tiny-llama")
    assert json.loads((out / "config.json").read_text())["norm_before_residual"] is True
    reloaded = Eagle3DraftModel.from_pretrained(out)
    assert reloaded.config.norm_before_residual is True
    ids, feats = inputs_for(draft)
    torch.testing.assert_close(logits_of(reloaded, ids, feats), logits_of(twin, ids, feats), rtol=0, atol=0)
    # the residual really is the normalised feature
    with torch.no_grad():
        h = twin.fuse(feats)
        layer = twin.midlayer
        x = torch.cat([layer.input_layernorm(twin.embed_tokens(ids)), layer.hidden_norm(h)], -1)
        pos = twin.rotary_emb(h, torch.arange(ids.shape[1]).expand(2, -1))
        a = layer.hidden_norm(h) + layer.self_attn(x, pos)
        expected = twin.lm_head(twin.norm(a + layer.mlp(layer.post_attention_layernorm(a))))
    torch.testing.assert_close(logits_of(twin, ids, feats), expected, rtol=1e-5, atol=1e-5)


def test_attention_bias_draft_is_refused_for_sglang(target, tmp_path):
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=AUX, attention_bias=True).eval()
    with pytest.raises(ValueError, match="attention_bias.*without bias.*--to vllm"):
        formats.export_draft(draft, tmp_path / "sglang", to="sglang")
    out = formats.export_draft(draft, tmp_path / "vllm", to="vllm", verifier="org/tiny-llama")
    assert "layers.0.self_attn.q_proj.bias" in load_file(str(out / "model.safetensors"))
    draft.save_pretrained(tmp_path / "ours")
    assert "sglang: q/k/v are built without bias (S2)" in sglang_problems(tmp_path / "ours", 4, trust_remote_code=True)


def test_hub_repo_with_only_a_pickle_names_it(tmp_path, monkeypatch):
    import huggingface_hub
    from hub_server import FakeHub, Repo

    tripwire = tmp_path / "unpickled"
    payload = pickle.dumps({"fc.weight": _Tripwire(tripwire)})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHub() as hub:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(
            huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        )
        files = {
            "config.json": json.dumps({"model_type": "llama", "draft_vocab_size": 200}).encode(),
            "pytorch_model.bin": payload,
        }
        hub.state.repos[("model", "org/bin-only")] = Repo(
            "org/bin-only", "model", False, files=files, commits=[{"oid": "a" * 40}]
        )
        with pytest.raises(
            ValueError,
            match=r"org/bin-only has only pickled weights \(pytorch_model.bin\).*never "
            r"unpickles.*arbitrary code.*safetensors",
        ):
            Eagle3DraftModel.from_pretrained("org/bin-only", cache_dir=tmp_path / "cache")
        assert not any(p.endswith("pytorch_model.bin") for _, p in hub.state.requests)  # never downloaded
    assert not tripwire.exists()


# ------------------------------------------------------------------------------ issue 28: bad files, clear errors
def test_truncated_safetensors_is_named(native, tmp_path):
    folder = _copy_native(native, tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors file.*truncated or corrupt.*again"):
        Eagle3DraftModel.from_pretrained(folder)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        convert_cli(folder, tmp_path / "out")


def test_config_that_is_not_json_is_named(native, tmp_path):
    folder = _copy_native(native, tmp_path)
    (folder / "config.json").write_text('{"model_type": "eagle3_draft", ')
    with pytest.raises(ValueError, match=r"config.json is not valid JSON.*corrupt or truncated"):
        Eagle3DraftModel.from_pretrained(folder)
    with pytest.raises(ValueError, match="is not valid JSON"):
        convert_cli(folder, tmp_path / "out")


def test_d2t_outside_the_vocabulary_is_caught_at_load_and_bind(native, target, tmp_path):
    folder = _copy_native(native, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state["d2t"][-1] = 10_000  # target id 10199 of a 256-token vocabulary
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"d2t maps draft ids to target ids .*outside its vocab_size 256"):
        Eagle3DraftModel.from_pretrained(folder)
    draft = randomized_draft(target)
    with torch.no_grad():
        draft.d2t[-1] = 10_000
    with pytest.raises(
        ValueError,
        match=r"does not fit the target: its d2t map sends draft ids to target ids .*"
        r"outside the target's 256 tokens",
    ):
        draft.check_fits(target)
    with pytest.raises(ValueError, match="d2t map"):
        draft.bind(target)


def test_convert_to_a_read_only_destination_names_it(native, tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root writes into 0o555 folders, not into sysfs
        if not Path("/sys/kernel").is_dir():
            pytest.skip("running as root without a sysfs to stand for a read-only place")
        parent = Path("/sys/kernel")
    else:
        parent = tmp_path / "ro"
        parent.mkdir()
        parent.chmod(0o555)
    try:
        with pytest.raises(
            PermissionError, match=rf"Cannot write the draft to {parent}/out: .*Choose a destination you can write to"
        ):
            convert_cli(native, parent / "out")
    finally:
        if parent.is_relative_to(tmp_path):
            parent.chmod(0o755)
    assert not (parent / "out").exists()
