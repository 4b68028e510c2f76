"""The demo's page: HTML of the panes and the summary row, one request served as a stream of pages, and the Gradio
app (Gradio is imported only by ``build_app``)."""

from __future__ import annotations

import html
import logging

import torch

from ..devices import resolve_device, resolve_dtype
from ..extras import missing_extra
from .inputs import DemoError, Limits, check_context, validate_request
from .pairs import PairCache
from .racing import PANE_TITLES as _TITLES
from .racing import PaneView, race

logger = logging.getLogger(__name__)

DEFAULT_LIMITS = Limits()  # frozen: one shared default is safe

EXAMPLE_PROMPTS = [
    ["Write a Python function that checks whether a string is a palindrome."],
    ["What is 17 multiplied by 23? Explain step by step."],
    [
        (
            "Summarize in two sentences: The Eiffel Tower was built for the 1889 World's Fair in Paris. It was first "
            "criticised by artists, but it became the symbol of France and one of the most visited monuments."
        )
    ],
    ["Write a short poem about the ocean at night."],
    ["List five fruits that are rich in vitamin C."],
    ["Translate to French: Good morning, how are you today?"],
    ["Explain what a black hole is to a ten-year-old."],
]

# ----------------------------------------------------------------------------------------- rendering
CSS = """
.e3-pane { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 10px 12px; min-height: 220px; }
.e3-head { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: baseline; margin-bottom: 8px; }
.e3-title { font-weight: 700; font-size: 1.05em; }
.e3-tps { font-weight: 700; font-size: 1.3em; font-variant-numeric: tabular-nums; }
.e3-meta { opacity: 0.75; font-size: 0.9em; font-variant-numeric: tabular-nums; }
.e3-user { white-space: pre-wrap; background: var(--background-fill-secondary); border-radius: 8px; padding: 6px 8px; margin: 8px 0 4px 20%; }
.e3-reply { white-space: pre-wrap; line-height: 1.55; padding: 2px 0; }
.e3-drafted { background: #b7f0c4; color: #0b3d17; border-radius: 3px; padding: 0 1px; }
.dark .e3-drafted { background: #1f6b35; color: #eafff0; }
.e3-cursor::after { content: "▍"; opacity: 0.6; }
.e3-error { color: #b00020; white-space: pre-wrap; }
.e3-stats { display: flex; flex-wrap: wrap; gap: 10px; }
.e3-stat { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 14px; min-width: 120px; }
.e3-stat b { display: block; font-size: 1.5em; font-variant-numeric: tabular-nums; }
.e3-note { opacity: 0.8; font-size: 0.9em; }
.e3-status-error { color: #b00020; font-weight: 600; white-space: pre-wrap; }
.e3-legend { font-size: 0.85em; opacity: 0.85; }
"""

_SUBTITLES = {"plain": "target only, one forward per token", "eagle": "same target + EAGLE-3 draft"}


def _pieces_html(pieces: list[tuple[str, bool]]) -> str:
    out = []
    for text, drafted in pieces:
        text = html.escape(text)
        out.append(f'<mark class="e3-drafted">{text}</mark>' if drafted else text)
    return "".join(out)


def render_pane(kind: str, view: PaneView | None, history: list[dict] = (), user: str | None = None) -> str:
    """HTML of one pane: header with live numbers, past turns (chat mode), the current reply."""
    state = view.state if view is not None else "idle"
    head = [f'<span class="e3-title">{_TITLES[kind]}</span>', f'<span class="e3-meta">{_SUBTITLES[kind]}</span>']
    if view is not None:
        head.append(f'<span class="e3-tps" data-tps="{view.tokens_per_second:.3f}">{view.tokens_per_second:.1f} tok/s</span>')
        meta = f"{view.new_tokens} tokens · {view.seconds:.2f} s"
        if kind == "eagle":
            meta += (
                f' · mean acceptance <span class="e3-accept" data-accept="{view.mean_acceptance_length:.3f}">'
                f"{view.mean_acceptance_length:.2f}</span> tokens/step · "
                f'<span class="e3-drafted-count" data-drafted="{view.drafted_tokens}">{view.drafted_tokens}</span> from the draft'
            )
        head.append(f'<span class="e3-meta">{meta}</span>')
    body = []
    for turn in history:
        body.append(f'<div class="e3-user">{html.escape(turn["user"])}</div>')
        body.append(f'<div class="e3-reply">{_pieces_html(turn[kind])}</div>')
    if user is not None:
        body.append(f'<div class="e3-user">{html.escape(user)}</div>')
    if view is not None:
        cursor = " e3-cursor" if view.state in ("waiting", "running") else ""
        body.append(f'<div class="e3-reply e3-current{cursor}">{_pieces_html(view.pieces)}</div>')
        if view.state == "error":
            body.append(f'<div class="e3-error">Decoding failed: {html.escape(view.error or "")}</div>')
        elif view.state == "stopped":
            body.append('<div class="e3-meta">stopped</div>')
    if kind == "eagle":
        body.append(
            '<div class="e3-legend"><mark class="e3-drafted">highlighted</mark> = proposed by the draft and '
            "accepted by the target; the rest come from the target's own verification step.</div>"
        )
    return (
        f'<div class="e3-pane" data-kind="{kind}" data-state="{state}">'
        f'<div class="e3-head">{"".join(head)}</div>{"".join(body)}</div>'
    )


