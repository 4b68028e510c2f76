"""The feature hooks of a bound draft, removed while tree decoding (or its cost measurement) runs the target."""

from __future__ import annotations


class PausedFeatureHooks:
    """A bound draft (``draft.bind(target)``) captures target features on every target forward for assisted
    generation; tree decoding reads ``output_hidden_states`` instead, so the hooks are removed meanwhile."""

    def __init__(self, draft):
        self.draft = draft
        self.target = None

    def __enter__(self):
        if getattr(self.draft, "_hook_handles", None) and hasattr(self.draft, "unbind"):
            self.target = getattr(self.draft, "target", None)
            self.draft.unbind(keep_target=True)
        return self

    def __exit__(self, *exc):
        if self.target is not None and hasattr(self.draft, "_register_feature_hooks"):
            self.draft._register_feature_hooks(self.target)
        return False
