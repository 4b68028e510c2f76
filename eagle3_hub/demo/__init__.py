"""Side-by-side speed demo: plain decoding of a target next to EAGLE-3 tree decoding of the same target.

One prompt, two panes that stream together. The left pane is plain decoding (one target forward per token,
as ``target.generate`` does), the right pane is ``eagle3_hub.generation.tree.generate`` with an EAGLE-3 draft. Same
target, same settings; at greedy decoding both texts end identical (the method is lossless). Tokens that the
draft proposed and the target accepted are highlighted in the right pane.

Honest timing: one thread runs both decoders, so they never compete for the device. Tree decoding drives;
after each of its steps, plain decoding runs tokens until it has used as much compute time (fair share). Each
pane's clock counts only its own work, so its tokens/s is what that method gets alone on this machine, and at
any moment the two panes show what each method wrote in the same compute time. The speed-up is the ratio.

Modules: ``racing`` (the race, torch only), ``inputs`` (request checks), ``pairs`` (model pairs and their loading),
``app`` (HTML and the Gradio app, ``build_app``). ``eagle3-hub demo`` (``eagle3_hub.commands.demo``) and the
Hugging Face Space (``spaces/app.py``, exported with ``eagle3-hub demo --export-space DIR``) both launch it. Model pairs
(target + draft) come from a small YAML file (``spaces/pairs.yaml``); without one the embedded SmolLM2-135M-Instruct
and its reference draft are used.
"""

from .app import CSS, EXAMPLE_PROMPTS, INTRO, build_app, render_pane, render_stats, serve_request
from .inputs import DemoError, Limits, check_context, validate_request
from .pairs import (
    DEFAULT_PAIRS,
    EMBEDDED_PAIR,
    LoadedPair,
    ModelPair,
    PairCache,
    load_pair,
    load_pairs,
    pair_cache,
    resolve_draft,
)
from .racing import Detokenizer, Pane, PaneView, PlainDecoder, Settings, Stopped, race

__all__ = [
    "CSS", "EXAMPLE_PROMPTS", "INTRO", "build_app", "render_pane", "render_stats", "serve_request",
    "DemoError", "Limits", "check_context", "validate_request",
    "DEFAULT_PAIRS", "EMBEDDED_PAIR", "LoadedPair", "ModelPair", "PairCache", "load_pair", "load_pairs", "pair_cache",
    "resolve_draft",
    "Detokenizer", "Pane", "PaneView", "PlainDecoder", "Settings", "Stopped", "race",
]
