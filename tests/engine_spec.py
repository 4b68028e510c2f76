"""What vLLM and SGLang require of an EAGLE-3 draft folder, as checks over its config.json and safetensors headers.

Written from the engines' loaders, re-read in the vLLM 0.33.0 and SGLang 0.5.23 wheels (read, not copied; paths as
in their repositories). tests/test_engines_loaders.py runs the engines' own code where it runs on a CPU (in the
venv of tests/engines/setup_venv.sh): vLLM's config parsing (V1, V2) and Eagle3LlamaForCausalLM.load_weights
(V4), SGLang's config loading; the rest (method detection, aux layers in the model runner, SGLang's weight
loading) stays checked here only.

vLLM (vllm-project/vllm)
  V1 vllm/transformers_utils/config.py, HFConfigParser.parse: a config.json with no ``model_type`` but a
     ``speculators_config`` is read by SpeculatorsConfig; any other ``model_type`` goes to transformers'
     AutoConfig, so an unknown one (ours, ``eagle3_draft``) needs ``--trust-remote-code``.
  V2 vllm/transformers_utils/configs/speculators/base.py: requires speculators_config.proposal_methods[0]
     .speculative_tokens, speculators_config.verifier.name_or_path, ``speculators_model_type`` and a
     ``transformer_layer_config`` dict, whose keys become the draft's config.
     .../speculators/algos.py (update_eagle3): reads ``draft_vocab_size``, ``target_hidden_size``,
     ``norm_before_residual`` (default **True** when absent), ``norm_before_fc``, ``fc_norm``, ``norm_output``
     (default False), top-level ``eagle_aux_hidden_state_layer_ids``; sets architectures to Eagle3LlamaForCausalLM.
  V3 vllm/config/speculative.py + vllm/transformers_utils/configs/eagle.py: other drafts are wrapped in
     EAGLEConfig; for method eagle3 an architecture that starts with "Eagle3" or ends with "Eagle3" is kept,
     any other gets the prefix "Eagle3"; the result must be in the registry
     (vllm/model_executor/models/registry.py _SPECULATIVE_DECODING_MODELS: Eagle3LlamaForCausalLM,
     LlamaForCausalLMEagle3 -> llama_eagle3.Eagle3LlamaForCausalLM).
  V4 vllm/model_executor/models/llama_eagle3.py: layer 0 q/k/v read 2*hidden_size (bias = attention_bias);
     hidden_norm, input_layernorm, post_attention_layernorm; residual is the raw fused feature unless
     ``norm_before_residual``; fc reads 3*target_hidden_size (``target_hidden_size`` or hidden_size), after
     ``input_norm`` (``norm_before_fc``) and ``fc_norm.{0,1,2}`` (``fc_norm``, EAGLE 3.1); ``norm_output`` feeds
     norm(h) back; lm_head has ``draft_vocab_size`` rows; load_weights renames ``midlayer.`` to ``layers.0.``,
     loads ``d2t`` as draft_id_to_target_id, skips ``t2d``, shares the target's embedding when ``embed_tokens`` is
     absent; any other tensor name fails the load. When draft_vocab_size equals the target's vocabulary no
     draft_id_to_target_id exists and a shipped ``d2t`` fails ("There is no module or parameter named ...").
     MLP: LlamaMLP, ``hidden_act`` must be silu.
  V5 vllm/v1/worker/gpu_model_runner.py (_get_eagle3_aux_layers_from_config): reads
     ``hf_config.eagle_aux_hidden_state_layer_ids`` (top level; newer versions fall back to
     ``eagle_config[...]`` as is); without ids the target's get_eagle3_aux_hidden_state_layers() gives
     (2, L//2, L-3). vllm/model_executor/models/llama.py LlamaModel.forward appends
     ``hidden_states + residual`` *before* running layer idx and after the last one: the ids are layer INPUTS,
     in 0..L (L = the last layer's output before the final norm).

SGLang (sgl-project/sglang)
  S1 python/sglang/srt/configs/model_config.py: config via transformers AutoConfig (``model_type`` must be known
     to transformers without remote code); the model class is the one ``architectures`` names: only
     "LlamaForCausalLMEagle3" is the EAGLE-3 draft (a "LlamaForCausalLM" folder is built as a plain Llama).
  S2 python/sglang/srt/models/llama_eagle3.py: LlamaForCausalLMEagle3; load_weights maps ``midlayer`` to
     ``layers.0`` and loads both spellings (and ``aux_norm_{low,mid,high}`` to ``fc_norm.{0,1,2}``); other names
     are skipped without an error; ``fc`` (bias = config.bias), ``input_norm`` (``norm_before_fc``), ``fc_norm``
     (``fc_norm`` or ``use_aux_norm``), ``norm``, ``lm_head`` (draft_vocab_size rows; ``tie_word_embeddings``
     would alias it to embed_tokens), ``d2t`` -> hot_token_id (optional), ``t2d`` skipped; q/k/v are built
     WITHOUT bias whatever attention_bias says; the first layer's residual is always the raw feature (no
     ``norm_before_residual``); ``norm_output`` feeds norm(h) back; MLP without bias, silu only. Rope from
     ``rope_theta`` (default 10000) and ``rope_scaling``.
  S3 python/sglang/srt/models/llama.py set_eagle3_layers_to_capture: ids from
     ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` (model_runner.py) get +1 ("for the ith layer, it
     takes the output of the (i-1)th layer"); LlamaModel.forward captures ``hidden_states + residual`` before
     layer i: the config ids are layer OUTPUTS, in 0..L-2. Without ids: (2, L//2, L-3) inputs.
  S4 set_embed: the target's embedding is shared unless target_hidden_size != hidden_size.

SpecForge's SGLang exporter (sgl-project/SpecForge specforge/export/to_sglang.py) additionally lists
fc.weight, norm.weight, lm_head.weight, t2d, d2t as the keys SGLang needs.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

# V3: registry names of vLLM's EAGLE-3 Llama draft
VLLM_EAGLE3_ARCHITECTURES = {"Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3"}
# S1: the draft architecture SGLang loads (no rename of LlamaForCausalLM)
SGLANG_EAGLE3_ARCHITECTURES = {"LlamaForCausalLMEagle3"}

LAYER_TENSORS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


def read_folder(folder) -> tuple[dict, dict[str, tuple[tuple[int, ...], str]]]:
    """(config.json, name -> (shape, safetensors dtype)). Never opens a pickle: an engine folder without
    safetensors fails the spec."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    shapes = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                shapes[name] = (tuple(sl.get_shape()), sl.get_dtype())
    return config, shapes


