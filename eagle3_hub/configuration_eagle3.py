"""Configuration of the EAGLE-3 draft model.

This file is shipped next to the weights of every saved draft (``trust_remote_code``), so it imports
nothing from ``eagle3_hub``.

Aux-layer convention
--------------------
``eagle_config["eagle_aux_hidden_state_layer_ids"]`` lists 0-based target decoder layers whose **output**
is captured (``hidden_states[i + 1]`` of ``output_hidden_states=True``). This is the convention of
SpecForge, ModelOpt and SGLang's Llama/Qwen path (SGLang adds 1 to get the index of the layer whose *input* it
captures). The EAGLE-3 reference captures the input of layers ``2, L//2, L-3``, which is the output of layers
``1, L//2-1, L-4``: our default. Published drafts do not all agree (some store the reference's *input* ids in
``eagle_config``), so every config we write says ``"aux_layer_convention": "output"``, and a config that says
``"input"`` is converted when it is read.

Variants (keys and meanings as vLLM, SGLang and speculators read them)
-----------------------------------------------------------------------
``norm_before_residual``: the residual of the attention block is ``hidden_norm(feature)`` instead of the raw
feature. ``norm_before_fc``: one RMSNorm over the concatenated target features before ``fc`` (tensor
``input_norm``). ``fc_norm`` (EAGLE 3.1): one RMSNorm per target feature before ``fc`` (tensors ``fc_norm.{i}``).
``norm_output`` (EAGLE 3.1 post-norm feedback): the next draft step reads ``norm(h)`` instead of ``h``.

Decoder layers (transformers' convention, as Gemma-3 and Qwen configs spell it)
--------------------------------------------------------------------------------
``num_hidden_layers``: draft decoder layers; the first reads ``[embedding ; feature]`` (2H), the others are plain
Llama layers over its output (tensors ``layers.{i}.*``, as vLLM and speculators name them). ``layer_types``: one of
``"full_attention"`` / ``"sliding_attention"`` per layer; a sliding layer's query at position p sees keys at positions
``> p - sliding_window``.
"""

from transformers import PretrainedConfig

