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
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from eagle3_hub import Eagle3DraftModel
from eagle3_hub import formats
from eagle3_hub.commands import convert as convert_command
from tests.engine_spec import sglang_aux_layer_inputs, sglang_problems, vllm_aux_layer_inputs, vllm_problems
from tests.tiny_models import make_tiny_target

AUX = [0, 1, 2]  # 4-layer tiny targets: layer outputs 0..2 (engines cannot capture the last layer's output)


def randomized_draft(target, aux_layer_ids=AUX, draft_vocab_size=200, seed=0) -> Eagle3DraftModel:
    """A draft for ``target`` whose every weight is random (norms included) and whose vocabulary map is a
    random subset, so that any swapped or dropped tensor changes the logits."""
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=aux_layer_ids, draft_vocab_size=draft_vocab_size)
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
        config = {**layer, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "draft_vocab_size": draft.config.draft_vocab_size, "transformers_version": "4.28.1"}
    elif layout == "specforge":  # SpecForge configs/*-eagle3.json + eagle_config as in gpt-oss / qwen3 configs
        config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                  "draft_vocab_size": draft.config.draft_vocab_size, "attention_bias": False,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": draft.config.aux_layer_ids},
                  "target_model_type": "llama"}
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
        state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    else:
        raise ValueError(layout)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# ------------------------------------------------------------------------------ our folder
def test_native_folder_holds_weights_code_and_engine_keys(native, draft):
    files = sorted(p.name for p in native.iterdir())
    assert "model.safetensors" in files and not [f for f in files if f.endswith((".bin", ".pt", ".pth"))]
    package = Path(formats.__file__).parent
    for name in formats.CODE_FILES:
        assert (native / name).read_text() == (package / name).read_text()
    assert (native / "custom_generate" / "generate.py").read_text() == (package / "generation" / "tree_decoding.py").read_text()
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
        [sys.executable, "-c", REMOTE_SCRIPT, str(native), str(tmp_path / "inputs.safetensors"), str(tmp_path / "out.safetensors")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
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
    hooks = [layers[i].register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o[0] if isinstance(o, tuple) else o)) for i in AUX]
    hooks += [
        layers[j].register_forward_pre_hook(lambda m, a, kw, j=j: inputs.__setitem__(j, (a[0] if a else kw["hidden_states"])), with_kwargs=True)
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


def test_engine_export_refuses_last_layer_aux(tmp_path):
    target = make_tiny_target("llama")
    draft = randomized_draft(target, aux_layer_ids=[0, 1, 3])  # 3 = output of the last layer
    with pytest.raises(ValueError, match="last layer.*0..2"):
        formats.export_draft(draft, tmp_path / "x", to="sglang")
    draft.save_pretrained(tmp_path / "ours")  # fine for transformers
    assert any("1..3" in p for p in vllm_problems(tmp_path / "ours", num_target_layers=4))


def test_rope_scaling_survives_every_layout(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
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
    with pytest.raises(ValueError, match=r"lm_head.weight is \[200, 64\], expected \[100, 64\] \[draft_vocab_size, hidden_size\]"):
        Eagle3DraftModel.from_pretrained(folder)


def test_misshaped_foreign_fc_is_named(deep_draft, tmp_path):
    folder = write_foreign(deep_draft, tmp_path / "sf", "specforge")
    config = json.loads((folder / "config.json").read_text())
    config["target_hidden_size"] = 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"fc.weight is \[64, 192\], expected \[64, 96\] \[hidden_size, 3 \* target_hidden_size\]"):
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
