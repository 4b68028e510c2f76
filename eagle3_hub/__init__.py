"""eagle3-hub: EAGLE-3 speculative decoding for the Hugging Face stack.

The names below load on first use, so that ``import eagle3_hub.cli`` (``eagle3-hub --help``) imports neither torch
nor transformers. The import itself is enough for transformers to know the draft (``registration``: AutoConfig /
AutoModel know ``eagle3_draft``, and ``Eagle3DraftModel`` loads and saves every published layout), whatever is
imported before or after it.
"""

from __future__ import annotations

import importlib

from . import registration

registration.install()

__version__ = "0.1.0"

# public name -> the module that defines it
_NAMES = {
    "Eagle3Config": ".configuration_eagle3",
    "default_aux_layer_ids": ".configuration_eagle3",
    "Eagle3DraftModel": ".modeling_eagle3",
    "Eagle3DraftOutput": ".modeling_eagle3",
    "TreeConfig": ".generation.tree",
    "TreeDecodingOutput": ".generation.tree",
    "TreeDecodingStats": ".generation.tree",
    "generate": ".generation.tree",
    "tree_generate": ".generation.tree",
    "load_target": ".targets",
    "reference_draft": ".targets",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'eagle3_hub' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
