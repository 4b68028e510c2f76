"""The EAGLE-3 draft model, in the style of transformers' ``modeling_llama.py``.

This file is shipped next to the weights of every saved draft (``trust_remote_code``): it imports only
torch, transformers and its sibling files.

Data flow of one draft step (b = batch, s = new positions, H = draft hidden, Ht = target hidden):

    target features  (b, s, 3*Ht) --fc-->  fused (b, s, H)          first step after the target
    or the draft's own pre-norm output     (b, s, H)                later steps
    token embedding of the *next* token    (b, s, H)
    midlayer: attn(q/k/v over cat(input_layernorm(emb), hidden_norm(fused)) (b, s, 2H)) + fused,
              then post_attention_layernorm -> MLP -> residual            -> hidden (b, s, H), pre-norm
    layers.1..: Llama decoder layers over that hidden (num_hidden_layers > 1) -> hidden (b, s, H), pre-norm
    lm_head(norm(hidden))                  (b, s, draft_vocab)          draft logits
    target id of draft id i:  i + d2t[i]

Position convention: the feature of target position t (which predicted token t+1) is paired with the
embedding of token t+1 at position id t; the output predicts token t+2. Later draft steps use t+1, t+2, ...
A ``sliding_attention`` layer (``config.layer_types``) sees the keys of positions ``> p - sliding_window`` only.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import sliding_window_causal_mask_function, sliding_window_overlay
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)
from transformers.utils import ModelOutput

try:  # package import
    from .configuration_eagle3 import Eagle3Config
    from .eagle3_assistant import Eagle3AssistantMixin
except ImportError:  # flat import (files copied next to the weights, transformers' remote code)
    from configuration_eagle3 import Eagle3Config  # type: ignore
    from eagle3_assistant import Eagle3AssistantMixin  # type: ignore


@dataclass
class Eagle3DraftOutput(ModelOutput):
    """logits: (b, s, draft_vocab). hidden_states: (b, s, H) pre-norm output that feeds the next draft step."""

    logits: torch.FloatTensor | None = None
    hidden_states: torch.FloatTensor | None = None
    cache: Cache | None = None


def in_window(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Whether a key at position ``k_pos`` is inside the sliding window of a query at ``q_pos`` (broadcast): the one
    window rule of the draft (model, tree decoding, training), transformers' own overlay."""
    return sliding_window_overlay(window)(None, None, q_pos, k_pos)


def layer_mask(attention_mask, layer_type: str):
    """The mask of one layer: transformers' ``{layer_type: mask}`` dict, or one mask (or None) for every layer."""
    return attention_mask[layer_type] if isinstance(attention_mask, dict) else attention_mask


