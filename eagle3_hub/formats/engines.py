"""Engine exports: a draft written as the folder vLLM (speculators layout) or SGLang (SpecForge layout) serves,
refusing what the engine would serve differently."""

from __future__ import annotations

import logging
from pathlib import Path

from safetensors.torch import save_file

from ..atomic import atomic_dir, atomic_write_json
from ..configuration_eagle3 import Eagle3Config, default_aux_layer_ids
from .aux_layers import to_vllm_aux_layer_ids
from .layouts import ENGINE_ARCHITECTURE, VARIANT_FLAGS
from .saving import check_savable, identity_vocabulary

logger = logging.getLogger(__name__)

EXPORTS = ("ours", "vllm", "sglang")
# the speculators release whose layout `--to vllm` writes (tests/test_peers.py loads it with that release's code)
SPECULATORS_VERSION = "0.9.0"


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
        "num_hidden_layers": config.num_hidden_layers,
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
        # written only where a layer slides: the single-layer reference's config stays as engines always read it
        **(
            {"layer_types": list(config.layer_types), "sliding_window": config.sliding_window}
            if "sliding_attention" in config.layer_types
            else {}
        ),
    }


def engine_config(
    config: Eagle3Config,
    to: str,
    verifier: str | None = None,
    num_speculative_tokens: int = 3,
    verifier_architectures: list[str] | None = None,
) -> dict:
    """config.json of an engine folder. ``to="sglang"``: SpecForge/SGLang layout (also served by vLLM with
    ``method: eagle3``). ``to="vllm"``: speculators layout (every field speculators 0.9 writes, except its
    ``auto_map`` to a ``config.py`` we do not ship). Refuses what the engine would serve differently."""
    if to not in ("vllm", "sglang"):
        raise ValueError(f"unknown engine layout {to!r}: expected 'vllm' or 'sglang'")
    check_savable(config)
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
        if config.num_hidden_layers > 1:
            raise ValueError(
                f"This draft has {config.num_hidden_layers} decoder layers: SGLang 0.5's LlamaForCausalLMEagle3 builds "
                "the layers after the first as `additional_layers` (other tensor names) whose input is the first "
                "layer's MLP output without its residual, another model. Export with --to vllm instead."
            )
        if "sliding_attention" in config.layer_types:
            raise ValueError(
                f"This draft has sliding-window layers (layer_types {config.layer_types}, sliding_window "
                f"{config.sliding_window}): SGLang 0.5's Llama draft attention has no window and would attend to the "
                "whole context, another model. Export with --to vllm (vLLM windows the draft's layers) instead."
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
            "acceptance in vLLM unless the draft was trained on the un-normalised state.",
            max(ids),
            L,
        )
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(num_speculative_tokens),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures or [])},
        },
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _llama_layer_dict(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": to_vllm_aux_layer_ids(ids),
        "aux_layer_convention": "input",  # of the top-level ids, the only ones in this layout
        **flags,  # vLLM's speculators reader defaults norm_before_residual to True: every key is written
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
    }


def export_draft(
    model,
    save_directory,
    to: str = "ours",
    verifier: str | None = None,
    num_speculative_tokens: int = 3,
    save_embeddings: bool | None = None,
    force: bool = False,
    verifier_architectures: list[str] | None = None,
) -> Path:
    """Write ``model`` as a folder for ``to`` in ``EXPORTS``, atomically (a temporary folder renamed into place).

    ``save_embeddings``: store ``embed_tokens.weight``. Default: for ``vllm`` whenever the draft has one (its own or
    its bound target's), since the speculators library reads the draft's; otherwise only a draft's own.
    ``verifier_architectures``: the target's ``architectures`` for the speculators config (default: the bound
    target's)."""
    if to not in EXPORTS:
        raise ValueError(f"--to must be one of {EXPORTS}, got {to!r}")
    dst = Path(save_directory)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())) and not force:
        raise FileExistsError(f"{dst} exists and is not empty: choose another destination or pass --force.")
    if to != "ours":
        if verifier_architectures is None and model.target is not None:
            verifier_architectures = model.target.config.architectures
        # refusals before any write
        config = engine_config(model.config, to, verifier, num_speculative_tokens, verifier_architectures)
        if model.config.draft_vocab_size == model.config.vocab_size and not identity_vocabulary(model):
            raise ValueError(
                "This draft covers the whole target vocabulary but its d2t map is not the identity: vLLM builds no map "
                "for a full-vocabulary draft and SGLang would apply one vLLM ignores. Re-export it with the identity map."
            )
        if to == "vllm" and model._embedding_missing and not model._embedding_from_target and not save_embeddings:
            # transformers (5.19) fills the absent tensor with zeros and speculators refills only NaN ones from the
            # verifier, so its loader would run (and `speculators train --from-pretrained` start from) a zero embedding
            logger.warning(
                "This draft has no embed_tokens (it uses its target's) and no target was given: the export carries "
                "none. vLLM shares the target's, but the speculators library would run it with a zero embedding. "
                "Pass --target (or bind the draft to its target) to carry the target's embedding."
            )
        if to == "vllm" and not verifier:
            logger.warning(
                "No --verifier given: the speculators config names no target, so `vllm serve DRAFT` cannot find "
                'it; serve with --speculative-config \'{"model": DRAFT, "method": "eagle3"}\' instead.'
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
        # speculators reads the draft's embed_tokens (see export_draft); SGLang and the EAGLE layout share the target's
        own = not (model._embedding_from_target or model._embedding_missing)
        save_embeddings = own or (to == "vllm" and model._embedding_from_target)
    skip = {"d2t", "t2d"} if identity_vocabulary(model) else set()
    if not save_embeddings:
        skip.add("embed_tokens.weight")
    state = {}
    for name, tensor in model.state_dict().items():
        if name in skip:
            continue
        if to == "vllm" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer.") :]
        state[name] = tensor.detach().to("cpu").contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_json(folder / "config.json", config, indent=2)
