"""The published layouts: detection, their config dicts read as an ``Eagle3Config``, tensor checks, and the
loading hook of ``Eagle3DraftModel.from_pretrained`` for the foreign ones."""

from __future__ import annotations

import logging

import torch

from ..configuration_eagle3 import Eagle3Config
from .aux_layers import engine_default_aux_layer_ids, resolve_aux_layer_ids
from .fields import check_fields
from .files import read_config_dict, resolve_folder, tensor_shapes

logger = logging.getLogger(__name__)

# the class name both engines map to their EAGLE-3 draft (vLLM registry, SGLang EntryClass)
ENGINE_ARCHITECTURE = "LlamaForCausalLMEagle3"
LAYOUTS = ("ours", "eagle", "specforge", "speculators")
VARIANT_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# expert counts of transformers' MoE configs (qwen3_moe, gpt_oss / mixtral, deepseek)
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def detect_layout(config: dict, shapes: dict | None = None, source: str = "this checkpoint") -> str:
    """One of ``LAYOUTS``, or a ValueError naming what the checkpoint is instead."""
    if "speculators_model_type" in config or "speculators_config" in config:
        kind = config.get("speculators_model_type")
        if kind != "eagle3":
            raise ValueError(
                f"{source} is a speculators '{kind}' checkpoint, not an EAGLE-3 draft (speculators_model_type must be 'eagle3')."
            )
        return "speculators"
    model_type = config.get("model_type")
    if model_type == Eagle3Config.model_type:
        return "ours"
    archs = config.get("architectures") or []
    names = set(shapes or ())
    has_draft_tensors = "fc.weight" in names and any(n.startswith(("midlayer.", "layers.0.")) for n in names)
    if shapes is not None and "fc.weight" in names and config.get("hidden_size"):
        width = shapes["fc.weight"][0][1]
        hidden = config.get("target_hidden_size") or config["hidden_size"]
        if width == 2 * hidden:
            raise ValueError(
                f"{source} is an EAGLE-1/EAGLE-2 draft (fc reads 2 * hidden_size = {width}); Eagle3DraftModel "
                "loads EAGLE-3 drafts (fc reads 3 * hidden_size)."
            )
    if ENGINE_ARCHITECTURE in archs or any("eagle3" in a.lower() for a in archs):
        return "specforge"
    if "draft_vocab_size" in config or "eagle_config" in config or has_draft_tensors:
        return "eagle"
    raise ValueError(
        f"{source} is not an EAGLE-3 draft: its config says model_type={model_type!r}, architectures={archs}, and "
        "it has no fc/midlayer tensors. If it is the target model, pass it as `target=` (or --target), not as the "
        "draft."
    )


# ---------------------------------------------------------------------------------------------- configs
def variant_flags(config: dict, layout: str, source: str = "this checkpoint") -> dict[str, bool]:
    """The four variant keys of a draft config, each resolved the way the engines that serve ``layout`` read it."""
    flags = {flag: bool(config.get(flag, False)) for flag in VARIANT_FLAGS}
    eagle = config.get("eagle_config") or {}
    if "norm_before_fc" in eagle:  # vLLM and SGLang read eagle_config's first
        flags["norm_before_fc"] = bool(eagle["norm_before_fc"])
    if config.get("use_aux_norm"):  # SGLang's older spelling of fc_norm
        flags["fc_norm"] = True
    if layout == "speculators" and "norm_before_residual" not in config:
        logger.warning(
            "%s: the speculators config has no norm_before_residual. The speculators library reads it as False (used "
            'here), vLLM as True, so vLLM would serve a different draft. Add "norm_before_residual": false (or true, '
            "if the draft was trained so) to its config.json, or `eagle3-hub convert` it: our folders state it.",
            source,
        )
    if layout in ("eagle", "specforge") and flags["norm_output"] and not flags["fc_norm"]:
        logger.warning(
            "%s sets norm_output=true: vLLM and SGLang feed norm(h) back to the next draft step (the EAGLE 3.1 post-norm "
            "feedback), and so does this load. Older SpecForge configs used norm_output=true for the reference "
            "draft (logits from norm(h), raw feedback); for such a draft pass norm_output=False and fix its config.json.",
            source,
        )
    return flags


