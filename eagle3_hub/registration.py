"""What ``import eagle3_hub`` alone tells transformers, whatever was imported before or after it.

transformers' Auto classes take a class outside transformers only as the class itself, and importing them imports
torch (seconds), which ``eagle3-hub --help`` must not pay. So ``install()`` (run by ``import eagle3_hub``) waits for
three modules and acts as each one finishes importing (at once for one already imported):

    transformers' configuration_auto  AutoConfig knows ``eagle3_draft`` (Eagle3Config)
    transformers' modeling_auto       AutoModel knows Eagle3Config: the model class, or until it is imported a stand-in
                                      that imports it on first use (modeling_auto is often imported from inside
                                      transformers' model files, where importing ours would be circular)
    eagle3_hub.modeling_eagle3        AutoModel maps to the model class itself, and the model loads and saves the
                                      published layouts (``eagle3_hub.formats``, imported on first load or save)

The watcher leaves ``sys.meta_path`` once all three are done; each module keeps its own loader.
"""

from __future__ import annotations

import importlib
import sys

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"
_MODEL = "eagle3_hub.modeling_eagle3"

# formats' function behind each layout hook of Eagle3DraftModel
_LAYOUT_HOOKS = {"load": "load_foreign_draft", "prepare_save": "prepare_save", "finish_save": "finish_save"}


def _register_config(configuration_auto) -> None:
    from .configuration_eagle3 import Eagle3Config

    configuration_auto.AutoConfig.register(Eagle3Config.model_type, Eagle3Config, exist_ok=True)


def _register_model(modeling_auto) -> None:
    from .configuration_eagle3 import Eagle3Config

    model = sys.modules.get(_MODEL)
    model_class = model.Eagle3DraftModel if model is not None and _MODEL not in _pending else _stand_in(Eagle3Config)
    modeling_auto.AutoModel.register(Eagle3Config, model_class, exist_ok=True)


def _wire_model(modeling_eagle3) -> None:
    modeling_eagle3.register_layout_hooks(**{hook: _from_formats(name) for hook, name in _LAYOUT_HOOKS.items()})
    if _MODEL_AUTO in sys.modules and _MODEL_AUTO not in _pending:
        _register_model(sys.modules[_MODEL_AUTO])


def _from_formats(name: str):
    def hook(*args, **kwargs):
        # importing formats replaces these hooks with its own (formats.wire)
        formats = importlib.import_module("eagle3_hub.formats")
        return getattr(formats, name)(*args, **kwargs)

    hook.__name__ = name
    return hook


class _OnFirstUse(type):
    def __getattr__(cls, name):
        return getattr(importlib.import_module(_MODEL).Eagle3DraftModel, name)


def _stand_in(config_class) -> type:
    """AutoModel's entry until ``eagle3_hub.modeling_eagle3`` is imported: every attribute is the model class's."""
    return _OnFirstUse("Eagle3DraftModel", (), {"config_class": config_class, "__module__": __name__})


_ACTIONS = {_CONFIG_AUTO: _register_config, _MODEL_AUTO: _register_model, _MODEL: _wire_model}
_pending: dict = {}


class _Then:
    """A module's own loader, followed by its action once the module has run."""

    def __init__(self, loader, action):
        self.loader, self.action = loader, action

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _done(module.__name__)
        self.action(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _Watcher:
    """A meta path finder that finds nothing itself: it wraps the loader the other finders give a watched module."""

    def find_spec(self, name, path=None, target=None):
        action = _pending.get(name)
        if action is None:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find_spec(name, path, target) if find_spec is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Then(spec.loader, action)
                return spec
        return None


_WATCHER = _Watcher()


def _done(name: str) -> None:
    _pending.pop(name, None)
    if not _pending and _WATCHER in sys.meta_path:
        sys.meta_path.remove(_WATCHER)


def install() -> None:
    """Registers now with what is imported, and watches for the rest (again harmlessly)."""
    for name, action in _ACTIONS.items():
        if name in _pending:
            continue
        module = sys.modules.get(name)
        if module is None:
            _pending[name] = action
        else:
            action(module)
    if _pending and _WATCHER not in sys.meta_path:
        sys.meta_path.insert(0, _WATCHER)
