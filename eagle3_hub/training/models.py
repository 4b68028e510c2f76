"""The models of a training run: the target, checked against the recipe before anything is written, and the draft to
train (a new one, the draft of ``draft.init_from`` continued, or LoRA adapters on it)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import Eagle3DraftModel
from ..extras import missing_extra
from ..targets import check_aux_layer_ids, load_target, num_decoder_layers
from .recipe import draft_config_overrides
from .sources import DataError
from .vocab import remap_draft_vocab


def load_checked_target(recipe: dict, device):
    """The frozen target and its tokenizer (with ``target.chat_template``), checked against the recipe's draft."""
    tg, d = recipe["target"], recipe["draft"]
    target, tokenizer = load_target(
        tg["name"], dtype=tg["dtype"], device=device, gguf_file=tg["gguf_file"], adapter=tg["adapter"]
    )
    if tg["chat_template"]:
        tokenizer.chat_template = tg["chat_template"]
    if not tokenizer.chat_template:
        raise DataError(
            f"The tokenizer of {tg['name'] or 'the target'} has no chat template: the loss mask needs one. "
            "Set target.chat_template in the recipe (a base model: e.g. the prompt, a newline, the "
            "continuation; see recipes/gemma-3-270m.yaml), or use a chat (instruct) model."
        )
    L = num_decoder_layers(target)
    if d["aux_layer_ids"] is not None:
        check_aux_layer_ids(d["aux_layer_ids"], L)
    vocab_size = target.config.get_text_config().vocab_size
    size = d["draft_vocab_size"]
    if size is not None and not 0 < size <= vocab_size:
        raise ValueError(f"draft.draft_vocab_size={size} must be in 1..{vocab_size} (the target vocabulary)")
    return target, tokenizer


def load_init_draft(path: str, target) -> Eagle3DraftModel:
    """An existing draft to continue from (``draft.init_from``): it must fit the target."""
    draft = Eagle3DraftModel.from_pretrained(path, target=target)  # checks the fit, shares the target's embedding
    return draft.unbind(keep_target=False)  # training calls the target itself: no feature hooks


def load_continued_draft(recipe: dict, target, is_main_process: bool) -> tuple[Eagle3DraftModel | None, list[dict]]:
    """The draft of ``draft.init_from`` (None without one), checked against the recipe, and its lineage."""
    d = recipe["draft"]
    if not d["init_from"]:
        return None, []
    init = load_init_draft(d["init_from"], target)
    for key, value in draft_config_overrides(recipe).items():  # e.g. fc_norm: Eagle3Config keys of the draft section
        if getattr(init.config, key, None) != value:
            raise ValueError(
                f"draft.{key}={value!r} changes the architecture of draft.init_from ({d['init_from']} has "
                f"{getattr(init.config, key, None)!r}): a continued draft keeps its own; remove the key, or "
                "train a new draft (no init_from)."
            )
    earlier = earlier_stages(d["init_from"])  # read now: output_dir may be init_from
    size = d["draft_vocab_size"]
    if not d["reselect_vocab"] and size != init.config.draft_vocab_size and is_main_process:
        print(
            f"[vocab] draft.init_from keeps its own vocabulary of {init.config.draft_vocab_size} tokens "
            f"(draft.draft_vocab_size={size} is not used; draft.reselect_vocab: true chooses a new one)"
        )
    return init, earlier