def _multimodal_rope(config: dict) -> dict | None:
    """The rope dict of a multimodal-rope (mrope) config, else None."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
            rope = rope["full_attention"]
        if not isinstance(rope, dict):
            continue
        if "mrope_section" in rope or rope.get("mrope_interleaved") or "mrope" in (rope.get("rope_type"), rope.get("type")):
            return rope
    return {} if config.get("use_mrope") else None


def _check_structure(config: dict, source: str):
    # before the tie check: vision-language drafts (AngelSlim's *-vl-*-mrope configs) copy the target's
    # tie_word_embeddings, which cannot hold for a reduced draft vocabulary and is not why they cannot load
    mrope = _multimodal_rope(config)
    if mrope is not None:
        what = "mrope:" + (f" mrope_section={mrope['mrope_section']}" if "mrope_section" in mrope else "")
        what += " interleaved" if mrope.get("mrope_interleaved") else ""
        what += f", target {config['target_model_type']}" if config.get("target_model_type") else ""
        raise ValueError(
            f"{source} uses multimodal rope ({what}): it rotates queries and keys by the (temporal, height, width) "
            "positions a vision-language target gives image and video tokens, and Eagle3DraftModel implements the 1-D "
            "rope of text targets. Serve it with the stack it was trained with (e.g. AngelSlim for its Qwen-VL drafts), "
            "or train a text-only draft (rope without mrope_section)."
        )
    if config.get("tie_word_embeddings"):
        raise ValueError(
            f"{source} ties lm_head to embed_tokens; an EAGLE-3 draft has its own lm_head over the draft vocabulary."
        )
    # SpecForge's MoE drafts (e.g. Qwen3MoEForCausalLMEagle3) keep the Llama config keys: without this they would be
    # read as a dense layer and fail later on a list of unexpected expert tensors
    experts = {k: config[k] for k in MOE_KEYS if isinstance(config.get(k), int) and config[k] > 0}
    if experts:
        key, n = next(iter(experts.items()))
        raise ValueError(
            f"{source} is a mixture-of-experts draft ({key}={n}, architectures={config.get('architectures')}); "
            "Eagle3DraftModel implements the dense Llama draft layer of EAGLE-3: serve this draft with the engine it "
            "was trained for (SGLang), or train a dense draft."
        )


def _llama_kwargs(layer: dict, source: str) -> dict:
    """Eagle3Config kwargs from a Llama-style config dict (the draft layer)."""
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads") if k not in layer]
    if missing:
        raise ValueError(f"{source}'s config has no {missing}: it cannot describe an EAGLE-3 draft layer.")
    kwargs = {
        k: layer[k]
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "attention_bias",
            "mlp_bias",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "num_hidden_layers",
        )
        if layer.get(k) is not None
    }
    if layer.get("layer_types") is not None:  # engines and speculators window a layer only where layer_types says so
        kwargs["layer_types"] = layer["layer_types"]
        kwargs["sliding_window"] = layer.get("sliding_window")
    if layer.get("rope_parameters"):
        rope = dict(layer["rope_parameters"])
        if "full_attention" in rope:
            rope = dict(rope["full_attention"])
        kwargs["rope_parameters"] = rope
    else:
        kwargs["rope_theta"] = layer.get("rope_theta", 10000.0)
        kwargs["rope_scaling"] = layer.get("rope_scaling")
    dtype = layer.get("dtype") or layer.get("torch_dtype")
    if dtype:
        kwargs["dtype"] = dtype
    return kwargs


def aux_layer_ids_in_config(config: dict, source: str = "this checkpoint") -> list[int] | None:
    """Our aux ids from a Llama-style draft config (``resolve_aux_layer_ids`` for the SGLang/SpecForge layout)."""
    return resolve_aux_layer_ids(config, "specforge", source)


def config_from_layout(
    config: dict,
    layout: str,
    aux_layer_ids: list[int] | None = None,
    num_target_layers: int | None = None,
    source: str = "this checkpoint",
    aux_layer_convention: str | None = None,
    overrides: dict | None = None,
) -> Eagle3Config:
    """An ``Eagle3Config`` for a foreign config dict. Aux ids: ``aux_layer_ids`` if given, else the config's
    (``resolve_aux_layer_ids``), else the engines' default for ``num_target_layers`` layers, else unset.
    ``overrides``: Eagle3Config keys that replace the file's (e.g. ``norm_output=False``)."""
    if layout == "speculators":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"{source} is a speculators checkpoint without a transformer_layer_config dict.")
        if layer.get("model_type", "llama") != "llama":
            raise ValueError(
                f"{source}'s draft layer is a {layer.get('model_type')!r} layer; Eagle3DraftModel implements the "
                "Llama draft layer of EAGLE-3 (speculators' qwen3 layer adds q/k norms)."
            )
        _check_structure(layer, source)
        check_fields(config, source)
        check_fields(layer, source, "transformer_layer_config")
        kwargs = _llama_kwargs(layer, source)
    else:
        _check_structure(config, source)
        check_fields(config, source)
        kwargs = _llama_kwargs(config, source)
    kwargs.update(variant_flags(config, layout, source))
    if aux_layer_ids is not None:
        ids = aux_layer_ids
    else:
        ids = resolve_aux_layer_ids(config, layout, source, num_target_layers, aux_layer_convention)
    if ids is None and num_target_layers is not None:
        ids = engine_default_aux_layer_ids(num_target_layers)
    kwargs["draft_vocab_size"] = config.get("draft_vocab_size") or kwargs["vocab_size"]
    kwargs["target_hidden_size"] = config.get("target_hidden_size") or kwargs["hidden_size"]
    kwargs["eagle_config"] = {"use_aux_hidden_state": True}
    if ids is not None:
        kwargs["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in ids]
    kwargs["target_num_hidden_layers"] = num_target_layers or config.get("target_num_hidden_layers")
    kwargs["target_model_type"] = config.get("target_model_type")
    kwargs.update(overrides or {})
    try:
        return Eagle3Config(**kwargs)
    except ValueError as e:  # e.g. layer_types that do not match num_hidden_layers: name the file
        raise ValueError(f"{source}'s config.json: {e}") from None


_LEGACY_NAMES = {"aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.", "aux_norm_high.": "fc_norm.2."}


def _key_mapping() -> dict[str, str]:
    """File tensor name -> ours, as transformers' ``key_mapping`` (both engines read these spellings too)."""
    mapping = {r"^layers\.0\.": "midlayer."}  # layers 1.. keep their names (ours are vLLM's and speculators')
    mapping.update({"^" + old.replace(".", r"\."): new for old, new in _LEGACY_NAMES.items()})
    return mapping


def _our_name(name: str) -> str:
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0.") :]
    for old, new in _LEGACY_NAMES.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


# ---------------------------------------------------------------------------------------------- tensor checks
_SHAPE_HINTS = {
    "embed_tokens.weight": "[vocab_size, hidden_size]",
    "fc.weight": "[hidden_size, 3 * target_hidden_size]",
    "input_norm.weight": "[3 * target_hidden_size]",
    "lm_head.weight": "[draft_vocab_size, hidden_size]",
    "d2t": "[draft_vocab_size]",
    "t2d": "[vocab_size]",
    "q_proj": "[num_attention_heads * head_dim, 2 * hidden_size]",
    "k_proj": "[num_key_value_heads * head_dim, 2 * hidden_size]",
    "v_proj": "[num_key_value_heads * head_dim, 2 * hidden_size]",
    "o_proj": "[hidden_size, num_attention_heads * head_dim]",
    "gate_proj": "[intermediate_size, hidden_size]",
    "up_proj": "[intermediate_size, hidden_size]",
    "down_proj": "[hidden_size, intermediate_size]",
}


def expected_tensors(cls, config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor ``cls(config)`` stores (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = cls(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_tensors(cls, config: Eagle3Config, shapes: dict, layout: str, source: str) -> bool:
    """Raise a clear error for missing, unexpected or misshaped tensors. Returns whether the checkpoint has its
    own ``embed_tokens.weight``."""
    expected = expected_tensors(cls, config)
    present = {_our_name(n): s for n, (s, _) in shapes.items()}
    optional = {"embed_tokens.weight"}
    if config.draft_vocab_size == config.vocab_size:
        optional |= {"d2t", "t2d"}  # full vocabulary: identity map
    if layout != "ours" and "d2t" in present:
        # ModelOpt's exporter writes d2t but never t2d (vLLM and SGLang read d2t only): load_foreign_draft rebuilds
        # t2d from d2t. Our own folders always write both, so a missing t2d there stays an error.
        optional.add("t2d")
    missing = sorted(set(expected) - set(present) - optional)
    unexpected = sorted(set(present) - set(expected))
    if "t2d" in present and "d2t" not in present:
        missing.append("d2t")
    misshaped = []
    for name in sorted(set(present) & set(expected)):
        if tuple(present[name]) != expected[name]:
            hint = _SHAPE_HINTS.get(name) or _SHAPE_HINTS.get(name.split(".")[-2], "")
            misshaped.append(f"{name} is {list(present[name])}, expected {list(expected[name])} {hint}".rstrip())
    if missing or unexpected or misshaped:
        lines = [f"{source} does not match its config.json as an EAGLE-3 draft ({layout} layout):"]
        if missing:
            lines.append(f"  missing tensors: {missing}")
        if unexpected:
            lines.append(f"  unexpected tensors: {unexpected}")
        lines += [f"  {m}" for m in misshaped]
        variants = [n for n in missing + unexpected if n.startswith(("fc_norm.", "input_norm."))]
        if variants:
            lines.append(
                "  fc_norm.* / input_norm.* are the EAGLE 3.1 / norm_before_fc tensors: config.json must set fc_norm / "
                "norm_before_fc to match them."
            )
        lines.append(
            "  Check that the folder is an EAGLE-3 draft and that config.json (hidden_size, target_hidden_size, "
            "vocab_size, draft_vocab_size, heads, intermediate_size) describes these weights."
        )
        raise ValueError("\n".join(lines))
    return "embed_tokens.weight" in present


# ---------------------------------------------------------------------------------------------- loading
_HUB_KWARGS = ("subfolder", "revision", "cache_dir", "token", "local_files_only", "force_download")


def load_foreign_draft(
    cls, pretrained_model_name_or_path, *args, target=None, aux_layer_ids=None, aux_layer_convention=None, **kwargs
):
    """Hook of ``Eagle3DraftModel.from_pretrained``: loads the EAGLE / SpecForge / speculators layouts (returns
    the model) and checks ours before transformers loads it (returns None).

    ``target``: used to read ambiguous aux ids and for drafts that list none (the engines' default for its depth).
    ``aux_layer_ids``: override the draft's aux layers (our convention: target layer outputs).
    ``aux_layer_convention``: ``"input"`` or ``"output"``: how to read the ids the draft's config lists.
    ``norm_before_residual=``, ``norm_before_fc=``, ``fc_norm=``, ``norm_output=``: override the config's variant keys.
    """
    if kwargs.get("config") is not None or kwargs.get("gguf_file") is not None:
        return None  # explicit config: the caller knows what it loads
    hub = {k: kwargs[k] for k in _HUB_KWARGS if kwargs.get(k) is not None}
    folder = resolve_folder(pretrained_model_name_or_path, **hub)
    source = str(pretrained_model_name_or_path)
    config_dict = read_config_dict(folder)
    shapes = tensor_shapes(folder)
    layout = detect_layout(config_dict, shapes, source)
    num_layers = target.config.get_text_config().num_hidden_layers if target is not None else None
    if layout == "ours":
        if aux_layer_ids is not None:
            raise ValueError("aux_layer_ids= overrides the aux layers of foreign layouts only; this draft lists its own.")
        if aux_layer_convention not in (None, "output"):
            raise ValueError(
                f"{source} is an eagle3-hub folder: its eagle_config ids are layer outputs by definition; "
                "aux_layer_convention= is for foreign drafts that do not say. Fix the config.json if it is wrong."
            )
        resolve_aux_layer_ids(config_dict, layout, source, num_layers, aux_layer_convention)  # the keys must agree
        check_fields(config_dict, source)
        try:
            config = Eagle3Config.from_dict(config_dict)
        except ValueError as e:
            raise ValueError(f"{source}'s config.json: {e}") from None
        check_tensors(cls, config, shapes, layout, source)
        return None
    overrides = {k: bool(kwargs.pop(k)) for k in VARIANT_FLAGS if kwargs.get(k) is not None}
    config = config_from_layout(config_dict, layout, aux_layer_ids, num_layers, source, aux_layer_convention, overrides)
    if config.aux_layer_ids is None:
        logger.warning(
            "%s does not list its aux layers; pass `target=` (the engines' default for its depth is used) or "
            "`aux_layer_ids=` before binding it.",
            source,
        )
    has_embedding = check_tensors(cls, config, shapes, layout, source)
    for k in (*_HUB_KWARGS, "config", "use_safetensors", "key_mapping", "trust_remote_code"):
        kwargs.pop(k, None)
    output_loading_info = kwargs.pop("output_loading_info", False)
    from transformers import PreTrainedModel

    load = PreTrainedModel.from_pretrained.__func__  # transformers' loader, not our override
    model, info = load(
        cls,
        str(folder),
        *args,
        config=config,
        key_mapping=_key_mapping(),
        use_safetensors=True,
        output_loading_info=True,
        **kwargs,
    )
    # check_tensors allowed these to be absent: no embedding (the target's), no maps (full vocabulary, identity)
    allowed = {"embed_tokens.weight", "d2t", "t2d"}
    model._check_loading_info({**info, "missing_keys": [k for k in info["missing_keys"] if k not in allowed]})
    if "d2t" in shapes and "t2d" not in shapes:
        # d2t without t2d (ModelOpt exports; see check_tensors): t2d marks the target ids the draft ids map to,
        # target id = i + d2t[i]; the init's default would be the first draft_vocab_size target ids instead
        model.set_vocab_mapping(model.d2t + torch.arange(model.d2t.numel(), device=model.d2t.device))
    model._embedding_missing = not has_embedding
    model._weight_conversions = None  # save in our layout, not back in the one it was loaded from
    model.config.architectures = ["Eagle3DraftModel"]
    return (model, info) if output_loading_info else model
