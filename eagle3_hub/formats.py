"""EAGLE-3 draft layouts on the Hub: detection, loading, saving, engine exports and ``eagle3-hub convert``.

Layouts read by ``Eagle3DraftModel.from_pretrained`` (all to the same model, the same logits):

    ours         config ``model_type: eagle3_draft`` + ``auto_map`` (code files shipped next to the weights),
                 ``architectures: [LlamaForCausalLMEagle3]``; tensors ``midlayer.*``, ``fc``, ``norm``, ``lm_head``,
                 ``d2t``, ``t2d``, optional ``embed_tokens``.
    eagle        official EAGLE-3 releases (SafeAILab): ``model_type: llama``, ``architectures: [LlamaForCausalLM]``,
                 ``draft_vocab_size``; same tensor names, usually no ``embed_tokens`` (the target's is used).
    specforge    SpecForge / SGLang / ModelOpt: ``model_type: llama``, ``architectures: [LlamaForCausalLMEagle3]``,
                 optional ``target_hidden_size`` and ``eagle_config``; same tensor names.
    speculators  vllm-project/speculators: no ``model_type``; ``speculators_model_type: eagle3``,
                 ``speculators_config``, ``transformer_layer_config``; tensors ``layers.0.*`` instead of ``midlayer.*``.

Aux-layer convention: our ``eagle_config.eagle_aux_hidden_state_layer_ids`` are 0-based target layer *outputs*
(SGLang and SpecForge read the same key the same way; SGLang captures the *input* of layer ``i + 1``). vLLM and
speculators read a top-level ``eagle_aux_hidden_state_layer_ids`` as layer *inputs* (vLLM's LlamaModel captures
``hidden_states + residual`` before running layer ``i``), so their ids are ours ``+ 1``. Our folders and the
``sglang`` export carry both keys, each in the convention of the engine that reads it.

Exports (``convert --to``): ``sglang`` writes a ``model_type: llama`` folder (served as is by SGLang, and by vLLM
with ``method: eagle3``); ``vllm`` writes the speculators layout (``vllm serve DRAFT`` finds the target in it).
Weights are read and written as safetensors only; pickled checkpoints are refused, never unpickled.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .configuration_eagle3 import Eagle3Config, default_aux_layer_ids

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


# ---------------------------------------------------------------------------------------------- aux layers
def to_vllm_aux_layer_ids(aux_layer_ids: list[int]) -> list[int]:
    """Our ids (layer outputs) -> vLLM / speculators ids (the layer whose input is captured)."""
    return [int(i) + 1 for i in aux_layer_ids]


def from_vllm_aux_layer_ids(vllm_ids: list[int]) -> list[int]:
    """vLLM / speculators ids (layer inputs) -> our ids (layer outputs)."""
    ids = [int(i) - 1 for i in vllm_ids]
    if any(i < 0 for i in ids):
        raise ValueError(
            f"eagle_aux_hidden_state_layer_ids={list(vllm_ids)} (vLLM convention: layer inputs) include 0, the "
            "embedding output; an EAGLE-3 draft reads decoder layer outputs. Fix the draft's config.json."
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
    return folder


def read_config_dict(folder: Path) -> dict:
    with open(Path(folder) / "config.json", encoding="utf-8") as f:
        return json.load(f)


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint; a clear error for pickled-only checkpoints."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        index = folder / "model.safetensors.index.json"
        if index.is_file():  # sharded: only the shards the index names
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
            files = [folder / n for n in names]
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{folder} has only pickled weights ({', '.join(pickles)}). eagle3-hub reads safetensors only and never "
            "unpickles weights (loading a pickle can run arbitrary code). Convert the file to model.safetensors "
            "with a tool you trust (for Hub repos: the 'convert to safetensors' Space), then load that."
        )
    raise FileNotFoundError(f"{folder} has no weights: expected model.safetensors (or sharded *.safetensors).")


def tensor_shapes(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) read from the safetensors headers, without loading any tensor."""
    shapes = {}
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                shapes[name] = (tuple(sl.get_shape()), sl.get_dtype())
    return shapes