def _layer_config(config: dict) -> tuple[dict, str]:
    """The dict the engine builds the draft layer from, and which path it took (V1/V2/V3)."""
    if config.get("model_type") is None and config.get("speculators_config") is not None:
        layer = dict(config.get("transformer_layer_config") or {})
        for key in ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids"):
            if key in config:
                layer[key] = config[key]
        for key in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
            if key in config:
                layer[key] = config[key]
        return layer, "speculators"
    return config, "hf"


def _tensor_problems(layer: dict, shapes: dict, names: dict[str, str], engine: str) -> list[str]:
    """Shapes of the draft tensors as the engine builds them from ``layer``. ``names``: engine name -> file name."""
    problems = []
    H = layer.get("hidden_size")
    heads = layer.get("num_attention_heads")
    if not H or not heads:
        return [f"{engine}: config has no hidden_size / num_attention_heads"]
    kv = layer.get("num_key_value_heads") or heads
    head_dim = layer.get("head_dim") or H // heads
    inter = layer.get("intermediate_size")
    Ht = layer.get("target_hidden_size") or H
    vocab = layer.get("vocab_size")
    draft_vocab = layer.get("draft_vocab_size") or vocab
    expected = {
        "fc.weight": (H, 3 * Ht),
        **({f"fc_norm.{i}.weight": (Ht,) for i in range(3)} if layer.get("fc_norm") or layer.get("use_aux_norm") else {}),
        **({"input_norm.weight": (3 * Ht,)} if layer.get("norm_before_fc") else {}),
        "norm.weight": (H,),
        "lm_head.weight": (draft_vocab, H),
        "layers.0.self_attn.q_proj.weight": (heads * head_dim, 2 * H),
        "layers.0.self_attn.k_proj.weight": (kv * head_dim, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv * head_dim, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, heads * head_dim),
        "layers.0.mlp.gate_proj.weight": (inter, H),
        "layers.0.mlp.up_proj.weight": (inter, H),
        "layers.0.mlp.down_proj.weight": (H, inter),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
    }
    for i in range(1, int(layer.get("num_hidden_layers", 1))):  # V4: later layers read hidden_size
        expected.update(
            {
                f"layers.{i}.self_attn.q_proj.weight": (heads * head_dim, H),
                f"layers.{i}.self_attn.k_proj.weight": (kv * head_dim, H),
                f"layers.{i}.self_attn.v_proj.weight": (kv * head_dim, H),
                f"layers.{i}.self_attn.o_proj.weight": (H, heads * head_dim),
                f"layers.{i}.mlp.gate_proj.weight": (inter, H),
                f"layers.{i}.mlp.up_proj.weight": (inter, H),
                f"layers.{i}.mlp.down_proj.weight": (H, inter),
                f"layers.{i}.input_layernorm.weight": (H,),
                f"layers.{i}.post_attention_layernorm.weight": (H,),
            }
        )
    optional = {"embed_tokens.weight": (vocab, H), "d2t": (draft_vocab,), "t2d": (vocab,)}
    for name, shape in expected.items():
        file_name = names.get(name, name)
        if file_name not in shapes:
            problems.append(f"{engine}: missing tensor {file_name}")
        elif shapes[file_name][0] != shape:
            problems.append(f"{engine}: {file_name} is {list(shapes[file_name][0])}, the engine builds {list(shape)}")
    for name, shape in optional.items():
        if name in shapes and shapes[name][0] != shape:
            problems.append(f"{engine}: {name} is {list(shapes[name][0])}, the engine builds {list(shape)}")
    if draft_vocab != vocab and "d2t" not in shapes:
        problems.append(f"{engine}: draft_vocab_size {draft_vocab} < vocab_size {vocab} but no d2t map")
    if engine == "vllm" and draft_vocab == vocab and "d2t" in shapes:
        problems.append(
            "vllm: a full-vocabulary draft has no draft_id_to_target_id parameter: the shipped d2t fails the load (V4)"
        )
    if "d2t" in shapes and shapes["d2t"][1] != "I64":
        problems.append(f"{engine}: d2t must be int64, is {shapes['d2t'][1]}")
    if "t2d" in shapes and shapes["t2d"][1] != "BOOL":
        problems.append(f"{engine}: t2d must be bool, is {shapes['t2d'][1]}")
    known = {names.get(n, n) for n in expected} | set(optional)
    if engine == "sglang":  # S2: both spellings of the layer load
        known |= {n.replace("layers.0.", "midlayer.") for n in expected} | set(expected)
    extra = sorted(set(shapes) - known)
    if extra:
        problems.append(f"{engine}: tensors the loader does not know (KeyError in vLLM, silently dropped by SGLang): {extra}")
    return problems