class Eagle3Attention(nn.Module):
    """Llama attention; the first layer's q/k/v read ``2 * hidden_size`` (embedding and fused feature side by side).
    ``layer_idx`` is its index in the draft cache; a ``sliding_attention`` layer hides keys ``sliding_window``
    positions or more behind the query."""

    def __init__(self, config: Eagle3Config, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_kv_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim**-0.5
        sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.sliding_window = config.sliding_window if sliding else None
        in_dim = 2 * config.hidden_size if layer_idx == 0 else config.hidden_size
        self.q_proj = nn.Linear(in_dim, self.num_heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(in_dim, self.num_kv_heads * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(in_dim, self.num_kv_heads * self.head_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_bias)

    def forward(
        self,
        x: torch.Tensor,  # (b, s, 2H) in the first layer, (b, s, H) after it
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,  # (b, 1, s, kv) additive, or None for causal (and windowed)
        cache: Cache | None = None,
        ttt_cache: list | None = None,
        ttt_step: int = 0,
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, s, d)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (b, hkv, s, d)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)

        if ttt_cache is not None:
            out = self._ttt_attention(q, k, v, attention_mask, ttt_cache[self.layer_idx], ttt_step)
        else:
            if cache is not None:
                k, v = cache.update(k, v, self.layer_idx)
            k, v = repeat_kv(k, self.num_kv_groups), repeat_kv(v, self.num_kv_groups)
            kv = k.shape[2]
            if attention_mask is None and s > 1 and kv == s and (self.sliding_window is None or s <= self.sliding_window):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
            elif attention_mask is None and (s > 1 or (self.sliding_window is not None and kv > self.sliding_window)):
                # new tokens follow a cached prefix: causal over the whole kv (cache index = position), and windowed
                q_idx = torch.arange(kv - s, kv, device=q.device)[:, None]
                k_idx = torch.arange(kv, device=q.device)[None, :]
                if self.sliding_window is None:
                    mask = k_idx <= q_idx
                else:
                    mask = sliding_window_causal_mask_function(self.sliding_window)(None, None, q_idx, k_idx)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
            else:
                if attention_mask is not None:
                    attention_mask = attention_mask.to(q.dtype)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=self.scaling)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out)

    def _ttt_attention(self, q, k, v, causal_mask, ttt_cache: list, ttt_step: int) -> torch.Tensor:
        """Training-time-test attention (EAGLE-3): step 0 is causal over the sequence; step j > 0 adds only
        the keys of steps 1..j at the *same* position (the diagonal). ``ttt_cache`` holds (k, v) per step;
        ``ttt_step`` is this step's index (a recomputation under gradient checkpointing does not append)."""
        if len(ttt_cache) == ttt_step:
            ttt_cache.append((k, v))
        entries = ttt_cache[:ttt_step] + [(k, v)]
        if self.sliding_window is not None:  # the diagonal key of step i sits ttt_step - i positions back
            entries = entries[:1] + [e for i, e in enumerate(entries[1:], 1) if ttt_step - i < self.sliding_window]
        k0, v0 = entries[0]
        k0, v0 = repeat_kv(k0, self.num_kv_groups), repeat_kv(v0, self.num_kv_groups)
        scores = torch.matmul(q, k0.transpose(2, 3)) * self.scaling  # (b, h, s, s)
        if causal_mask is not None:
            scores = scores + causal_mask
        if len(entries) == 1:
            probs = scores.float().softmax(-1).to(q.dtype)
            return torch.matmul(probs, v0)
        diag_k = [repeat_kv(kj, self.num_kv_groups) for kj, _ in entries[1:]]
        diag_v = [repeat_kv(vj, self.num_kv_groups) for _, vj in entries[1:]]
        diag = torch.stack([(q * kj).sum(-1) for kj in diag_k], dim=-1) * self.scaling  # (b, h, s, j)
        probs = torch.cat([scores, diag], dim=-1).float().softmax(-1).to(q.dtype)
        s = scores.shape[-1]
        out = torch.matmul(probs[..., :s], v0)
        for j, vj in enumerate(diag_v):
            out = out + probs[..., s + j, None] * vj
        return out