def earlier_stages(init_from: str) -> list[dict]:
    """The lineage of a draft that training continues: its own ``training_metrics.json`` (local folder or Hub
    repo) summarised, after the stages it lists itself. Empty when the draft carries none."""
    path = Path(init_from) / "training_metrics.json"
    if not path.exists():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(init_from, "training_metrics.json"))
        except Exception:  # no such file, no network, not a repo id: the lineage is unknown, training goes on
            return []
    prev = json.loads(path.read_text())
    recipe = prev.get("recipe") or {}
    data = recipe.get("data") or {}
    stage = {
        "init_from": (recipe.get("draft") or {}).get("init_from"),
        "sources": [src if isinstance(src, str) else src.get("path") for src in data.get("sources") or []],
        "synthesize": data.get("synthesize"),
        "training_samples": (prev.get("data") or {}).get("train"),
        "steps": prev.get("steps"),
        "batch_size": (recipe.get("train") or {}).get("batch_size"),
        "lr": (recipe.get("train") or {}).get("lr"),
        "wall_time_s": prev.get("wall_time_s"),
        "expected_acceptance_length": (prev.get("acceptance") or {}).get("expected_acceptance_length"),
    }
    return list(prev.get("earlier_stages") or []) + [stage]


@torch.no_grad()
def init_head_from_target(draft: Eagle3DraftModel, target) -> None:
    """``draft.lm_head`` <- the target's output rows of the draft vocabulary, scaled by the target's final norm.

    The draft normalises with a plain RMSNorm (weight 1 here); the target's final norm multiplies each channel
    by its own gain (``w`` for Llama, ``1 + w`` for Gemma). Feeding the norm an all-ones vector (RMS 1) reads
    that gain whatever the parametrisation, and folding it into the rows makes ``lm_head(norm(h))`` equal the
    target's logits of those tokens (before any final soft-capping, which keeps the order)."""
    head = target.get_output_embeddings()
    norm = getattr(target.get_decoder(), "norm", None)
    if head is None or norm is None:
        raise ValueError(
            f"draft.head_from_target: {type(target).__name__} exposes no output embedding and final norm; "
            "set draft.head_from_target to false."
        )
    ids = draft.draft_to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device))
    weight = head.weight.detach().float()
    gain = _gain(norm, weight.shape[1])  # (H,)
    draft.norm.weight.fill_(1.0)
    draft.lm_head.weight.copy_((weight[ids.to(weight.device)] * gain).to(draft.lm_head.weight))


def _gain(norm, width: int) -> torch.Tensor:
    """A norm's per-channel gain whatever its parametrisation (``w`` for Llama, ``1 + w`` for Gemma): its output
    for an all-ones input, whose RMS is 1."""
    probe = torch.ones(1, width, dtype=next(norm.parameters()).dtype, device=next(norm.parameters()).device)
    return norm(probe).float()[0]


