"""EAGLE-3 draft layouts on the Hub: detection, loading, saving and engine exports.

Layouts read by ``Eagle3DraftModel.from_pretrained`` (all to the same model, the same logits):

    ours         config ``model_type: eagle3_draft`` + ``auto_map`` (code files shipped next to the weights),
                 ``architectures: [LlamaForCausalLMEagle3]``; tensors ``midlayer.*``, ``fc``, ``norm``, ``lm_head``,
                 ``d2t``, ``t2d``, optional ``embed_tokens``.
    eagle        official EAGLE-3 releases (SafeAILab): ``model_type: llama``, ``architectures: [LlamaForCausalLM]``,
                 ``draft_vocab_size``; same tensor names, usually no ``embed_tokens`` (the target's is used).
    specforge    SpecForge / SGLang / ModelOpt: ``model_type: llama``, ``architectures: [LlamaForCausalLMEagle3]``,
                 optional ``target_hidden_size`` and ``eagle_config``; same tensor names (ModelOpt: ``layers.0.*``,
                 and ``d2t`` without ``t2d``, which is rebuilt from ``d2t``).
    speculators  vllm-project/speculators: no ``model_type``; ``speculators_model_type: eagle3``,
                 ``speculators_config``, ``transformer_layer_config``; tensors ``layers.0.*`` instead of ``midlayer.*``.

Variants (every layout): ``norm_before_residual``, ``norm_before_fc`` (tensor ``input_norm``), ``fc_norm`` (EAGLE 3.1,
tensors ``fc_norm.{0,1,2}``, SGLang's older ``aux_norm_{low,mid,high}`` / ``use_aux_norm`` read too) and ``norm_output``
(EAGLE 3.1 post-norm feedback), with the meaning vLLM and SGLang give them. Absent keys are read as False, except that
a speculators config without ``norm_before_residual`` is ambiguous (vLLM reads True, the speculators library False):
we read False, as before, and warn. Every folder we write states all four keys.

Aux-layer convention: our ``eagle_config.eagle_aux_hidden_state_layer_ids`` are 0-based target layer *outputs*
(SGLang's Llama/Qwen path and SpecForge read the key so; SGLang captures the *input* of layer ``i + 1``). vLLM and
speculators read a top-level ``eagle_aux_hidden_state_layer_ids`` as layer *inputs*, so their ids are ours ``+ 1``.
Our folders and the ``sglang`` export carry both keys, each in the convention of the engine that reads it, and
``"aux_layer_convention"`` saying how to read the ids a loader uses (``eagle_config``'s if present, else the top-level
ones). Published drafts that do not say are read by the rules of ``resolve_aux_layer_ids``; a guess warns and names
the override (``aux_layer_convention="input"|"output"``).

Exports (``export_draft`` / ``eagle3-hub convert --to``): ``sglang`` writes a ``model_type: llama`` folder (served as
is by SGLang, and by vLLM with ``method: eagle3``); ``vllm`` writes the speculators layout (``vllm serve DRAFT`` finds
the target in it). Weights are read and written as safetensors only; pickled checkpoints are refused, never unpickled.

Importing this module registers its loading and saving hooks with ``Eagle3DraftModel`` (the model file never
imports it: the model code is also shipped alone, as remote code).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .atomic import atomic_copy, atomic_dir, atomic_path, atomic_write_json
from .configuration_eagle3 import AUX_LAYER_CONVENTIONS, Eagle3Config, default_aux_layer_ids
from .modeling_eagle3 import Eagle3DraftModel, register_layout_hooks

logger = logging.getLogger(__name__)

CODE_FILES = ("configuration_eagle3.py", "modeling_eagle3.py", "eagle3_assistant.py")
AUTO_MAP = {
    "AutoConfig": "configuration_eagle3.Eagle3Config",
    "AutoModel": "modeling_eagle3.Eagle3DraftModel",
    "AutoModelForCausalLM": "modeling_eagle3.Eagle3DraftModel",
}
# the class name both engines map to their EAGLE-3 draft (vLLM registry, SGLang EntryClass)
ENGINE_ARCHITECTURE = "LlamaForCausalLMEagle3"
LAYOUTS = ("ours", "eagle", "specforge", "speculators")
EXPORTS = ("ours", "vllm", "sglang")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
VARIANT_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# expert counts of transformers' MoE configs (qwen3_moe, gpt_oss / mixtral, deepseek)
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
AUX_OVERRIDE_HINT = "pass aux_layer_convention='input' or 'output' (--aux-layer-convention) or aux_layer_ids="


# ---------------------------------------------------------------------------------------------- aux layers
def to_vllm_aux_layer_ids(aux_layer_ids: list[int]) -> list[int]:
    """Our ids (layer outputs) -> vLLM / speculators ids (the layer whose input is captured)."""
    return [int(i) + 1 for i in aux_layer_ids]


def from_vllm_aux_layer_ids(vllm_ids: list[int]) -> list[int]:
    """vLLM / speculators ids (layer inputs) -> our ids (layer outputs)."""
    ids = [int(i) - 1 for i in vllm_ids]
    if any(i < 0 for i in ids):
        raise ValueError(
            f"eagle_aux_hidden_state_layer_ids={list(vllm_ids)} (read as layer inputs) include 0, the embedding "
            f"output; an EAGLE-3 draft reads decoder layer outputs. Fix the draft's config.json or {AUX_OVERRIDE_HINT}."
        )
    return ids


def engine_default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """What vLLM and SGLang capture when a draft lists no ids: inputs of ``2, L//2, L-3`` (the EAGLE-3
    reference), i.e. outputs of ``1, L//2-1, L-4``."""
    L = num_target_layers
    ids = [1, L // 2 - 1, L - 4]
    if any(not 0 <= i < L for i in ids):
        raise ValueError(
            f"The engines' default aux layers (inputs of 2, L//2, L-3) do not exist in a {L}-layer target; "
            "pass aux_layer_ids explicitly."
        )
    return ids


def reference_convention(ids: list[int], num_target_layers: int | None = None) -> str | None:
    """``"output"`` when ``ids`` are the EAGLE-3 reference layers as outputs (``1, L//2-1, L-4``), ``"input"`` when
    they are the same layers as inputs (``2, L//2, L-3``, as AQ-MedAI's Kimi-K2 drafts store them), else None.
    ``L`` is the target's depth when known, else the one the ids imply."""
    ids = [int(i) for i in ids]
    if len(ids) != 3:
        return None
    for convention, first, last_gap, mid in (("output", 1, 4, lambda L: L // 2 - 1), ("input", 2, 3, lambda L: L // 2)):
        L = ids[2] + last_gap
        if num_target_layers is not None and L != num_target_layers:
            continue
        if L >= 8 and ids == [first, mid(L), L - last_gap]:
            return convention
    return None


def resolve_aux_layer_ids(
    config: dict,
    layout: str,
    source: str = "this checkpoint",
    num_target_layers: int | None = None,
    convention: str | None = None,
) -> list[int] | None:
    """Our aux ids (layer outputs) from a draft's config.json, or None when it lists none.

    Which ids: ``eagle_config.eagle_aux_hidden_state_layer_ids`` if present (SGLang, SpecForge), else the top-level
    key (vLLM, speculators). How to read them, first rule that applies:
      1. ``convention`` (the caller's word), then the config's own ``aux_layer_convention``;
      2. both keys present: the top-level ids must be the eagle_config ids + 1 (each in its engine's convention);
      3. ids that are the EAGLE-3 reference's layers in exactly one convention are read in that one;
      4. top-level ids alone: inputs (vLLM reads them so); eagle_config ids alone: outputs (SGLang's Llama path,
         SpecForge), with a warning: vLLM and SGLang's DeepSeek path read the same key as inputs.
    """
    if convention is not None and convention not in AUX_LAYER_CONVENTIONS:
        raise ValueError(f"aux_layer_convention must be 'output' or 'input', got {convention!r}")
    eagle = config.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state") is False:
        raise ValueError(f"{source} sets eagle_config.use_aux_hidden_state=false; an EAGLE-3 draft fuses 3 target layers.")
    nested = eagle.get("eagle_aux_hidden_state_layer_ids")
    top = config.get("eagle_aux_hidden_state_layer_ids") or None
    ids = nested if nested is not None else top
    if ids is None:
        return None
    ids = [int(i) for i in ids]
    key = "eagle_config.eagle_aux_hidden_state_layer_ids" if nested is not None else "eagle_aux_hidden_state_layer_ids"
    stated = convention or config.get("aux_layer_convention")
    if stated is not None and stated not in AUX_LAYER_CONVENTIONS:
        raise ValueError(f"{source}'s config.json has aux_layer_convention={stated!r}; expected 'output' or 'input'.")
    if nested is not None and top is not None and convention is None:
        # the top-level key is vLLM's, always layer inputs: it must name the same layers
        if [int(i) for i in top] != (ids if stated == "input" else to_vllm_aux_layer_ids(ids)):
            raise ValueError(
                f"{source}'s config.json disagrees with itself: eagle_config.eagle_aux_hidden_state_layer_ids={ids} "
                f"(layer outputs, read by SGLang) but eagle_aux_hidden_state_layer_ids={list(top)} (layer inputs, read by "
                f"vLLM; should be {to_vllm_aux_layer_ids(ids)}). Fix one of them, or {AUX_OVERRIDE_HINT}."
            )
        stated = stated or "output"
    if stated is None:
        usual = "output" if nested is not None else "input"
        found = reference_convention(ids, num_target_layers)
        stated = found or usual
        if found is not None and found != usual:
            logger.warning(
                "%s: %s=%s are the EAGLE-3 reference's layers counted as layer %ss, so they are read as %ss "
                "(the usual reading of this key is %ss). If that is wrong, %s.",
                source, key, ids, found, found, usual, AUX_OVERRIDE_HINT,
            )
        elif found is None and nested is not None:
            logger.warning(
                "%s: %s=%s does not say whether the ids are target layer outputs (SGLang's Llama/Qwen path, SpecForge) "
                "or inputs (vLLM, SGLang's DeepSeek path); reading them as outputs. If the draft was trained on layer "
                "inputs, %s.",
                source, key, ids, AUX_OVERRIDE_HINT,
            )
    return from_vllm_aux_layer_ids(ids) if stated == "input" else ids


# ---------------------------------------------------------------------------------------------- files
def resolve_folder(
    path_or_repo: str | os.PathLike,
    *,
    subfolder: str = "",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    force_download: bool = False,
) -> Path:
    """A local folder holding the draft's config and safetensors: ``path_or_repo`` itself or a Hub snapshot
    (json files and ``*.safetensors`` only: pickled weights are never downloaded)."""
    local = Path(path_or_repo).expanduser()
    if local.is_dir():
        folder = local / subfolder if subfolder else local
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json: it is not a saved draft folder.")
        return folder
    if local.exists() or local.is_absolute() or str(path_or_repo).startswith((".", "~")):
        raise FileNotFoundError(f"{path_or_repo} is not a folder: pass a saved draft folder or a Hub repo id.")
    from huggingface_hub import snapshot_download

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    snapshot = snapshot_download(
        str(path_or_repo),
        revision=revision,
        cache_dir=cache_dir,
        token=token,
        local_files_only=local_files_only,
        force_download=force_download,
        allow_patterns=[f"{prefix}*.json", f"{prefix}*.safetensors"],
    )
    folder = Path(snapshot) / subfolder if subfolder else Path(snapshot)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{path_or_repo} has no config.json{f' in {subfolder}' if subfolder else ''}.")
    if not any(folder.glob("*.safetensors")) and not local_files_only:
        # the snapshot skipped pickles on purpose: name them from the repo's file list, never download them
        try:
            from huggingface_hub import HfApi

            names = HfApi().list_repo_files(str(path_or_repo), revision=revision, token=token)
        except Exception:  # offline or no access: the plain "no weights" error follows
            names = []
        pickles = sorted(n[len(prefix):] for n in names if n.startswith(prefix) and "/" not in n[len(prefix):]
                         and n.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise ValueError(_pickle_message(f"The Hub repo {path_or_repo}", pickles))
    return folder


def _pickle_message(what: str, pickles: list[str]) -> str:
    return (
        f"{what} has only pickled weights ({', '.join(pickles)}) and no *.safetensors. eagle3-hub reads safetensors "
        "only and never unpickles weights, because loading a pickle can run arbitrary code. Convert the file to "
        "model.safetensors with a tool you trust (for a Hub repo: the 'convert to safetensors' Space, or ask its "
        "authors), then load that."
    )


def read_config_dict(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path} is not valid JSON ({e}): the file is corrupt or truncated; download or export the draft again."
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not an object: it is not a model config.")
    return config


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint; a clear error for pickled-only checkpoints."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        index = folder / "model.safetensors.index.json"
        if index.is_file():  # sharded: only the shards the index names
            try:
                with open(index, encoding="utf-8") as f:
                    names = sorted(set(json.load(f)["weight_map"].values()))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{index} is not a valid safetensors index ({e!r}); download the draft again.") from None
            files = [folder / n for n in names]
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(_pickle_message(str(folder), pickles))
    raise FileNotFoundError(f"{folder} has no weights: expected model.safetensors (or sharded *.safetensors).")


def tensor_shapes(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) read from the safetensors headers, without loading any tensor. A truncated or corrupt
    file is a ValueError naming it."""
    shapes = {}
    for file in safetensors_files(folder):
        if not file.is_file():
            raise FileNotFoundError(f"{file} is named by the safetensors index but missing: download the draft again.")
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    shapes[name] = (tuple(sl.get_shape()), sl.get_dtype())
        except (SafetensorError, OSError) as e:
            raise ValueError(
                f"{file} is not a readable safetensors file ({e}): it is truncated or corrupt; download or export the "
                "draft again."
            ) from None
    return shapes


# ---------------------------------------------------------------------------------------------- detection
def detect_layout(config: dict, shapes: dict | None = None, source: str = "this checkpoint") -> str:
    """One of ``LAYOUTS``, or a ValueError naming what the checkpoint is instead."""
    if "speculators_model_type" in config or "speculators_config" in config:
        kind = config.get("speculators_model_type")
        if kind != "eagle3":
            raise ValueError(
                f"{source} is a speculators '{kind}' checkpoint, not an EAGLE-3 draft "
                "(speculators_model_type must be 'eagle3')."
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
            "here), vLLM as True, so vLLM would serve a different draft. Add \"norm_before_residual\": false (or true, "
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
        raise ValueError(f"{source} ties lm_head to embed_tokens; an EAGLE-3 draft has its own lm_head over the draft vocabulary.")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(
            f"{source} has {config['num_hidden_layers']} draft decoder layers; Eagle3DraftModel implements the "
            "single-layer EAGLE-3 draft."
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
            "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_bias", "mlp_bias",
            "bos_token_id", "eos_token_id", "pad_token_id",
        )
        if layer.get(k) is not None
    }
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
        kwargs = _llama_kwargs(layer, source)
    else:
        _check_structure(config, source)
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
    kwargs["num_hidden_layers"] = 1
    kwargs.update(overrides or {})
    return Eagle3Config(**kwargs)


_LEGACY_NAMES = {"aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.", "aux_norm_high.": "fc_norm.2."}


def _key_mapping() -> dict[str, str]:
    """File tensor name -> ours, as transformers' ``key_mapping`` (both engines read these spellings too)."""
    mapping = {r"^layers\.0\.": "midlayer."}
    mapping.update({"^" + old.replace(".", r"\."): new for old, new in _LEGACY_NAMES.items()})
    return mapping


def _our_name(name: str) -> str:
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0."):]
    for old, new in _LEGACY_NAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
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
        check_tensors(cls, Eagle3Config.from_dict(config_dict), shapes, layout, source)
        return None
    overrides = {k: bool(kwargs.pop(k)) for k in VARIANT_FLAGS if kwargs.get(k) is not None}
    config = config_from_layout(config_dict, layout, aux_layer_ids, num_layers, source, aux_layer_convention, overrides)
    if config.aux_layer_ids is None:
        logger.warning(
            "%s does not list its aux layers; pass `target=` (the engines' default for its depth is used) or "
            "`aux_layer_ids=` before binding it.", source,
        )
    has_embedding = check_tensors(cls, config, shapes, layout, source)
    for k in (*_HUB_KWARGS, "config", "use_safetensors", "key_mapping", "trust_remote_code"):
        kwargs.pop(k, None)
    output_loading_info = kwargs.pop("output_loading_info", False)
    from transformers import PreTrainedModel

    load = PreTrainedModel.from_pretrained.__func__  # transformers' loader, not our override
    model, info = load(
        cls, str(folder), *args, config=config, key_mapping=_key_mapping(), use_safetensors=True,
        output_loading_info=True, **kwargs,
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


# ---------------------------------------------------------------------------------------------- saving (ours)
def _check_savable(config: Eagle3Config, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None):
    ids = config.aux_layer_ids
    if ids is None or len(ids) != 3:
        raise ValueError(
            f"This draft's eagle_config lists aux layers {ids}; an EAGLE-3 draft needs exactly 3 target layers "
            "(set draft.config.aux_layer_ids = [low, mid, high], 0-based layer outputs)."
        )
    if config.target_num_hidden_layers is not None and any(not 0 <= i < config.target_num_hidden_layers for i in ids):
        raise ValueError(
            f"aux layers {ids} are out of range for the {config.target_num_hidden_layers}-layer target this draft "
            f"was sized for (0-based layer outputs in 0..{config.target_num_hidden_layers - 1})."
        )
    if d2t is not None:
        target_ids = d2t.cpu() + torch.arange(d2t.numel())
        if target_ids.min() < 0 or target_ids.max() >= config.vocab_size:
            raise ValueError("d2t maps draft ids outside the target vocabulary: call draft.set_vocab_mapping(target_ids).")
        if t2d is not None and not torch.equal(t2d.cpu().nonzero().flatten(), target_ids.sort().values):
            raise ValueError("t2d and d2t describe different draft vocabularies: call draft.set_vocab_mapping(target_ids).")


def identity_vocabulary(model) -> bool:
    """Full-vocabulary draft with the identity map: its folders ship no d2t/t2d (vLLM has no parameter for them
    then and fails on a shipped d2t; SGLang and we read their absence as the identity)."""
    return model.config.draft_vocab_size == model.config.vocab_size and not bool(model.d2t.cpu().any())


def prepare_save(model):
    """Before ``save_pretrained`` writes: refuse drafts that would be saved broken, set the remote-code map."""
    _check_savable(model.config, model.d2t, model.t2d)
    model.config.auto_map = dict(AUTO_MAP)


def engine_keys(config: Eagle3Config) -> dict:
    """The top-level keys the engines read that our config class does not spell itself."""
    keys = {"architectures": [ENGINE_ARCHITECTURE], "aux_layer_convention": "output"}
    keys.update({flag: bool(getattr(config, flag)) for flag in VARIANT_FLAGS})
    if config.aux_layer_ids is not None:
        keys["eagle_aux_hidden_state_layer_ids"] = to_vllm_aux_layer_ids(config.aux_layer_ids)  # vLLM: inputs
    return keys


def finish_save(model, save_directory):
    """After ``save_pretrained``: engine keys and ``auto_map`` in config.json, no d2t/t2d for a full identity
    vocabulary, the code files next to the weights so that ``AutoModel.from_pretrained(path, trust_remote_code=True)``
    works without eagle3_hub, and ``custom_generate/generate.py`` so that ``target.generate(ids,
    custom_generate=path, trust_remote_code=True)`` runs tree decoding without it."""
    folder = Path(save_directory)
    config = read_config_dict(folder)
    config.update(engine_keys(model.config))
    config["auto_map"] = dict(AUTO_MAP)
    atomic_write_json(folder / "config.json", config, indent=2)
    if identity_vocabulary(model):
        _drop_tensors(folder, ("d2t", "t2d"))
    package = Path(__file__).parent
    for name in CODE_FILES:
        atomic_copy(package / name, folder / name)
    # tree decoding through transformers without the package: target.generate(custom_generate=<this repo>)
    from .generation.tree import write_custom_generate

    write_custom_generate(folder)


def _drop_tensors(folder: Path, names: tuple[str, ...]):
    from safetensors.torch import load_file

    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as f:
            if not set(names) & set(f.keys()):
                continue
            metadata = f.metadata()
        state = {k: v for k, v in load_file(str(file)).items() if k not in names}
        with atomic_path(file, suffix=".safetensors") as tmp:
            save_file(state, str(tmp), metadata=metadata)


# ---------------------------------------------------------------------------------------------- engine exports
def _llama_layer_dict(config: Eagle3Config) -> dict:
    """The draft layer as a transformers LlamaConfig dict (both the v4 and v5 rope spellings)."""
    rope = dict(config.rope_parameters)
    theta = rope.pop("rope_theta", 10000.0)
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    if scaling is not None:
        scaling = {**scaling, "type": scaling["rope_type"]}  # engines on transformers v4 read "type"
    dtype = config.dtype if config.dtype is None or isinstance(config.dtype, str) else str(config.dtype).removeprefix("torch.")
    return {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
        "tie_word_embeddings": False,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "torch_dtype": dtype,
    }


def engine_config(config: Eagle3Config, to: str, verifier: str | None = None, num_speculative_tokens: int = 3) -> dict:
    """config.json of an engine folder. ``to="sglang"``: SpecForge/SGLang layout (also served by vLLM with
    ``method: eagle3``). ``to="vllm"``: speculators layout. Refuses what the engine would serve differently."""
    if to not in ("vllm", "sglang"):
        raise ValueError(f"unknown engine layout {to!r}: expected 'vllm' or 'sglang'")
    _check_savable(config)
    ids = config.aux_layer_ids
    L = config.target_num_hidden_layers
    flags = {flag: bool(getattr(config, flag)) for flag in VARIANT_FLAGS}
    if to == "sglang":
        if L is not None and max(ids) >= L - 1:
            raise ValueError(
                f"aux layer {max(ids)} is the output of the target's last layer: SGLang captures the *input* of layer "
                f"id + 1 and a {L}-layer target has no layer {L}. Export with --to vllm (vLLM captures it), or use a "
                f"draft trained on layers in 0..{L - 2} (default {default_aux_layer_ids(L)})."
            )
        if config.attention_bias:
            raise ValueError(
                "This draft has attention_bias: SGLang 0.5 builds the draft's q/k/v projections without bias and would "
                "drop the trained biases silently. Export with --to vllm (vLLM loads them) instead."
            )
        if config.mlp_bias:
            raise ValueError("This draft has mlp_bias: SGLang's Llama MLP has no bias. Export with --to vllm instead.")
        if config.norm_before_residual:
            raise ValueError(
                "This draft sets norm_before_residual: SGLang 0.5's EAGLE-3 layer always keeps the raw feature as the "
                "residual and would serve another draft. Export with --to vllm (vLLM implements it) instead."
            )
        return {
            **_llama_layer_dict(config),
            "architectures": [ENGINE_ARCHITECTURE],
            "draft_vocab_size": config.draft_vocab_size,
            "target_hidden_size": config.target_hidden_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True},  # SGLang
            "eagle_aux_hidden_state_layer_ids": to_vllm_aux_layer_ids(ids),  # vLLM
            "aux_layer_convention": "output",  # of eagle_config's ids; the top-level ones are vLLM's inputs
            **flags,
            "target_model_type": config.target_model_type,
            "target_num_hidden_layers": config.target_num_hidden_layers,
        }
    if L is not None and max(ids) == L - 1:
        logger.warning(
            "aux layer %d is the output of the target's last layer: vLLM captures it before the target's final norm "
            "(hidden + residual), transformers' hidden_states[%d] (what this draft read here) after it; expect lower "
            "acceptance in vLLM unless the draft was trained on the un-normalised state.", max(ids), L,
        )
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": int(num_speculative_tokens),
                 "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
        "transformer_layer_config": _llama_layer_dict(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": to_vllm_aux_layer_ids(ids),
        "aux_layer_convention": "input",  # of the top-level ids, the only ones in this layout
        **flags,  # vLLM's speculators reader defaults norm_before_residual to True: every key is written
        "embed_requires_grad": False,
    }


def export_draft(
    model,
    save_directory,
    to: str = "ours",
    verifier: str | None = None,
    num_speculative_tokens: int = 3,
    save_embeddings: bool | None = None,
    force: bool = False,
) -> Path:
    """Write ``model`` as a folder for ``to`` in ``EXPORTS``, atomically (a temporary folder renamed into place)."""
    if to not in EXPORTS:
        raise ValueError(f"--to must be one of {EXPORTS}, got {to!r}")
    dst = Path(save_directory)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())) and not force:
        raise FileExistsError(f"{dst} exists and is not empty: choose another destination or pass --force.")
    if to != "ours":
        config = engine_config(model.config, to, verifier, num_speculative_tokens)  # refusals before any write
        if model.config.draft_vocab_size == model.config.vocab_size and not identity_vocabulary(model):
            raise ValueError(
                "This draft covers the whole target vocabulary but its d2t map is not the identity: vLLM builds no map "
                "for a full-vocabulary draft and SGLang would apply one vLLM ignores. Re-export it with the identity map."
            )
        if to == "vllm" and not verifier:
            logger.warning(
                "No --verifier given: the speculators config names no target, so `vllm serve DRAFT` cannot find "
                "it; serve with --speculative-config '{\"model\": DRAFT, \"method\": \"eagle3\"}' instead."
            )
    try:
        with atomic_dir(dst) as tmp:
            if to == "ours":
                model.save_pretrained(tmp, save_embeddings=save_embeddings)
            else:
                _write_engine_folder(model, tmp, to, config, save_embeddings)
    except (PermissionError, OSError) as e:
        if isinstance(e, FileExistsError) or e.errno is None:
            raise
        kind = PermissionError if isinstance(e, PermissionError) or e.errno == 30 else OSError  # 30: read-only fs
        raise kind(
            f"Cannot write the draft to {dst}: {e.strerror} ({e.filename}). Choose a destination you can write to."
        ) from None
    return dst


def _write_engine_folder(model, folder: Path, to: str, config: dict, save_embeddings: bool | None):
    if save_embeddings is None:
        save_embeddings = not (model._embedding_from_target or model._embedding_missing)
    skip = {"d2t", "t2d"} if identity_vocabulary(model) else set()
    if not save_embeddings:
        skip.add("embed_tokens.weight")
    state = {}
    for name, tensor in model.state_dict().items():
        if name in skip:
            continue
        if to == "vllm" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        state[name] = tensor.detach().to("cpu").contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_json(folder / "config.json", config, indent=2)


# ---------------------------------------------------------------------------------------------- convert
def _meta_target(target: str):
    """The target built from its config on the meta device (no weights read), for ``Eagle3DraftModel.check_fits``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(target)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def convert(
    src,
    dst,
    to: str = "ours",
    target: str | None = None,
    aux_layer_ids: list[int] | None = None,
    verifier: str | None = None,
    num_speculative_tokens: int = 3,
    force: bool = False,
    aux_layer_convention: str | None = None,
) -> Path:
    """Rewrite the draft at ``src`` (any layout, folder or Hub id) as ``to`` at ``dst``; returns ``dst``.

    ``target``: the target (Hub id or folder; only its config is read) to check the draft against and to resolve
    the aux layers of drafts that do not list them. ``aux_layer_ids``: our convention (layer outputs).
    ``aux_layer_convention``: how to read the ids ``src``'s config lists (``"input"`` or ``"output"``).
    """
    from .targets import check_aux_layer_ids

    meta_target = _meta_target(target) if target else None
    folder = resolve_folder(src)
    layout = detect_layout(read_config_dict(folder), tensor_shapes(folder), str(src))
    L = meta_target.config.get_text_config().num_hidden_layers if meta_target is not None else None
    if aux_layer_ids is not None and L is not None:
        check_aux_layer_ids(aux_layer_ids, L)
    options = {"aux_layer_convention": aux_layer_convention} if aux_layer_convention else {}
    if layout == "ours":
        draft = Eagle3DraftModel.from_pretrained(str(folder), dtype="auto", **options)
        if aux_layer_ids is not None:
            draft.config.aux_layer_ids = aux_layer_ids
    else:
        draft = Eagle3DraftModel.from_pretrained(
            str(folder), aux_layer_ids=aux_layer_ids, target=None, dtype="auto", **options
        )
        if draft.config.aux_layer_ids is None and L is not None:
            draft.config.aux_layer_ids = engine_default_aux_layer_ids(L)
        elif L is not None and aux_layer_ids is None:  # re-read ambiguous ids knowing the target's depth
            ids = resolve_aux_layer_ids(read_config_dict(folder), layout, str(src), L, aux_layer_convention)
            if ids is not None:
                draft.config.aux_layer_ids = ids
    cfg = draft.config
    if meta_target is not None:
        try:
            draft.check_fits(meta_target)
        except ValueError as e:
            raise ValueError(f"{src} does not fit the target {target}: {e}") from None
        cfg.target_num_hidden_layers = L
        cfg.target_model_type = cfg.target_model_type or meta_target.config.get_text_config().model_type
    if cfg.aux_layer_ids is None:
        raise ValueError(
            f"{src} does not list its aux layers. Pass --target (the engines' default for its depth is used) or "
            "--aux-layer-ids LOW,MID,HIGH (0-based target layer outputs)."
        )
    if verifier is None and target is not None and not Path(target).exists():
        verifier = target
    return export_draft(draft, dst, to, verifier=verifier, num_speculative_tokens=num_speculative_tokens, force=force)


register_layout_hooks(load=load_foreign_draft, prepare_save=prepare_save, finish_save=finish_save)

__all__ = [
    "LAYOUTS",
    "EXPORTS",
    "VARIANT_FLAGS",
    "detect_layout",
    "variant_flags",
    "config_from_layout",
    "resolve_aux_layer_ids",
    "reference_convention",
    "load_foreign_draft",
    "prepare_save",
    "finish_save",
    "engine_config",
    "export_draft",
    "convert",
    "to_vllm_aux_layer_ids",
    "from_vllm_aux_layer_ids",
    "engine_default_aux_layer_ids",
    "default_aux_layer_ids",
]