def render_stats(
    plain: PaneView | None, eagle: PaneView | None, greedy: bool = True, message: str | None = None, error: bool = False
) -> str:
    """The summary row: speed-up, both speeds, mean acceptance length, the lossless check."""
    if message is not None:
        cls = "e3-status-error" if error else "e3-note"
        role = ' role="alert"' if error else ""
        return f'<div class="e3-stats" data-state="{"error" if error else "info"}"><div class="{cls}"{role}>{html.escape(message)}</div></div>'
    if plain is None or eagle is None:
        return '<div class="e3-stats" data-state="idle"><div class="e3-note">Type a prompt and press Generate.</div></div>'
    failed = [v for v in (plain, eagle) if v.state == "error"]
    if failed:
        return render_stats(None, None, message="; ".join(f"{_TITLES[v.kind]} failed: {v.error}" for v in failed), error=True)
    done = plain.state == "done" and eagle.state == "done"
    speedup = eagle.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second > 0 else 0.0
    cells = [
        f'<div class="e3-stat">Speed-up<b class="e3-speedup" data-speedup="{speedup:.3f}">×{speedup:.2f}</b></div>',
        f'<div class="e3-stat">Plain<b>{plain.tokens_per_second:.1f} tok/s</b></div>',
        f'<div class="e3-stat">EAGLE-3<b>{eagle.tokens_per_second:.1f} tok/s</b></div>',
        f'<div class="e3-stat">Mean acceptance length<b>{eagle.mean_acceptance_length:.2f}</b></div>',
    ]
    identical = done and plain.text == eagle.text
    if done and greedy:
        check = "identical ✓" if identical else "differ (see note)"
        cells.append(
            f'<div class="e3-stat">Greedy outputs<b class="e3-lossless" data-identical="{int(identical)}">{check}</b></div>'
        )
    note = ""
    if done and greedy and not identical:
        note = (
            '<div class="e3-note">At greedy the two texts should match. In bfloat16/float16 a multi-token '
            "verification can round differently from one-token steps on near-ties; in float32 a difference is a bug.</div>"
        )
    elif done and not greedy:
        note = '<div class="e3-note">Sampling (temperature &gt; 0): both follow the same distribution, the texts differ.</div>'
    state = "done" if done else "running"
    return f'<div class="e3-stats" data-state="{state}">{"".join(cells)}</div>{note}'


# ----------------------------------------------------------------------------------------- one request
def serve_request(
    cache: PairCache,
    pair_name,
    prompt,
    max_new_tokens,
    temperature,
    depth,
    tree_top_k,
    total_tokens,
    chat_mode,
    history,
    limits: Limits = DEFAULT_LIMITS,
    keep=lambda: None,
):
    """One Generate press: yields ``(plain_html, eagle_html, stats_html, history, prompt_box)`` pages while the race
    runs. ``keep()`` is the value that leaves an output as it is (``gr.update`` in the app).

    Requests run one at a time (``cache.turn``): the models are shared, and a race measures each method on a machine
    that nothing else is using. A second user's request waits for the first; bad input is answered at once."""
    history = list(history or []) if chat_mode else []
    try:
        prompt, settings = validate_request(prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens, limits)
    except DemoError as e:
        yield (
            render_pane("plain", None, history),
            render_pane("eagle", None, history),
            render_stats(None, None, message=str(e), error=True),
            history,
            keep(),
        )
        return
    with cache.turn():
        yield from _serve(cache, pair_name, prompt, settings, chat_mode, history, limits, keep)


