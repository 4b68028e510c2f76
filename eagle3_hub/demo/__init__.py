"""Side-by-side speed demo: plain decoding of a target next to EAGLE-3 tree decoding of the same target.

One prompt, two panes that stream together. The left pane is plain decoding (one target forward per token,
as ``target.generate`` does), the right pane is ``eagle3_hub.generation.tree.generate`` with an EAGLE-3 draft. Same
target, same settings; at greedy decoding both texts end identical (the method is lossless). Tokens that the
draft proposed and the target accepted are highlighted in the right pane.

Honest timing: one thread runs both decoders, so they never compete for the device. Tree decoding drives;
after each of its steps, plain decoding runs tokens until it has used as much compute time (fair share). Each
pane's clock counts only its own work, so its tokens/s is what that method gets alone on this machine, and at
any moment the two panes show what each method wrote in the same compute time. The speed-up is the ratio.

Modules: ``racing`` (the race, torch only), ``inputs`` (requests and their checks, no torch), ``pairs`` (model pairs
and their loading), ``app`` (HTML and the Gradio app, ``build_app``). ``eagle3-hub demo`` (``eagle3_hub.commands.demo``)
and the Hugging Face Space (``spaces/app.py``, exported with ``eagle3-hub demo --export-space DIR``) both launch it.
Model pairs (target + draft) come from a small YAML file (``spaces/pairs.yaml``); without one the embedded
SmolLM2-135M-Instruct and its reference draft are used. The names below load on first use (``eagle3-hub demo --help``
imports no torch).
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_NAMES = {
    **dict.fromkeys(("CSS", "EXAMPLE_PROMPTS", "INTRO", "build_app", "render_pane", "render_stats", "serve_request"), ".app"),
    **dict.fromkeys(("DemoError", "Limits", "Settings", "check_context", "validate_request"), ".inputs"),
    **dict.fromkeys(
        ("DEFAULT_PAIRS", "EMBEDDED_PAIR", "ModelPair", "PairCache", "load_pair", "load_pairs", "pair_cache", "resolve_draft"),
        ".pairs",
    ),
    **dict.fromkeys(("Detokenizer", "LoadedPair", "Pane", "PaneView", "PlainDecoder", "Stopped", "race"), ".racing"),
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'eagle3_hub.demo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