def _atomic_write_text(path: Path, text: str):
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_copy(src: Path, dst: Path):
    fd, tmp = tempfile.mkstemp(dir=Path(dst).parent, prefix=f".{Path(dst).name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_json(path: Path, data: dict):
    _atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


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
    has_draft_tensors = "fc.weight" in names and any(n.startswith("midlayer.") for n in names)
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
_UNSUPPORTED_FLAGS = {
    # flag: (value we implement, what the other value means)
    "norm_before_residual": (False, "the residual is the normalised fused feature"),
    "norm_before_fc": (False, "an RMSNorm over the concatenated target features before fc"),
    "fc_norm": (False, "one RMSNorm per target feature before fc"),
}


def _check_variant_flags(config: dict, source: str, norm_output_default: bool):
    for flag, (ours, meaning) in _UNSUPPORTED_FLAGS.items():
        if bool(config.get(flag, ours)) != ours:
            raise ValueError(
                f"{source} sets {flag}={config[flag]} ({meaning}), an EAGLE-3 variant Eagle3DraftModel does not "
                f"implement (it implements {flag}={ours}, the EAGLE-3 reference)."
            )
    # SpecForge: norm_output=True (default) means logits = lm_head(norm(h)), ours. speculators: norm_output=True
    # feeds the *normed* state back across steps (Eagle 3.1), default False.
    if "norm_output" in config and bool(config["norm_output"]) != norm_output_default:
        raise ValueError(
            f"{source} sets norm_output={config['norm_output']}, an EAGLE-3 variant Eagle3DraftModel does not implement."
        )
    if config.get("tie_word_embeddings"):
        raise ValueError(f"{source} ties lm_head to embed_tokens; an EAGLE-3 draft has its own lm_head over the draft vocabulary.")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(
            f"{source} has {config['num_hidden_layers']} draft decoder layers; Eagle3DraftModel implements the "
            "single-layer EAGLE-3 draft."
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
    """Our aux ids from a Llama-style draft config: ``eagle_config`` (SGLang/SpecForge, layer outputs) and/or the
    top-level key (vLLM, layer inputs); a clear error when the two disagree."""
    eagle = config.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state") is False:
        raise ValueError(f"{source} sets eagle_config.use_aux_hidden_state=false; an EAGLE-3 draft fuses 3 target layers.")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if not top:
        return list(ids) if ids is not None else None
    if ids is None:
        return from_vllm_aux_layer_ids(top)
    if list(top) != to_vllm_aux_layer_ids(ids):
        raise ValueError(
            f"{source}'s config.json disagrees with itself: eagle_config.eagle_aux_hidden_state_layer_ids={list(ids)} "
            f"(layer outputs, read by SGLang) but eagle_aux_hidden_state_layer_ids={list(top)} (layer inputs, read by "
            f"vLLM; should be {to_vllm_aux_layer_ids(ids)}). Fix one of them."
        )
    return list(ids)


def config_from_layout(
    config: dict,
    layout: str,
    aux_layer_ids: list[int] | None = None,
    num_target_layers: int | None = None,
    source: str = "this checkpoint",
) -> Eagle3Config:
    """An ``Eagle3Config`` for a foreign config dict. Aux ids: ``aux_layer_ids`` if given, else the config's
    (converted to our convention), else the engines' default for ``num_target_layers`` layers, else unset."""
    if layout == "speculators":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"{source} is a speculators checkpoint without a transformer_layer_config dict.")
        if layer.get("model_type", "llama") != "llama":
            raise ValueError(
                f"{source}'s draft layer is a {layer.get('model_type')!r} layer; Eagle3DraftModel implements the "
                "Llama draft layer of EAGLE-3 (speculators' qwen3 layer adds q/k norms)."
            )
        _check_variant_flags({**layer, **config}, source, norm_output_default=False)
        kwargs = _llama_kwargs(layer, source)
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        file_ids = from_vllm_aux_layer_ids(ids) if ids else None
    else:
        _check_variant_flags(config, source, norm_output_default=True)
        kwargs = _llama_kwargs(config, source)
        file_ids = aux_layer_ids_in_config(config, source)
    ids = aux_layer_ids if aux_layer_ids is not None else file_ids
    if ids is None and num_target_layers is not None:
        ids = engine_default_aux_layer_ids(num_target_layers)
    kwargs["draft_vocab_size"] = config.get("draft_vocab_size") or kwargs["vocab_size"]
    kwargs["target_hidden_size"] = config.get("target_hidden_size") or kwargs["hidden_size"]
    kwargs["eagle_config"] = {"use_aux_hidden_state": True}
    if ids is not None:
        kwargs["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in ids]
    kwargs["target_num_hidden_layers"] = num_target_layers
    kwargs["target_model_type"] = config.get("target_model_type")
    kwargs["num_hidden_layers"] = 1
    return Eagle3Config(**kwargs)


def _key_mapping(layout: str) -> dict[str, str] | None:
    return {r"^layers\.0\.": "midlayer."} if layout == "speculators" else None


def _our_name(name: str, layout: str) -> str:
    return "midlayer." + name[len("layers.0."):] if layout == "speculators" and name.startswith("layers.0.") else name


# ---------------------------------------------------------------------------------------------- tensor checks
_SHAPE_HINTS = {
    "embed_tokens.weight": "[vocab_size, hidden_size]",
    "fc.weight": "[hidden_size, 3 * target_hidden_size]",
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
    present = {_our_name(n, layout): s for n, (s, _) in shapes.items()}
    optional = {"embed_tokens.weight"}
    if config.draft_vocab_size == config.vocab_size:
        optional |= {"d2t", "t2d"}  # full vocabulary: identity map
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
        lines.append(
            "  Check that the folder is an EAGLE-3 draft and that config.json (hidden_size, target_hidden_size, "
            "vocab_size, draft_vocab_size, heads, intermediate_size) describes these weights."
        )
        raise ValueError("\n".join(lines))
    return "embed_tokens.weight" in present


# ---------------------------------------------------------------------------------------------- loading
_HUB_KWARGS = ("subfolder", "revision", "cache_dir", "token", "local_files_only", "force_download")


def load_foreign_draft(cls, pretrained_model_name_or_path, *args, target=None, aux_layer_ids=None, **kwargs):
    """Hook of ``Eagle3DraftModel.from_pretrained``: loads the EAGLE / SpecForge / speculators layouts (returns
    the model) and checks ours before transformers loads it (returns None).

    ``target``: used for the aux layers of drafts that do not list them (the engines' default for its depth).
    ``aux_layer_ids``: override the draft's aux layers (our convention: target layer outputs).
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
        config = Eagle3Config.from_dict(config_dict)
        aux_layer_ids_in_config(config_dict, source)  # the SGLang and vLLM keys must agree
        if aux_layer_ids is not None:
            raise ValueError("aux_layer_ids= overrides the aux layers of foreign layouts only; this draft lists its own.")
        check_tensors(cls, config, shapes, layout, source)
        return None
    config = config_from_layout(config_dict, layout, aux_layer_ids, num_layers, source)
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
        cls, str(folder), *args, config=config, key_mapping=_key_mapping(layout), use_safetensors=True,
        output_loading_info=True, **kwargs,
    )
    # check_tensors allowed these to be absent: no embedding (the target's), no maps (full vocabulary, identity)
    allowed = {"embed_tokens.weight", "d2t", "t2d"}
    model._check_loading_info({**info, "missing_keys": [k for k in info["missing_keys"] if k not in allowed]})
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


def prepare_save(model):
    """Before ``save_pretrained`` writes: refuse drafts that would be saved broken, set the remote-code map."""
    _check_savable(model.config, model.d2t, model.t2d)
    model.config.auto_map = dict(AUTO_MAP)


def engine_keys(config: Eagle3Config) -> dict:
    """The top-level keys both engines read that our config class does not spell itself."""
    keys = {"architectures": [ENGINE_ARCHITECTURE], "norm_before_residual": False}
    if config.aux_layer_ids is not None:
        keys["eagle_aux_hidden_state_layer_ids"] = to_vllm_aux_layer_ids(config.aux_layer_ids)  # vLLM: inputs
    return keys


def finish_save(model, save_directory):
    """After ``save_pretrained``: engine keys and ``auto_map`` in config.json, the code files next to the
    weights so that ``AutoModel.from_pretrained(path, trust_remote_code=True)`` works without eagle3_hub, and
    ``custom_generate/generate.py`` so that ``target.generate(ids, custom_generate=path, trust_remote_code=True)``
    runs tree decoding without it."""
    folder = Path(save_directory)
    config_path = folder / "config.json"
    config = read_config_dict(folder)
    config.update(engine_keys(model.config))
    config["auto_map"] = dict(AUTO_MAP)
    _write_json(config_path, config)
    package = Path(__file__).parent
    for name in CODE_FILES:
        _atomic_copy(package / name, folder / name)
    # tree decoding through transformers without the package: target.generate(custom_generate=<this repo>)
    from .generation.tree_decoding import write_custom_generate

    write_custom_generate(folder)


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
    ``method: eagle3``). ``to="vllm"``: speculators layout."""
    _check_savable(config)
    ids = config.aux_layer_ids
    L = config.target_num_hidden_layers
    if L is not None and max(ids) >= L - 1:
        raise ValueError(
            f"aux layer {max(ids)} is the output of the target's last layer: vLLM and SGLang capture the *input* of "
            f"layer id + 1, and a {L}-layer target has no layer {L}. Engines can serve drafts whose aux layers are "
            f"in 0..{L - 2}; this one needs a draft trained on other layers (default {default_aux_layer_ids(L)})."
        )
    if to == "sglang":
        return {
            **_llama_layer_dict(config),
            "architectures": [ENGINE_ARCHITECTURE],
            "draft_vocab_size": config.draft_vocab_size,
            "target_hidden_size": config.target_hidden_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True},  # SGLang
            "eagle_aux_hidden_state_layer_ids": to_vllm_aux_layer_ids(ids),  # vLLM
            "norm_before_residual": False,
            "target_model_type": config.target_model_type,
            "target_num_hidden_layers": config.target_num_hidden_layers,
        }
    if to == "vllm":
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
            "norm_before_residual": False,  # vLLM's speculators reader defaults to True: write it
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
            "embed_requires_grad": False,
        }
    raise ValueError(f"unknown engine layout {to!r}: expected 'vllm' or 'sglang'")


def _replace_folder(tmp: Path, dst: Path, force: bool):
    if dst.exists() and any(dst.iterdir()):
        if not force:
            raise FileExistsError(f"{dst} exists and is not empty: choose another destination or pass --force.")
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if dst.exists():
            dst.rmdir()
        os.replace(tmp, dst)


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
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and any(dst.iterdir()) and not force:
        raise FileExistsError(f"{dst} exists and is not empty: choose another destination or pass --force.")
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.tmp-"))
    try:
        if to == "ours":
            model.save_pretrained(tmp, save_embeddings=save_embeddings)
        else:
            if save_embeddings is None:
                save_embeddings = not (model._embedding_from_target or model._embedding_missing)
            if to == "vllm" and not verifier:
                logger.warning(
                    "No --verifier given: the speculators config names no target, so `vllm serve DRAFT` cannot find "
                    "it; serve with --speculative-config '{\"model\": DRAFT, \"method\": \"eagle3\"}' instead."
                )
            config = engine_config(model.config, to, verifier, num_speculative_tokens)
            state = {}
            for name, tensor in model.state_dict().items():
                if name == "embed_tokens.weight" and not save_embeddings:
                    continue
                if to == "vllm" and name.startswith("midlayer."):
                    name = "layers.0." + name[len("midlayer."):]
                state[name] = tensor.detach().to("cpu").contiguous()
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            _write_json(tmp / "config.json", config)
        _replace_folder(tmp, dst, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


# ---------------------------------------------------------------------------------------------- convert
def _target_text_config(target: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(target).get_text_config()


def convert(
    src,
    dst,
    to: str = "ours",
    target: str | None = None,
    aux_layer_ids: list[int] | None = None,
    verifier: str | None = None,
    num_speculative_tokens: int = 3,
    force: bool = False,
) -> Path:
    """Rewrite the draft at ``src`` (any layout, folder or Hub id) as ``to`` at ``dst``; returns ``dst``.

    ``target``: the target (Hub id or folder; only its config is read) to check the draft against and to resolve
    the aux layers of drafts that do not list them.
    """
    from .modeling_eagle3 import Eagle3DraftModel
    from .targets import check_aux_layer_ids

    target_cfg = _target_text_config(target) if target else None
    folder = resolve_folder(src)
    layout = detect_layout(read_config_dict(folder), tensor_shapes(folder), str(src))
    if layout == "ours":
        draft = Eagle3DraftModel.from_pretrained(str(folder), dtype="auto")
        if aux_layer_ids is not None:
            draft.config.aux_layer_ids = aux_layer_ids
    else:
        draft = Eagle3DraftModel.from_pretrained(str(folder), aux_layer_ids=aux_layer_ids, dtype="auto")
    cfg = draft.config
    if target_cfg is not None:
        L = target_cfg.num_hidden_layers
        if cfg.aux_layer_ids is None:
            cfg.aux_layer_ids = engine_default_aux_layer_ids(L)
        check_aux_layer_ids(cfg.aux_layer_ids, L)
        problems = []
        if target_cfg.hidden_size != cfg.target_hidden_size:
            problems.append(f"the draft reads features of width {cfg.target_hidden_size}, the target's hidden size is {target_cfg.hidden_size}")
        if target_cfg.vocab_size != cfg.vocab_size:
            problems.append(f"the draft maps to {cfg.vocab_size} tokens, the target has {target_cfg.vocab_size}")
        if problems:
            raise ValueError(f"{src} does not fit the target {target}: " + "; ".join(problems) + ".")
        cfg.target_num_hidden_layers = L
        cfg.target_model_type = cfg.target_model_type or target_cfg.model_type
    if cfg.aux_layer_ids is None:
        raise ValueError(
            f"{src} does not list its aux layers. Pass --target (the engines' default for its depth is used) or "
            "--aux-layer-ids LOW,MID,HIGH (0-based target layer outputs)."
        )
    if verifier is None and target is not None and not Path(target).exists():
        verifier = target
    return export_draft(draft, dst, to, verifier=verifier, num_speculative_tokens=num_speculative_tokens, force=force)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,15,28, got {text!r}") from e


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("src", help="draft to convert: folder or Hub repo id (ours, EAGLE-3 release, SpecForge, speculators)")
    parser.add_argument("dst", help="output folder (must not exist or be empty, unless --force)")
    parser.add_argument(
        "--to", choices=EXPORTS, default="ours",
        help="ours: transformers layout with code files (default); sglang: model_type llama folder served by SGLang "
        "(and by vLLM with method eagle3); vllm: speculators layout (`vllm serve DST`)",
    )
    parser.add_argument("--target", help="target model (Hub id or folder; only its config is read) to check the draft against")
    parser.add_argument("--aux-layer-ids", type=_int_list, help="override the aux layers: LOW,MID,HIGH, 0-based target layer outputs")
    parser.add_argument("--verifier", help="--to vllm: target repo id written into speculators_config (default: --target)")
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="--to vllm: speculative_tokens of the proposal method")
    parser.add_argument("--force", action="store_true", help="replace a non-empty DST")


def run(args) -> int:
    out = convert(
        args.src, args.dst, to=args.to, target=args.target, aux_layer_ids=args.aux_layer_ids,
        verifier=args.verifier, num_speculative_tokens=args.num_speculative_tokens, force=args.force,
    )
    print(f"wrote {args.to} layout to {out}")
    return 0


__all__ = [
    "LAYOUTS",
    "EXPORTS",
    "detect_layout",
    "config_from_layout",
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
