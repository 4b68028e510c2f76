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

Decoder layers (every layout): ``num_hidden_layers`` (tensors ``layers.{i}.*`` after the first), ``layer_types`` and
``sliding_window`` in transformers' convention; the SGLang export refuses drafts that use them.

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

Modules: ``aux_layers`` (the two id conventions), ``files`` (reading a folder or Hub snapshot), ``fields`` (every
config field modelled, inert, refused or warned about), ``layouts`` (detection, configs, tensor checks, the loading
hook), ``saving`` (the save hooks), ``engines`` (engine folders), ``convert``.
Importing this package puts its loading and saving hooks into ``Eagle3DraftModel`` (``wire``; the model file never
imports it, as the model code is also shipped alone, as remote code). ``import eagle3_hub`` alone already makes the
model import this package on its first load or save, and AutoConfig / AutoModel know the draft (``registration``).
"""

from __future__ import annotations

from ..configuration_eagle3 import default_aux_layer_ids
from ..modeling_eagle3 import register_layout_hooks
from .aux_layers import (
    AUX_OVERRIDE_HINT,
    engine_default_aux_layer_ids,
    from_vllm_aux_layer_ids,
    reference_convention,
    resolve_aux_layer_ids,
    to_vllm_aux_layer_ids,
)
from .convert import convert
from .engines import EXPORTS, SPECULATORS_VERSION, engine_config, export_draft
from .files import PICKLE_SUFFIXES, read_config_dict, resolve_folder, safetensors_files, tensor_shapes
from .layouts import (
    ENGINE_ARCHITECTURE,
    LAYOUTS,
    MOE_KEYS,
    VARIANT_FLAGS,
    aux_layer_ids_in_config,
    check_tensors,
    config_from_layout,
    detect_layout,
    expected_tensors,
    load_foreign_draft,
    variant_flags,
)
from .saving import AUTO_MAP, CODE_FILES, engine_keys, finish_save, identity_vocabulary, prepare_save


def wire() -> None:
    """``Eagle3DraftModel.from_pretrained`` / ``save_pretrained`` call this package's hooks (at import, and again
    harmlessly). The Auto classes are ``eagle3_hub.registration``'s."""
    register_layout_hooks(load=load_foreign_draft, prepare_save=prepare_save, finish_save=finish_save)


wire()

__all__ = [
    "LAYOUTS",
    "EXPORTS",
    "SPECULATORS_VERSION",
    "VARIANT_FLAGS",
    "MOE_KEYS",
    "CODE_FILES",
    "AUTO_MAP",
    "ENGINE_ARCHITECTURE",
    "PICKLE_SUFFIXES",
    "AUX_OVERRIDE_HINT",
    "detect_layout",
    "variant_flags",
    "config_from_layout",
    "aux_layer_ids_in_config",
    "expected_tensors",
    "check_tensors",
    "resolve_folder",
    "read_config_dict",
    "safetensors_files",
    "tensor_shapes",
    "resolve_aux_layer_ids",
    "reference_convention",
    "load_foreign_draft",
    "prepare_save",
    "finish_save",
    "engine_keys",
    "identity_vocabulary",
    "engine_config",
    "export_draft",
    "convert",
    "wire",
    "to_vllm_aux_layer_ids",
    "from_vllm_aux_layer_ids",
    "engine_default_aux_layer_ids",
    "default_aux_layer_ids",
]