def _serve(cache, pair_name, prompt, settings, chat_mode, history, limits, keep):
    try:
        loaded = cache.get(pair_name)
        plain_messages, eagle_messages = [], []
        for turn in history:  # each pane continues its own conversation
            plain_messages += [
                {"role": "user", "content": turn["user"]},
                {"role": "assistant", "content": "".join(p for p, _ in turn["plain"])},
            ]
            eagle_messages += [
                {"role": "user", "content": turn["user"]},
                {"role": "assistant", "content": "".join(p for p, _ in turn["eagle"])},
            ]
        plain_messages.append({"role": "user", "content": prompt})
        eagle_messages.append({"role": "user", "content": prompt})
        check_context(loaded, loaded.encode(plain_messages), loaded.encode(eagle_messages), settings=settings, limits=limits)
    except Exception as e:  # a pair that cannot load, a conversation too long, ...: a message in the page
        message = str(e) if isinstance(e, DemoError) else f"Could not start: {type(e).__name__}: {e}"
        if not isinstance(e, DemoError):
            logger.exception("demo request failed")
        yield (
            render_pane("plain", None, history),
            render_pane("eagle", None, history),
            render_stats(None, None, message=message, error=True),
            history,
            keep(),
        )
        return
    greedy = settings.temperature == 0
    plain = eagle = None
    prompt_box = "" if chat_mode else keep()  # chat: empty the box once, for the next message
    try:
        for plain, eagle in race(loaded, plain_messages, eagle_messages, settings):
            page = (
                render_pane("plain", plain, history, prompt),
                render_pane("eagle", eagle, history, prompt),
                render_stats(plain, eagle, greedy),
            )
            yield (*page, history, prompt_box)
            prompt_box = keep()
    except Exception as e:  # never a stack trace in the page
        logger.exception("demo generation failed")
        yield (
            render_pane("plain", plain, history, prompt),
            render_pane("eagle", eagle, history, prompt),
            render_stats(None, None, message=f"Generation failed: {type(e).__name__}: {e}", error=True),
            history,
            keep(),
        )
        return
    if chat_mode and plain is not None and plain.state == eagle.state == "done":
        history = history + [{"user": prompt, "plain": plain.pieces, "eagle": eagle.pieces}]
        yield (*page, history, keep())  # the same page; the turn joins the conversation


# ----------------------------------------------------------------------------------------- the app
INTRO = """
# EAGLE-3: plain decoding vs. speculative tree decoding
One prompt, two decoders of the **same target model** with the same settings. Left: plain decoding, one target
forward per token. Right: **EAGLE-3** — a small draft proposes a tree of tokens, the target checks the whole tree in
one forward and keeps the longest match (lossless: at greedy both texts end identical).
**Timing:** both panes stream at once, but the two decoders never run at the same moment: they share this
machine in turns, each getting the same compute time. Each pane's clock counts only its own work, so its tokens/s
is what that method gets alone here, and the two texts grow at the methods' true relative speeds.
"""