class Eagle3DecoderLayer(nn.Module):
    """The first draft layer: attention over ``[input_layernorm(embedding) ; hidden_norm(feature)]``."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.layer_type = config.layer_types[0]
        self.self_attn = Eagle3Attention(config, 0)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual

    def forward(
        self,
        input_embeds: torch.Tensor,  # (b, s, H)
        hidden_states: torch.Tensor,  # (b, s, H) fused feature or previous draft output
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        ttt_cache: list | None = None,
        ttt_step: int = 0,
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden_states)
        residual = normed if self.norm_before_residual else hidden_states  # the reference keeps the raw feature
        x = torch.cat([self.input_layernorm(input_embeds), normed], dim=-1)  # (b, s, 2H)
        mask = layer_mask(attention_mask, self.layer_type)
        hidden_states = residual + self.self_attn(x, position_embeddings, mask, cache, ttt_cache, ttt_step)
        residual = hidden_states
        hidden_states = residual + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states


class Eagle3LaterDecoderLayer(nn.Module):
    """A draft layer after the first: transformers' Llama decoder layer over the previous layer's output (the
    layers ``1..`` of vLLM's and speculators' multi-layer EAGLE-3 drafts)."""

    def __init__(self, config: Eagle3Config, layer_idx: int):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        self.self_attn = Eagle3Attention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, ttt_cache=None, ttt_step=0):
        mask = layer_mask(attention_mask, self.layer_type)
        x = self.input_layernorm(hidden_states)
        hidden_states = hidden_states + self.self_attn(x, position_embeddings, mask, cache, ttt_cache, ttt_step)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Eagle3PreTrainedModel(PreTrainedModel):
    config_class = Eagle3Config
    config: Eagle3Config
    base_model_prefix = ""
    supports_gradient_checkpointing = True
    _no_split_modules = ["Eagle3DecoderLayer", "Eagle3LaterDecoderLayer"]
    _supports_sdpa = True
    # the embedding is the target's: drafts are usually published without it
    _keys_to_ignore_on_load_missing = [r"embed_tokens\.weight"]

    def _init_weights(self, module):
        super()._init_weights(module)  # Linear, Embedding, RMSNorm, rotary buffers (respects loaded weights)
        if isinstance(module, Eagle3DraftModel):
            # identity vocabulary map until `set_vocab_mapping` (training) or a checkpoint sets it
            init.zeros_(module.d2t)
            init.copy_(module.t2d, torch.arange(module.t2d.numel(), device=module.t2d.device) < module.d2t.numel())


class Eagle3DraftModel(Eagle3AssistantMixin, Eagle3PreTrainedModel, GenerationMixin):
    """EAGLE-3 draft. ``forward`` runs one draft step over ``s`` positions; ``bind(target)`` attaches it to a
    target (embedding, feature hooks) so that ``target.generate(..., assistant_model=draft)`` works."""

    def __init__(self, config: Eagle3Config):
        super().__init__(config)
        H = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, H, padding_idx=None)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen
        Ht = config.target_hidden_size
        # EAGLE-3 variants that normalise the target features before fc (vLLM / SGLang / SpecForge names)
        self.input_norm = LlamaRMSNorm(3 * Ht, eps=config.rms_norm_eps) if config.norm_before_fc else None
        self.fc_norm = nn.ModuleList([LlamaRMSNorm(Ht, eps=config.rms_norm_eps) for _ in range(3)]) if config.fc_norm else None
        self.fc = nn.Linear(3 * Ht, H, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        # layers 1.. keyed by their index: tensors `layers.{i}.*`, the names vLLM and speculators give them
        self.layers = nn.ModuleDict({str(i): Eagle3LaterDecoderLayer(config, i) for i in range(1, config.num_hidden_layers)})
        self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.gradient_checkpointing = False
        self._target_ref = None
        self._embedding_from_target = False
        self.post_init()

    # ------------------------------------------------------------------ vocabulary maps
    def draft_to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def set_vocab_mapping(self, target_ids: torch.Tensor):
        """``target_ids``: (draft_vocab,) target token ids of the draft vocabulary, in draft order."""
        target_ids = torch.as_tensor(target_ids, dtype=torch.long, device=self.d2t.device)
        if target_ids.numel() != self.config.draft_vocab_size:
            raise ValueError(
                f"set_vocab_mapping got {target_ids.numel()} ids for a draft vocabulary of {self.config.draft_vocab_size}"
            )
        with torch.no_grad():
            self.d2t.copy_(target_ids - torch.arange(target_ids.numel(), device=target_ids.device))
            self.t2d.zero_()
            self.t2d[target_ids] = True

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    @property
    def target(self):
        return self._target_ref() if self._target_ref is not None else None

    def fuse(self, target_hidden_states: torch.Tensor) -> torch.Tensor:
        """(b, s, 3*Ht) concatenated aux-layer features -> (b, s, H)."""
        x = target_hidden_states.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:  # EAGLE 3.1: each target layer's feature normalised on its own
            x = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, x.chunk(3, dim=-1))], dim=-1)
        return self.fc(x)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (b, s): the token *after* each feature's position
        hidden_states: torch.Tensor | None = None,  # (b, s, H): the previous step's `out.hidden_states` (pre-norm)
        target_hidden_states: torch.Tensor | None = None,  # (b, s, 3*Ht): raw aux features, fused by fc
        position_ids: torch.LongTensor | None = None,  # (b, s)
        # None (causal, windowed in sliding layers), (b, 1, s, kv) additive float, or {layer type: that mask}
        attention_mask: torch.Tensor | dict | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        ttt_cache: list | None = None,
        logits_to_keep: int | torch.Tensor = 0,  # N: the last N positions; a (b, s) bool mask: logits (n, Vd)
        **kwargs,
    ) -> Eagle3DraftOutput:
        cache = kwargs.pop("past_key_values", cache)
        if (hidden_states is None) == (target_hidden_states is None):
            raise ValueError("Eagle3DraftModel.forward needs exactly one of `hidden_states` or `target_hidden_states`")
        if target_hidden_states is not None:
            if target_hidden_states.shape[-1] != 3 * self.config.target_hidden_size:
                raise ValueError(
                    f"target_hidden_states has width {target_hidden_states.shape[-1]}, the draft's fc expects "
                    f"3 * target_hidden_size = {3 * self.config.target_hidden_size}: was the draft made for this target?"
                )
            hidden_states = self.fuse(target_hidden_states)
        elif self.config.norm_output:  # EAGLE 3.1 post-norm feedback: the next step reads norm(h)
            hidden_states = self.norm(hidden_states)
        assert hidden_states is not None  # exactly one of the two was given (checked above)
        if inputs_embeds is None:
            if not self._embedding_from_target and self._embedding_missing:
                raise RuntimeError(
                    "This draft was saved without `embed_tokens.weight` (it uses its target's embedding). "
                    "Call `draft.bind(target)` or load it with `from_pretrained(path, target=target)` first."
                )
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds.to(hidden_states.dtype)
        b, s, _ = hidden_states.shape
        if use_cache and cache is None and ttt_cache is None:
            cache = DynamicCache()
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + s, device=hidden_states.device).unsqueeze(0).expand(b, -1)
        if isinstance(attention_mask, torch.Tensor) and "sliding_attention" in self.config.layer_types:
            # one explicit mask cannot say where the window ends: the caller knows the key positions, the model not
            raise ValueError(
                "This draft has sliding-window layers: pass attention_mask as {'full_attention': mask, "
                "'sliding_attention': windowed mask} (transformers' convention), or None for causal attention."
            )
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        if ttt_cache is not None and not ttt_cache:
            ttt_cache.extend([] for _ in range(self.config.num_hidden_layers))  # (k, v) of each step, per layer
        ttt_step = len(ttt_cache[0]) if ttt_cache is not None else 0
        checkpointed = self.gradient_checkpointing and self.training
        if checkpointed:
            hidden_states = self._gradient_checkpointing_func(
                self.midlayer.__call__,
                inputs_embeds,
                hidden_states,
                position_embeddings,
                attention_mask,
                None,
                ttt_cache,
                ttt_step,
            )
        else:
            hidden_states = self.midlayer(
                inputs_embeds, hidden_states, position_embeddings, attention_mask, cache, ttt_cache, ttt_step
            )
        for layer in self.layers.values():
            if checkpointed:
                hidden_states = self._gradient_checkpointing_func(
                    layer.__call__, hidden_states, position_embeddings, attention_mask, None, ttt_cache, ttt_step
                )
            else:
                hidden_states = layer(hidden_states, position_embeddings, attention_mask, cache, ttt_cache, ttt_step)
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dtype == torch.bool:
            kept = hidden_states[logits_to_keep]  # (n, H): only the positions a loss scores (training)
        else:
            kept = hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
        logits = self.lm_head(self.norm(kept))
        return Eagle3DraftOutput(logits=logits, hidden_states=hidden_states, cache=cache)

    # ------------------------------------------------------------------ loading
    _embedding_missing = False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, target=None, **kwargs):
        """Loads a draft in our layout or, when ``eagle3_hub`` is installed, in the EAGLE / SpecForge /
        speculators layouts. ``target=`` binds it (embedding from the target, feature hooks)."""
        kwargs.setdefault("use_safetensors", True)  # never unpickle weights
        model = None
        load_foreign = _layout_hooks().get("load")
        if load_foreign is not None:
            model = load_foreign(cls, pretrained_model_name_or_path, *args, target=target, **kwargs)
        if model is None:
            output_loading_info = kwargs.pop("output_loading_info", False)
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
            model._check_loading_info(info)
            if output_loading_info:
                return model, info
        check_finite_weights(model[0] if isinstance(model, tuple) else model, pretrained_model_name_or_path)
        if target is not None:
            (model[0] if isinstance(model, tuple) else model).bind(target)
        return model

    def _check_loading_info(self, info: dict):
        optional = {"embed_tokens.weight"}
        if self.config.draft_vocab_size == self.config.vocab_size:
            optional |= {"d2t", "t2d"}  # full vocabulary: the identity map, not stored
        missing = [k for k in info.get("missing_keys", []) if k not in optional]
        mismatched = info.get("mismatched_keys", [])
        if missing or mismatched:
            raise ValueError(
                f"This checkpoint is not a complete EAGLE-3 draft: missing tensors {sorted(missing)}, "
                f"misshaped tensors {[m[0] if isinstance(m, tuple) else m for m in mismatched]}. "
                "Check that it is an EAGLE-3 draft and that its config.json matches its weights."
            )
        if self.d2t.numel() and not self.d2t.is_meta:
            target_ids = self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)
            if int(target_ids.min()) < 0 or int(target_ids.max()) >= self.config.vocab_size:
                raise ValueError(
                    f"This checkpoint's d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, "
                    f"outside its vocab_size {self.config.vocab_size}: the vocabulary map is broken. Re-export the draft "
                    "(draft.set_vocab_mapping(target_ids))."
                )
        # `embed_tokens.weight` is in `_keys_to_ignore_on_load_missing`, so transformers leaves it out of
        # `missing_keys`; a loaded tensor carries `_is_hf_initialized`, a newly initialised one does not
        self._embedding_missing = "embed_tokens.weight" in info.get("missing_keys", []) or not getattr(
            self.embed_tokens.weight, "_is_hf_initialized", False
        )

    def save_pretrained(self, save_directory, *args, save_embeddings: bool | None = None, **kwargs):
        """Writes config, weights (safetensors) and the code files for ``trust_remote_code``.

        ``save_embeddings``: store ``embed_tokens.weight``. Default: only when the draft owns its embedding
        (not shared from a bound target), as the official EAGLE-3 releases do.
        """
        if save_embeddings is None:
            save_embeddings = not (self._embedding_from_target or self._embedding_missing)
        state_dict = kwargs.pop("state_dict", None)
        if state_dict is None:
            state_dict = {k: v for k, v in self.state_dict().items() if save_embeddings or k != "embed_tokens.weight"}
        self.config.architectures = ["Eagle3DraftModel"]
        hooks = _layout_hooks()
        prepare_save, finish_save = hooks.get("prepare_save"), hooks.get("finish_save")
        if prepare_save is not None:
            prepare_save(self)
        out = super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)
        if finish_save is not None:
            finish_save(self, save_directory)
        return out

    # ------------------------------------------------------------------ sizing from a target
    @classmethod
    def from_target(
        cls,
        target,
        aux_layer_ids: list[int] | None = None,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
        **config_overrides,
    ) -> Eagle3DraftModel:
        """An untrained draft sized to ``target`` (any causal LM): its text config, its embedding."""
        try:
            from eagle3_hub.targets import draft_config_from_target
        except ImportError as e:  # pragma: no cover - remote-code users size drafts with the package
            raise ImportError("from_target needs the eagle3_hub package: pip install eagle3-hub") from e
        config = draft_config_from_target(
            target,
            aux_layer_ids=aux_layer_ids,
            draft_vocab_size=draft_vocab_size,
            intermediate_size=intermediate_size,
            **config_overrides,
        )
        emb = target.get_input_embeddings().weight
        model = cls(config).to(device=emb.device, dtype=emb.dtype)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(emb[: config.vocab_size])
        return model

    def check_fits(self, target):
        """Raise one ``ValueError`` line naming every way this draft does not fit ``target`` (any causal LM):
        feature width, vocabulary, aux layers, the vocabulary map and the embedding. The one fit rule of
        eagle3-hub: binding, tree decoding, the CLI and the demo all call it."""
        cfg = target.config.get_text_config()
        dc = self.config
        problems = []
        if cfg.hidden_size != dc.target_hidden_size:
            problems.append(
                f"the draft reads features of width {dc.target_hidden_size}, the target's hidden size is {cfg.hidden_size}"
            )
        if cfg.vocab_size != dc.vocab_size:
            problems.append(f"the draft maps to a vocabulary of {dc.vocab_size} tokens, the target has {cfg.vocab_size}")
        L = cfg.num_hidden_layers
        ids = dc.aux_layer_ids
        if ids is None:
            problems.append(
                "the draft lists no aux layers (set draft.config.aux_layer_ids, or load it with target= or aux_layer_ids=)"
            )
        elif len(ids) != 3 or any(not 0 <= int(i) < L for i in ids):
            problems.append(f"aux layers {ids} do not exist in a target with {L} decoder layers")
        elif dc.target_num_hidden_layers not in (None, L):
            problems.append(f"the draft was sized for a target with {dc.target_num_hidden_layers} layers, this one has {L}")
        if not self.d2t.is_meta and self.d2t.numel():
            target_ids = self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)
            lo, hi = int(target_ids.min()), int(target_ids.max())
            if lo < 0 or hi >= cfg.vocab_size:
                problems.append(
                    f"its d2t map sends draft ids to target ids {lo}..{hi}, outside the target's {cfg.vocab_size} tokens "
                    "(a broken or foreign vocabulary map)"
                )
        if self._embedding_missing and not self._embedding_from_target:
            emb = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
            weight = getattr(emb, "weight", None)
            if weight is None or weight.ndim != 2 or weight.shape[1] != dc.hidden_size or weight.shape[0] < dc.vocab_size:
                shape = None if weight is None else list(weight.shape)
                problems.append(
                    f"the draft has no embed_tokens.weight and the target's input embedding {shape} cannot stand in "
                    f"for one of [{dc.vocab_size}, {dc.hidden_size}]"
                )
        if problems:
            raise ValueError(
                "This draft does not fit the target: " + "; ".join(problems) + ". Use a draft trained for this "
                "target (or train one: `eagle3-hub train --target ...`)."
            )

    def bind(self, target):
        """Attach to ``target``: check that the two fit, share its embedding when the draft has none, and
        register the feature hooks used by assisted generation."""
        self.check_fits(target)
        from_target = False
        if self._embedding_missing or self._embedding_from_target:
            emb = target.get_input_embeddings().weight
            self.embed_tokens.weight = nn.Parameter(emb.detach()[: self.config.vocab_size], requires_grad=False)
            from_target = True
        self._embedding_from_target = from_target or self._embedding_from_target
        self._target_ref = weakref.ref(target)
        self._register_feature_hooks(target)
        return self


def non_finite_tensors(model: nn.Module) -> list[str]:
    """The names of ``model``'s floating-point tensors (weights and buffers) holding NaN or Inf."""
    return [
        name
        for name, t in model.state_dict().items()
        if t.is_floating_point() and not t.is_meta and not bool(torch.isfinite(t).all())
    ]


