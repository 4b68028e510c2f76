"""vLLM 0.33.0's and SGLang 0.5.23's own code on the folders ``convert`` writes (tiny random drafts).

Runs only in the engines venv (tests/engines/README.md, tests/engines/setup_venv.sh); skipped elsewhere. What the
engines do that cannot run on a CPU stays in tests/engine_spec.py (see the README for the exact calls).
"""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch
from safetensors.torch import load_file

SETUP = "bash tests/engines/setup_venv.sh && PYTHONPATH=. /work/engines-venv/bin/python -m pytest tests/test_engines_loaders.py"
for _engine in ("vllm", "sglang"):
    if importlib.util.find_spec(_engine) is None:
        pytest.skip(
            f"{_engine} is not installed (the engines' own loaders run in a separate venv: {SETUP})", allow_module_level=True
        )

from tiny_models import make_tiny_target  # noqa: E402

from eagle3_hub import Eagle3DraftModel, formats  # noqa: E402

AUX = [0, 1, 2]
DRAFTS = {  # name -> Eagle3DraftModel.from_target options
    "small_vocab": dict(draft_vocab_size=200),
    "full_vocab": dict(draft_vocab_size=256),
    "eagle31": dict(draft_vocab_size=200, fc_norm=True, norm_output=True),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{(draft, layout): folder} written by ``formats.convert`` from a native folder, plus the target folder."""
    root = tmp_path_factory.mktemp("engines")
    target = make_tiny_target("llama")
    target.save_pretrained(root / "target")
    out = {"target": root / "target"}
    for name, options in DRAFTS.items():
        draft = Eagle3DraftModel.from_target(target, aux_layer_ids=AUX, **options)
        with torch.no_grad():
            for p in draft.parameters():
                p.normal_()
        if options["draft_vocab_size"] < 256:
            g = torch.Generator().manual_seed(0)
            draft.set_vocab_mapping(torch.randperm(256, generator=g)[:200].sort().values)
        draft.save_pretrained(root / f"{name}-ours")
        for to in ("vllm", "sglang"):
            out[name, to] = formats.convert(root / f"{name}-ours", root / f"{name}-{to}", to=to, target=str(root / "target"))
    return out


CASES = [(name, to) for name in DRAFTS for to in ("vllm", "sglang")]


# ---------------------------------------------------------------------------------------------- vLLM
@pytest.mark.parametrize("name, to", CASES)
def test_vllm_parses_the_config(folders, name, to):
    """vllm.transformers_utils.config.get_config (speculators detection for --to vllm, AutoConfig otherwise) and the
    EAGLE-3 wrapping of vllm.transformers_utils.configs.eagle.EAGLEConfig, without remote code."""
    from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    config = get_config(str(folders[name, to]), trust_remote_code=False)
    assert type(config).__name__ == ("SpeculatorsConfig" if to == "vllm" else "LlamaConfig")
    wrapped = EAGLEConfig(model=config, method="eagle3")
    assert wrapped.architectures[0] in _SPECULATIVE_DECODING_MODELS
    assert config.draft_vocab_size == DRAFTS[name]["draft_vocab_size"]
    assert list(config.eagle_aux_hidden_state_layer_ids) == formats.to_vllm_aux_layer_ids(AUX)  # vLLM: layer inputs
    assert bool(getattr(config, "fc_norm", False)) == bool(DRAFTS[name].get("fc_norm"))
    assert bool(getattr(config, "norm_output", False)) == bool(DRAFTS[name].get("norm_output"))
    assert bool(getattr(config, "norm_before_residual", True)) is False  # speculators reader defaults it to True


@pytest.fixture(scope="module")
def vllm_runtime():
    """vLLM's CPU platform, a one-process gloo group and a current VllmConfig: what building the draft needs.

    vLLM detects no platform here (no CUDA, no vLLM CPU build), and UnspecifiedPlatform names no attention backend;
    the CpuPlatform picks vLLM's own CPU attention backend class, which is only constructed, never run."""
    import vllm.platforms
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method="tcp://127.0.0.1:0"
        )
        initialize_model_parallel(1, 1)
        yield config