def _common_layer_problems(layer: dict, engine: str) -> list[str]:
    problems = []
    if layer.get("hidden_act", "silu") != "silu":
        problems.append(f"{engine}: hidden_act {layer.get('hidden_act')!r}, the engine's Llama MLP is silu only")
    # V4: vLLM builds num_hidden_layers layers (layers.{i}, i >= 1 plain Llama layers) and windows the layers that
    # layer_types names; S2: SGLang's additional_layers take another input and its Llama attention has no window
    if engine == "sglang" and int(layer.get("num_hidden_layers", 1)) != 1:
        problems.append(f"{engine}: num_hidden_layers must be 1 for a single-layer EAGLE-3 draft")
    if layer.get("tie_word_embeddings"):
        problems.append(f"{engine}: tie_word_embeddings would alias lm_head to the embedding")
    if layer.get("mlp_bias"):
        problems.append(f"{engine}: mlp_bias is not supported by the engine's Llama MLP")
    if engine == "sglang" and "sliding_attention" in (layer.get("layer_types") or []):
        problems.append(f"{engine}: the draft must not declare sliding-window attention")
    if "rope_theta" not in layer:
        problems.append(f"{engine}: no top-level rope_theta (engines on transformers v4 would use 10000)")
    for key in ("vocab_size", "draft_vocab_size", "intermediate_size", "rms_norm_eps", "num_key_value_heads"):
        if layer.get(key) is None:
            problems.append(f"{engine}: config has no {key}")
    return problems