@torch.no_grad()
def init_layer_from_target(draft: Eagle3DraftModel, target, index: int) -> None:
    """The draft's first decoder layer <- target layer ``index``; ``fc`` <- the last aux feature passed through.

    The draft's q/k/v read ``[norm(embedding) ; norm(feature)]``: each half gets half the target's weight, so equal
    inputs on both sides give the target layer's attention, and the draft's norms take the target's gains."""
    layers = target.get_decoder().layers
    L = len(layers)
    if not -L <= index < L:
        raise ValueError(f"draft.layer_from_target={index}: the target has {L} layers; use 0..{L - 1} or -{L}..-1")
    layer = layers[index]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    norms = ("q_norm", "k_norm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
    extra = [n for n in norms if hasattr(layer, n) or hasattr(attn, n)]
    plain = attn is not None and mlp is not None and all(hasattr(attn, n) for n in names) and hasattr(layer, "input_layernorm")
    if not plain or extra:
        raise ValueError(
            f"draft.layer_from_target: layer {index} of {type(target).__name__} is not a Llama-shaped layer "
            f"({', '.join(extra) or 'no q/k/v/o projections'}); the draft's layer has no place for it: remove the key."
        )
    mid, H = draft.midlayer, draft.config.hidden_size
    pairs = [(getattr(mid.self_attn, n), getattr(attn, n)) for n in names]
    pairs += [(getattr(mid.mlp, n), getattr(mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")]
    qkv = [mid.self_attn.q_proj, mid.self_attn.k_proj, mid.self_attn.v_proj]
    for mine, theirs in pairs:
        want = (mine.weight.shape[0], mine.weight.shape[1] // (2 if mine in qkv else 1))
        if tuple(theirs.weight.shape) != want:
            raise ValueError(
                f"draft.layer_from_target: the target's {tuple(theirs.weight.shape)} weights do not fit the draft's "
                f"{tuple(mine.weight.shape)}: leave draft.intermediate_size at the target's, or remove the key."
            )
        if mine.bias is None and theirs.bias is not None:
            key = "attention_bias" if mine in qkv or mine is mid.self_attn.o_proj else "mlp_bias"
            raise ValueError(
                f"draft.layer_from_target: the target's layer has biases where the draft has none: set draft.{key}: true."
            )
    for mine, theirs in pairs:
        w = theirs.weight.float()
        if mine in qkv:
            w = torch.cat([w, w], dim=1) / 2
        mine.weight.copy_(w)
        if mine.bias is not None and theirs.bias is not None:
            mine.bias.copy_(theirs.bias.float())
        elif mine.bias is not None:  # a draft bias the target lacks (Qwen2's o_proj) starts at zero
            mine.bias.zero_()
    gain = _gain(layer.input_layernorm, H)
    mid.input_layernorm.weight.copy_(gain)
    mid.hidden_norm.weight.copy_(gain)
    mid.post_attention_layernorm.weight.copy_(_gain(layer.post_attention_layernorm, H))
    Ht = draft.config.target_hidden_size
    if Ht == H:  # the fused feature starts as the deepest layer the draft reads
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * Ht :].copy_(torch.eye(H))


def build_draft(recipe: dict, target, init: Eagle3DraftModel | None, vocab_ids: torch.Tensor, vocab_info: dict, accelerator):
    """The fp32 draft to train: ``init`` (with reselect_vocab remapped to ``vocab_ids``) or a new one, LoRA if enabled."""
    d, t = recipe["draft"], recipe["train"]
    if init is not None:
        draft = init
        if d["reselect_vocab"]:
            draft = draft.float()
            vocab_info["remap"] = remap_draft_vocab(draft, vocab_ids, target.get_output_embeddings().weight)
            if accelerator.is_main_process:
                print(
                    f"[vocab] chosen anew (init_from's covered {vocab_info['init_from_coverage']:.2%}); "
                    f"lm_head rows {vocab_info['remap']}"
                )
    else:
        draft = Eagle3DraftModel.from_target(
            target,
            aux_layer_ids=d["aux_layer_ids"],
            draft_vocab_size=d["draft_vocab_size"],
            intermediate_size=d["intermediate_size"],
            **draft_config_overrides(recipe),
        )
        draft.set_vocab_mapping(vocab_ids)
        if d["head_from_target"]:
            init_head_from_target(draft, target)
        if d["layer_from_target"] is not None:
            init_layer_from_target(draft, target, d["layer_from_target"])
    draft = draft.float().to(accelerator.device)  # fp32 master weights; autocast does the rest
    draft.embed_tokens.weight.requires_grad_(False)
    if recipe["lora"]["enabled"]:
        try:
            from peft import LoraConfig, get_peft_model
        except ModuleNotFoundError as e:
            raise missing_extra("train", e) from None

        lc = recipe["lora"]
        draft.requires_grad_(False)
        draft = get_peft_model(
            draft, LoraConfig(r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=lc["dropout"], target_modules=lc["target_modules"])
        )
    if t["gradient_checkpointing"]:
        draft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    draft.train()
    return draft


def draft_aux_ids(draft) -> list[int]:
    """The target layers whose outputs the draft reads, under any wrapper (DDP, PEFT)."""
    model = draft
    while not hasattr(model, "config") or not hasattr(model.config, "aux_layer_ids"):
        model = model.base_model if hasattr(model, "base_model") and model.base_model is not model else model.module
    return model.config.aux_layer_ids