def build_vllm_draft(vllm_config, folder, target_vocab=256, target_layers=4):
    """vllm Eagle3LlamaForCausalLM from the draft's parsed config. ModelConfig needs a servable target and a
    platform it can profile, so the draft's model config is the engine-parsed hf_config plus the few attributes
    the constructors read."""
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
    from vllm.transformers_utils.config import get_config

    hf_config = get_config(str(folder), trust_remote_code=False)
    model_config = types.SimpleNamespace(
        hf_config=hf_config,
        dtype=torch.float32,
        head_dtype=torch.float32,
        quantization=None,
        is_mm_prefix_lm=False,
        rswa_window=None,
        get_total_num_hidden_layers=lambda: target_layers,
        get_vocab_size=lambda: target_vocab,
    )
    speculative = types.SimpleNamespace(
        draft_model_config=model_config, parallel_drafting=False, enable_adaptive_verification=False
    )
    object.__setattr__(vllm_config, "model_config", model_config)
    object.__setattr__(vllm_config, "speculative_config", speculative)
    vllm_config.compilation_config.static_forward_context.clear()  # one draft per VllmConfig in vLLM
    return Eagle3LlamaForCausalLM(vllm_config=vllm_config)


@pytest.mark.parametrize("name, to", CASES)
def test_vllm_draft_loads_every_tensor(vllm_runtime, folders, name, to):
    """Eagle3LlamaForCausalLM.load_weights on the folder's tensors: every name maps (an unknown one raises), and
    the loaded parameters are the folder's (q/k/v and gate/up stacked, d2t as draft_id_to_target_id)."""
    model = build_vllm_draft(vllm_runtime, folders[name, to])
    state = load_file(str(folders[name, to] / "model.safetensors"))
    model.load_weights(state.items())
    layer = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
    params = dict(model.named_parameters())
    torch.testing.assert_close(params["model.fc.weight"], layer["fc.weight"], rtol=0, atol=0)
    torch.testing.assert_close(
        params["lm_head.weight"][: layer["lm_head.weight"].shape[0]], layer["lm_head.weight"], rtol=0, atol=0
    )
    qkv = torch.cat([layer[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    torch.testing.assert_close(params["model.layers.0.self_attn.qkv_proj.weight"], qkv, rtol=0, atol=0)
    for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        torch.testing.assert_close(params[f"model.layers.0.{n}.weight"], layer[f"layers.0.{n}.weight"], rtol=0, atol=0)
    if DRAFTS[name].get("fc_norm"):
        for i in range(3):
            torch.testing.assert_close(params[f"model.fc_norm.{i}.weight"], layer[f"fc_norm.{i}.weight"], rtol=0, atol=0)
    if DRAFTS[name]["draft_vocab_size"] == 256:
        assert model.draft_id_to_target_id is None and "d2t" not in state  # vLLM has no map for a full vocabulary
    else:
        torch.testing.assert_close(model.draft_id_to_target_id.data, layer["d2t"], rtol=0, atol=0)


def test_vllm_refuses_a_full_vocabulary_draft_that_ships_d2t(vllm_runtime, folders):
    """Why full-vocabulary folders ship no d2t: vLLM's own loader fails on it."""
    model = build_vllm_draft(vllm_runtime, folders["full_vocab", "vllm"])
    state = load_file(str(folders["full_vocab", "vllm"] / "model.safetensors"))
    state["d2t"] = torch.zeros(256, dtype=torch.long)
    with pytest.raises(ValueError, match="draft_id_to_target_id"):
        model.load_weights(state.items())


# ---------------------------------------------------------------------------------------------- SGLang
@pytest.mark.parametrize("name", list(DRAFTS))
def test_sglang_reads_the_config(folders, name):
    """sglang.srt.utils.hf_transformers.config.get_config: AutoConfig without remote code, the EAGLE-3 class named."""
    from sglang.srt.utils.hf_transformers.config import get_config

    config = get_config(str(folders[name, "sglang"]), trust_remote_code=False)
    assert config.architectures == ["LlamaForCausalLMEagle3"]
    assert config.eagle_config["eagle_aux_hidden_state_layer_ids"] == AUX  # SGLang adds 1: layer outputs
    assert config.draft_vocab_size == DRAFTS[name]["draft_vocab_size"]
    assert bool(getattr(config, "fc_norm", False)) == bool(DRAFTS[name].get("fc_norm"))