def vllm_problems(folder, num_target_layers: int | None = None, trust_remote_code: bool = False) -> list[str]:
    """Everything that stops vLLM (``--speculative-config '{"method": "eagle3", "model": folder}'``) from
    serving ``folder`` as the EAGLE-3 draft it is; [] when it can."""
    config, shapes = read_folder(folder)
    layer, path = _layer_config(config)
    problems = []
    if path == "speculators":
        sc = config["speculators_config"]
        try:
            sc["proposal_methods"][0]["speculative_tokens"]
            sc["verifier"]["name_or_path"]
        except (KeyError, IndexError, TypeError):
            problems.append(
                "vllm: speculators_config needs proposal_methods[0].speculative_tokens and verifier.name_or_path (V2)"
            )
        if config.get("speculators_model_type") != "eagle3":
            problems.append("vllm: speculators_model_type must be 'eagle3' (V2)")
        if not isinstance(config.get("transformer_layer_config"), dict):
            problems.append("vllm: transformer_layer_config must be a dict (V2)")
        names = {}  # V4: layers.0.* is the module name itself
    else:
        model_type = config.get("model_type")
        if model_type not in CONFIG_MAPPING_NAMES and not trust_remote_code:
            problems.append(f"vllm: model_type {model_type!r} is unknown to transformers: needs --trust-remote-code (V1)")
        archs = config.get("architectures") or []
        renamed = [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in archs]  # V3
        if not renamed or renamed[0] not in VLLM_EAGLE3_ARCHITECTURES:
            problems.append(f"vllm: architectures {archs} do not map to vLLM's EAGLE-3 draft (V3)")
        names = {n: ("midlayer." + n[len("layers.0.") :]) for n in (f"layers.0.{t}" for t in LAYER_TENSORS)}
        if config.get("use_aux_norm"):
            problems.append("vllm: use_aux_norm (SGLang's old spelling of fc_norm) is not read by vLLM: say fc_norm (V4)")
        if not all(f"midlayer.{t}" in shapes for t in LAYER_TENSORS) and all(f"layers.0.{t}" in shapes for t in LAYER_TENSORS):
            names = {}  # vLLM also reads layers.0.* directly
    if path == "speculators" and "norm_before_residual" not in config:
        problems.append(
            "vllm: the speculators config has no norm_before_residual: vLLM reads True, the speculators library False (V2)"
        )
    eagle = layer.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state") is False:
        problems.append("vllm: eagle_config.use_aux_hidden_state is false: fc would be skipped (V4)")
    ids = vllm_aux_layer_inputs(folder)
    if ids is None:
        problems.append("vllm: no top-level eagle_aux_hidden_state_layer_ids: vLLM falls back to the target's default (V5)")
    elif num_target_layers is not None and any(not 0 < i <= num_target_layers for i in ids):
        problems.append(f"vllm: eagle_aux_hidden_state_layer_ids {ids} must be layer inputs in 1..{num_target_layers} (V5)")
    problems += _common_layer_problems(layer, "vllm")
    problems += _tensor_problems(layer, shapes, names, "vllm")
    return problems


