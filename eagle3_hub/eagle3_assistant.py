"""The EAGLE-3 draft as a transformers assistant: ``target.generate(ids, assistant_model=draft)``.

Shipped next to the weights (``trust_remote_code``): imports only torch and transformers.

``bind(target)`` registers forward hooks on the target's aux decoder layers; they capture the layer outputs
of every target forward, which the draft needs for every accepted token.
"""

from __future__ import annotations

import torch


def decoder_layers(target):
    """The list of decoder layers of a causal LM (Llama, Qwen, Mistral, Gemma, Phi-3, ...)."""
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    layers = getattr(base, "layers", None)
    if layers is None and hasattr(base, "language_model"):
        layers = getattr(base.language_model, "layers", None)
    if layers is None:
        raise ValueError(f"Cannot find the decoder layers of {type(target).__name__}: expected `.model.layers`.")
    return layers


class Eagle3AssistantMixin:
    """Feature hooks on the bound target. Assisted generation (``generate``) builds on these captures."""

    _hook_handles: list | None = None

    def _register_feature_hooks(self, target):
        self.unbind(keep_target=True)
        layers = decoder_layers(target)
        self._captures = []  # list of (layer_outputs: list[Tensor (b, s, Ht)], position_ids)
        self._pending = {}
        handles = []
        ids = self.config.aux_layer_ids
        for slot, layer_id in enumerate(ids):
            handles.append(layers[layer_id].register_forward_hook(self._make_hook(slot), with_kwargs=True))
        self._hook_handles = handles

    def _make_hook(self, slot: int):
        def hook(module, args, kwargs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self._on_feature(slot, hidden, kwargs.get("position_ids"))

        return hook

    def _on_feature(self, slot: int, hidden: torch.Tensor, position_ids):
        n = len(self.config.aux_layer_ids)
        self._pending[slot] = hidden.detach().clone()
        if len(self._pending) == n:
            feats = torch.cat([self._pending[i] for i in range(n)], dim=-1)  # (b, s, 3*Ht)
            self._captures.append((feats, position_ids))
            self._pending = {}

    def unbind(self, keep_target: bool = False):
        """Remove the feature hooks from the target (and forget it unless ``keep_target``)."""
        for h in self._hook_handles or []:
            h.remove()
        self._hook_handles = None
        self._captures = []
        self._pending = {}
        if not keep_target:
            self._target_ref = None
        return self