def check_finite_weights(model: nn.Module, where) -> None:
    """Refuse a draft with NaN or Inf in its weights, naming the tensors: such a draft proposes nothing sensible
    and fails far from its cause (tree decoding's probability checks, say)."""
    bad = non_finite_tensors(model)
    if bad:
        shown = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        raise ValueError(
            f"The draft {where} has non-finite weights (NaN or Inf) in {shown}: it cannot draft. Load "
            "another checkpoint of it, or train it again (a diverged run writes such weights)."
        )


# What eagle3_hub.formats adds: loading the foreign layouts ("load"), checks and engine keys around saving
# ("prepare_save", "finish_save"). The model file never imports formats (the code is also shipped alone as remote
# code); eagle3_hub.registration fills these as this module is imported in the package.
_LAYOUT_HOOKS: dict = {}


def register_layout_hooks(**hooks):
    """``load(cls, path, *args, target=None, **kwargs)`` returns a model or None (transformers loads it);
    ``prepare_save(model)`` and ``finish_save(model, folder)`` run around ``save_pretrained``."""
    unknown = set(hooks) - {"load", "prepare_save", "finish_save"}
    if unknown:
        raise ValueError(f"unknown layout hooks {sorted(unknown)}")
    _LAYOUT_HOOKS.update(hooks)


def _layout_hooks() -> dict:
    # filled in the package (eagle3_hub.registration, then formats); a remote-code copy has none (its own layout only)
    return _LAYOUT_HOOKS


__all__ = ["Eagle3DraftModel", "Eagle3PreTrainedModel", "Eagle3DraftOutput", "register_layout_hooks", "in_window"]