def build_app(cache: PairCache, limits: Limits = DEFAULT_LIMITS, queue_size: int = 16):
    """The Gradio Blocks app. One generation runs at a time (the models are shared); others wait in the queue."""
    try:
        import gradio as gr
    except ModuleNotFoundError as e:
        raise missing_extra("demo", e) from None

    def pair_status(name):
        kind, message = cache.status(name)
        return render_stats(None, None, message=message, error=kind == "error")

    def generate(pair_name, prompt, max_new_tokens, temperature, depth, tree_top_k, total_tokens, chat_mode, history):
        yield from serve_request(
            cache,
            pair_name,
            prompt,
            max_new_tokens,
            temperature,
            depth,
            tree_top_k,
            total_tokens,
            chat_mode,
            history,
            limits=limits,
            keep=gr.update,
        )

    def clear():
        return render_pane("plain", None), render_pane("eagle", None), render_stats(None, None), []

    from ..generation.tree import tree_defaults

    default_pair = cache.pairs[cache.default]
    try:
        device = resolve_device(default_pair.device)
        dtype = resolve_dtype(default_pair.dtype, device)
    except ValueError:  # the page shows the pair's error on its first request
        device, dtype = torch.device("cpu"), torch.float32

    def mode_tree(temperature) -> dict:
        """The tree settings of the mode the temperature selects (sampling trees differ from greedy ones)."""
        return tree_defaults(device, dtype, do_sample=float(temperature or 0) > 0)

    tree = mode_tree(default_pair.temperature)
    with gr.Blocks(title="EAGLE-3 side-by-side speed demo", analytics_enabled=False) as app:
        gr.Markdown(INTRO)
        history = gr.State([])
        with gr.Row():
            pair = gr.Dropdown(
                choices=[(p.title, name) for name, p in cache.pairs.items()],
                value=cache.default,
                label="Model pair (target + draft)",
                scale=3,
            )
            chat_mode = gr.Checkbox(value=False, label="Chat mode (keep the conversation)", scale=1)
        with gr.Row():
            prompt = gr.Textbox(
                label="Prompt",
                placeholder="Ask something…",
                lines=3,
                max_lines=12,
                scale=5,
                elem_id="prompt",
                max_length=limits.max_prompt_chars,
            )
            with gr.Column(scale=1, min_width=160):
                run_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                stop_btn = gr.Button("Stop", elem_id="stop")
                clear_btn = gr.Button("Clear conversation", elem_id="clear")
        gr.Examples(
            examples=EXAMPLE_PROMPTS,
            inputs=[prompt],
            label="Example prompts (code, math, summary, poem, list, translation, explanation)",
        )
        with gr.Accordion("Settings", open=False, elem_id="settings"):
            with gr.Row():
                max_new = gr.Slider(
                    1,
                    limits.max_new_tokens,
                    value=min(96, limits.max_new_tokens),
                    step=1,
                    label="Max new tokens",
                    elem_id="max-new-tokens",
                )
                temperature = gr.Slider(
                    0.0,
                    limits.max_temperature,
                    value=min(default_pair.temperature, limits.max_temperature),
                    step=0.05,
                    label="Temperature (0 = greedy)",
                    elem_id="temperature",
                )
            with gr.Row():
                depth = gr.Slider(
                    1,
                    limits.max_depth,
                    value=min(tree["depth"], limits.max_depth),
                    step=1,
                    label="Tree depth (draft steps)",
                    elem_id="depth",
                )
                tree_top_k = gr.Slider(
                    1,
                    limits.max_tree_top_k,
                    value=min(tree["top_k"], limits.max_tree_top_k),
                    step=1,
                    label="Tree top-k (branches per node)",
                    elem_id="tree-top-k",
                )
                total_tokens = gr.Slider(
                    1,
                    limits.max_total_tokens,
                    value=min(tree["total_tokens"], limits.max_total_tokens),
                    step=1,
                    label="Tree total tokens (verified per step)",
                    elem_id="total-tokens",
                )
        sampling = gr.State(default_pair.temperature > 0)

        def retree(t, was_sampling):
            """Crossing between greedy and sampling: the tree settings move to the new mode's defaults."""
            now = float(t or 0) > 0
            if now == was_sampling:
                return gr.update(), gr.update(), gr.update(), was_sampling
            shape = mode_tree(t)
            return (
                gr.update(value=min(shape["depth"], limits.max_depth)),
                gr.update(value=min(shape["top_k"], limits.max_tree_top_k)),
                gr.update(value=min(shape["total_tokens"], limits.max_total_tokens)),
                now,
            )

        temperature.change(retree, [temperature, sampling], [depth, tree_top_k, total_tokens, sampling], show_progress="hidden")
        stats = gr.HTML(render_stats(None, None), elem_id="stats")
        with gr.Row(equal_height=False):
            plain_pane = gr.HTML(render_pane("plain", None), elem_id="plain-pane")
            eagle_pane = gr.HTML(render_pane("eagle", None), elem_id="eagle-pane")

        outputs = [plain_pane, eagle_pane, stats, history, prompt]
        event = gr.on(
            triggers=[run_btn.click, prompt.submit],
            fn=generate,
            inputs=[pair, prompt, max_new, temperature, depth, tree_top_k, total_tokens, chat_mode, history],
            outputs=outputs,
            concurrency_limit=1,
            concurrency_id="decode",
            show_progress="minimal",
            show_progress_on=[stats],
            api_name="generate",
        )
        stop_btn.click(
            lambda: render_stats(None, None, message="Stopped. Press Generate to run again."),
            outputs=[stats],
            cancels=[event],
            queue=False,
            api_name=False,
        )
        clear_btn.click(clear, outputs=[plain_pane, eagle_pane, stats, history], api_name=False)
        chat_mode.change(clear, outputs=[plain_pane, eagle_pane, stats, history], api_name=False)
        pair.change(
            lambda name: (*clear()[:2], pair_status(name), []),
            inputs=[pair],
            outputs=[plain_pane, eagle_pane, stats, history],
            api_name=False,
        )
        app.load(pair_status, inputs=[pair], outputs=[stats], api_name=False, show_progress="hidden")
    app.queue(max_size=queue_size, default_concurrency_limit=1)
    return app
