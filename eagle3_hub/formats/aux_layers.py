"""Aux-layer conventions: our ids are 0-based target layer *outputs*; vLLM and speculators count layer *inputs*
(ours ``+ 1``). How a published draft's ids are read when it does not say: ``resolve_aux_layer_ids``."""

from __future__ import annotations

import logging

from ..configuration_eagle3 import AUX_LAYER_CONVENTIONS

logger = logging.getLogger(__name__)

AUX_OVERRIDE_HINT = "pass aux_layer_convention='input' or 'output' (--aux-layer-convention) or aux_layer_ids="


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
        if num_target_layers is not None and num_target_layers != L:
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
                source,
                key,
                ids,
                found,
                found,
                usual,
                AUX_OVERRIDE_HINT,
            )
        elif found is None and nested is not None:
            logger.warning(
                "%s: %s=%s does not say whether the ids are target layer outputs (SGLang's Llama/Qwen path, SpecForge) "
                "or inputs (vLLM, SGLang's DeepSeek path); reading them as outputs. If the draft was trained on layer "
                "inputs, %s.",
                source,
                key,
                ids,
                AUX_OVERRIDE_HINT,
            )
    return from_vllm_aux_layer_ids(ids) if stated == "input" else ids