AUX_LAYER_CONVENTIONS = ("output", "input")
# written to every config.json even at their default value: engines default some of them differently
# (vLLM reads a speculators config without norm_before_residual as True), so a folder must not leave them implicit
EXPLICIT_KEYS = ("aux_layer_convention", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
LAYER_TYPES = ("full_attention", "sliding_attention")


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """Low, middle and high layer of the EAGLE-3 reference, as 0-based layer *outputs*.

    The reference reads the input of layers ``2, L//2, L-3`` = the output of ``1, L//2-1, L-4``.
    Targets with fewer than 8 layers (test models) use the first, middle and last layer instead.
    """
    L = num_target_layers
    if L >= 8:
        return [1, L // 2 - 1, L - 4]
    return [0, (L - 1) // 2, L - 1]


class Eagle3Config(PretrainedConfig):
    r"""Configuration of an EAGLE-3 draft: one Llama-style decoder layer over ``[embedding ; fused feature]``.

    Args:
        vocab_size: the **target** vocabulary (transformers' assisted generation compares it with the target's).
        draft_vocab_size: the draft's own (reduced) vocabulary; ``d2t``/``t2d`` map it to the target's.
        hidden_size: the draft's hidden size (equal to the target's, the embedding is shared).
        target_hidden_size: the width of one target feature; ``fc`` reads ``3 * target_hidden_size``.
        eagle_config: ``{"eagle_aux_hidden_state_layer_ids": [...], "use_aux_hidden_state": True}``; ids are
            target decoder layer *outputs* (see module docstring).
        target_num_hidden_layers: number of decoder layers of the target the draft was sized for.
        aux_layer_convention: how the given ``eagle_config`` ids count: ``"output"`` (ours, kept) or ``"input"``
            (id i = the input of layer i, converted to ``i - 1``). Always saved as ``"output"``.
        norm_before_residual, norm_before_fc, fc_norm, norm_output: the EAGLE-3 variants (module docstring);
            all False is the EAGLE-3 reference.
        num_hidden_layers: draft decoder layers (1 is the EAGLE-3 reference).
        layer_types: ``"full_attention"`` or ``"sliding_attention"`` per decoder layer (default: all full).
        sliding_window: the window of the sliding layers, in positions (required when any layer slides).
    """

    model_type = "eagle3_draft"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(
        self,
        vocab_size: int = 32000,
        draft_vocab_size: int | None = None,
        hidden_size: int = 4096,
        target_hidden_size: int | None = None,
        intermediate_size: int = 14336,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        rms_norm_eps: float = 1e-6,
        rope_parameters: dict | None = None,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        attention_dropout: float = 0.0,
        initializer_range: float = 0.02,
        eagle_config: dict | None = None,
        target_num_hidden_layers: int | None = None,
        target_model_type: str | None = None,
        aux_layer_convention: str | None = None,
        norm_before_residual: bool = False,
        norm_before_fc: bool = False,
        fc_norm: bool = False,
        norm_output: bool = False,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = False,
        layer_types: list[str] | None = None,
        sliding_window: int | None = None,
        **kwargs,
    ):
        # engines (vLLM, SGLang) read the pre-v5 rope keys; accept them and keep both spellings
        rope_theta = kwargs.pop("rope_theta", None)
        rope_scaling = kwargs.pop("rope_scaling", None)
        if rope_parameters is None:
            rope_parameters = dict(rope_scaling or {})
            rope_parameters.setdefault("rope_type", rope_parameters.pop("type", "default"))
            rope_parameters.setdefault("rope_theta", rope_theta if rope_theta is not None else 10000.0)
        self.vocab_size = vocab_size
        self.draft_vocab_size = draft_vocab_size if draft_vocab_size is not None else vocab_size
        self.hidden_size = hidden_size
        self.target_hidden_size = target_hidden_size if target_hidden_size is not None else hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = dict(rope_parameters)
        self.rope_theta = self.rope_parameters.get("rope_theta", 10000.0)  # read by SGLang's LlamaConfig path
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        self.eagle_config = dict(eagle_config) if eagle_config else {}
        self.eagle_config.setdefault("use_aux_hidden_state", True)
        if aux_layer_convention not in (None, *AUX_LAYER_CONVENTIONS):
            raise ValueError(f"aux_layer_convention must be 'output' or 'input', got {aux_layer_convention!r}")
        ids = self.eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if aux_layer_convention == "input" and ids is not None:
            if any(int(i) < 1 for i in ids):
                raise ValueError(
                    f"eagle_aux_hidden_state_layer_ids={list(ids)} are said to be layer inputs, but input 0 is the "
                    "embedding output, not a decoder layer's: fix the ids or aux_layer_convention."
                )
            self.eagle_config["eagle_aux_hidden_state_layer_ids"] = [int(i) - 1 for i in ids]
        self.aux_layer_convention = "output"  # the stored ids are always layer outputs
        self.norm_before_residual = bool(norm_before_residual)
        self.norm_before_fc = bool(norm_before_fc)
        self.fc_norm = bool(fc_norm)
        self.norm_output = bool(norm_output)
        self.target_num_hidden_layers = target_num_hidden_layers
        self.target_model_type = target_model_type
        self._set_layers(num_hidden_layers, layer_types, sliding_window)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def _set_layers(self, num_hidden_layers, layer_types, sliding_window):
        if not isinstance(num_hidden_layers, int) or isinstance(num_hidden_layers, bool) or num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers must be an integer >= 1 (draft decoder layers), got {num_hidden_layers!r}")
        layer_types = list(layer_types) if layer_types is not None else ["full_attention"] * num_hidden_layers
        if len(layer_types) != num_hidden_layers or any(t not in LAYER_TYPES for t in layer_types):
            raise ValueError(
                f"layer_types={layer_types} must list one of {list(LAYER_TYPES)} for each of the {num_hidden_layers} "
                "draft decoder layers (num_hidden_layers)."
            )
        if sliding_window is not None and (
            not isinstance(sliding_window, int) or isinstance(sliding_window, bool) or sliding_window < 1
        ):
            raise ValueError(f"sliding_window must be a positive integer (positions) or null, got {sliding_window!r}")
        if "sliding_attention" in layer_types and sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is null: set the window.")
        self.num_hidden_layers = num_hidden_layers
        self.layer_types = layer_types
        self.sliding_window = sliding_window

    @property
    def aux_layer_ids(self) -> list[int] | None:
        ids = self.eagle_config.get("eagle_aux_hidden_state_layer_ids")
        return list(ids) if ids is not None else None

    @aux_layer_ids.setter
    def aux_layer_ids(self, ids: list[int]):
        self.eagle_config["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in ids]

    def to_dict(self):
        out = super().to_dict()
        # the pre-v5 spellings that vLLM and SGLang read from a draft's config.json
        rope = dict(self.rope_parameters)
        out["rope_theta"] = rope.pop("rope_theta", 10000.0)
        out["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
        if self.sliding_window is None and "sliding_attention" not in self.layer_types:
            # all-full drafts keep the config.json of the single-layer reference, which engines read unchanged
            out.pop("layer_types", None)
            out.pop("sliding_window", None)
        return out

    def to_diff_dict(self):
        out = super().to_diff_dict()
        for key in EXPLICIT_KEYS:
            out[key] = getattr(self, key)
        return out
