"""Every config.json field of a draft, in every layout, is accounted for: read into ``Eagle3Config`` (modelled),
known to leave the draft's forward unchanged (inert), refused by name where it changes the model in a way
``Eagle3DraftModel`` does not implement, or warned about by name when it is unknown."""

from __future__ import annotations

import logging

from transformers import PretrainedConfig

logger = logging.getLogger(__name__)

# read into Eagle3Config by the layout readers (layouts.py, aux_layers.py), or refused there with their own message
MODELLED = frozenset(
    {
        "vocab_size",
        "draft_vocab_size",
        "hidden_size",
        "target_hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "attention_bias",
        "mlp_bias",
        "layer_types",
        "sliding_window",
        "eagle_config",
        "eagle_aux_hidden_state_layer_ids",
        "aux_layer_convention",
        "norm_before_residual",
        "norm_before_fc",
        "fc_norm",
        "use_aux_norm",
        "norm_output",
        "target_num_hidden_layers",
        "target_model_type",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "use_mrope",
        "num_experts",
        "num_local_experts",
        "n_routed_experts",
    }
)
# fields that do not change the draft's forward: names and versions, dtype, training-only settings, transformers' own
# PretrainedConfig keys (v4 wrote its generation defaults into every config), speculators' wrapper keys, the expert
# settings of a layer without experts, a vision target's token ids, Qwen2's window switch when it is off
INERT = frozenset(PretrainedConfig().to_dict()) | frozenset(
    {
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "initializer_range",
        "attention_dropout",
        "pretraining_tp",
        "auto_map",
        "_name_or_path",
        "speculators_config",
        "speculators_model_type",
        "speculators_version",
        "transformer_layer_config",
        "has_no_defaults_at_init",
        "embed_requires_grad",
        "target_layer_count",
        "decoder_sparse_step",
        "mlp_only_layers",
        "moe_intermediate_size",
        "num_experts_per_tok",
        "norm_topk_prob",
        "output_router_logits",
        "router_aux_loss_coef",
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "max_window_layers",
        "use_sliding_window",
        "add_cross_attention",
        "bad_words_ids",
        "begin_suppress_tokens",
        "cross_attention_hidden_size",
        "decoder_start_token_id",
        "diversity_penalty",
        "do_sample",
        "early_stopping",
        "encoder_no_repeat_ngram_size",
        "exponential_decay_length_penalty",
        "finetuning_task",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "is_decoder",
        "length_penalty",
        "max_length",
        "min_length",
        "no_repeat_ngram_size",
        "num_beam_groups",
        "num_beams",
        "num_return_sequences",
        "output_scores",
        "prefix",
        "pruned_heads",
        "remove_invalid_values",
        "repetition_penalty",
        "return_dict_in_generate",
        "sep_token_id",
        "suppress_tokens",
        "task_specific_params",
        "temperature",
        "tf_legacy_loss",
        "tie_encoder_decoder",
        "tokenizer_class",
        "top_k",
        "top_p",
        "torchscript",
        "typical_p",
        "use_bfloat16",
    }
)
# fields of transformers' and the engines' configs that change a layer's output, with the value under which they do
# not: any other value is refused, as Eagle3DraftModel would compute another model
UNMODELLED = {
    "bias": False,  # SGLang: a bias on fc
    "qkv_bias": False,
    "partial_rotary_factor": 1.0,
    "logit_scale": 1.0,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "query_pre_attn_scalar": None,
    "attention_chunk_size": None,
    "use_qk_norm": False,
    "qk_norm": False,
    "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0,
    "attention_multiplier": None,
    "logits_scaling": 1.0,
    "no_rope_layers": None,
}


def check_fields(config: dict, source: str, where: str = "config.json") -> None:
    """Refuse ``config``'s fields that change the model and are not modelled (one line naming each and its value);
    warn by name about unknown fields and about a window without ``layer_types``."""
    refused = [
        f"{k}={config[k]!r}"
        for k, default in UNMODELLED.items()
        if k in config and config[k] not in (default, None) and not (default is False and config[k] == 0)
    ]
    if refused:
        raise ValueError(
            f"{source}'s {where} sets {', '.join(refused)}: Eagle3DraftModel does not implement "
            f"{'this field' if len(refused) == 1 else 'these fields'}, so it would compute another draft than the one "
            "trained. Serve it with the stack it was trained with, or remove the field if it was written by mistake."
        )
    if config.get("sliding_window") and config.get("layer_types") is None and config.get("use_sliding_window") is not False:
        logger.warning(
            "%s's %s sets sliding_window=%s without layer_types: vLLM and speculators window a draft layer only where "
            "layer_types says so, and this load reads every layer as full attention too. Add layer_types "
            '(e.g. ["sliding_attention"]) if the draft was trained with the window.',
            source,
            where,
            config["sliding_window"],
        )
    unknown = sorted(set(config) - MODELLED - INERT - set(UNMODELLED))
    if unknown:
        logger.warning(
            "%s's %s has fields eagle3-hub does not know: %s. They are not modelled: if one changes the draft's "
            "computation, this load is another model.",
            source,
            where,
            unknown,
        )