def sglang_problems(folder, num_target_layers: int | None = None, trust_remote_code: bool = False) -> list[str]:
    """Everything that stops SGLang (``--speculative-algorithm EAGLE3 --speculative-draft-model-path folder``)
    from serving ``folder``; [] when it can."""
    config, shapes = read_folder(folder)
    problems = []
    model_type = config.get("model_type")
    if model_type is None:
        problems.append("sglang: config.json has no model_type; transformers' AutoConfig cannot read it (S1)")
    elif model_type not in CONFIG_MAPPING_NAMES and not trust_remote_code:
        problems.append(f"sglang: model_type {model_type!r} is unknown to transformers: needs --trust-remote-code (S1)")
    archs = config.get("architectures") or []
    if not archs or archs[0] not in SGLANG_EAGLE3_ARCHITECTURES:
        problems.append(f"sglang: architectures {archs} is not SGLang's EAGLE-3 draft class (S1)")
    if config.get("attention_bias") or config.get("bias"):
        problems.append("sglang: q/k/v are built without bias (S2)")
    if config.get("norm_before_residual"):
        problems.append("sglang: norm_before_residual is not implemented: the residual is the raw feature (S2)")
    if config.get("draft_vocab_size") is None:
        problems.append("sglang: no draft_vocab_size: lm_head would be loaded from the target (S2)")
    if (config.get("target_hidden_size") or config.get("hidden_size")) != config.get(
        "hidden_size"
    ) and "embed_tokens.weight" not in shapes:
        problems.append("sglang: target_hidden_size != hidden_size needs the draft's own embed_tokens (S4)")
    ids = sglang_aux_layer_inputs(folder)
    if ids is None:
        problems.append("sglang: no eagle_config.eagle_aux_hidden_state_layer_ids: SGLang uses its default (S3)")
    elif num_target_layers is not None and any(not 0 < i < num_target_layers for i in ids):
        problems.append(f"sglang: the captured layer inputs {ids} must be in 1..{num_target_layers - 1} (S3)")
    for name in ("fc.weight", "norm.weight", "lm_head.weight"):
        if name not in shapes:
            problems.append(f"sglang: missing tensor {name}")
    names = {}  # S2: midlayer.* and layers.0.* both load
    if all(f"midlayer.{t}" in shapes for t in LAYER_TENSORS):
        names = {f"layers.0.{t}": f"midlayer.{t}" for t in LAYER_TENSORS}
    for i, legacy in enumerate(("low", "mid", "high")):  # S2: SGLang's older fc_norm names
        if f"aux_norm_{legacy}.weight" in shapes:
            names[f"fc_norm.{i}.weight"] = f"aux_norm_{legacy}.weight"
    problems += _common_layer_problems(config, "sglang")
    problems += _tensor_problems(config, shapes, names, "sglang")
    return problems


def vllm_aux_layer_inputs(folder) -> list[int] | None:
    """The target layers whose INPUT vLLM captures for this draft (V5), or None for its default."""
    config, _ = read_folder(folder)
    layer, _ = _layer_config(config)
    ids = layer.get("eagle_aux_hidden_state_layer_ids")
    if not ids:  # newer vLLM: eagle_config ids as they are
        ids = (layer.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else None


def sglang_aux_layer_inputs(folder) -> list[int] | None:
    """The target layers whose INPUT SGLang captures for this draft (S3: config ids + 1), or None."""
    config, _ = read_folder(folder)
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return [i + 1 for i in ids] if ids is not None else None
