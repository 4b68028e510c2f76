"""The side-by-side speed demo (eagle3_hub/demo/, spaces/).

Without a browser: request validation, the turn-taking clock, token highlighting text, model-pair config, a
race on the real SmolLM2 target, and the Gradio queue with several clients at once (gradio_client).
With a browser (``-m browser``): the Space app in a subprocess, driven by headless Chromium through Playwright.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.demo import (
    DEFAULT_PAIRS,
    DemoError,
    Detokenizer,
    Limits,
    ModelPair,
    PairCache,
    PlainDecoder,
    Settings,
    load_pairs,
    race,
    render_pane,
    resolve_draft,
    validate_request,
)
from eagle3_hub.targets import REFERENCE_DRAFT_ROOT

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = "/usr/bin/chromium"
BROWSER_PROMPT = "Write a short poem about the ocean at night."
QUEUE_PROMPTS = ["List five fruits that are rich in vitamin C.", "Translate to French: Good morning, how are you today?"]


# ----------------------------------------------------------------------------------------- validation
def test_validate_request_accepts_sane_input():
    prompt, settings = validate_request("  Hello there \n", 24, 0.7, 4, 6, 20)
    assert prompt == "Hello there"
    assert settings == Settings(max_new_tokens=24, temperature=0.7, depth=4, tree_top_k=6, total_tokens=20)
    # numbers as the browser sends them (floats from sliders, strings from the API)
    assert validate_request("x", 24.0, "0", "5", 8.0, 32)[1] == Settings(24, 0.0, 5, 8, 32)


@pytest.mark.parametrize(
    "args, message",
    [
        (("", 24, 0, 5, 8, 32), "Type a prompt first"),
        (("   \n\t", 24, 0, 5, 8, 32), "Type a prompt first"),
        ((None, 24, 0, 5, 8, 32), "Type a prompt first"),
        (("x" * 4001, 24, 0, 5, 8, 32), "at most 4000"),
        (("hi", 0, 0, 5, 8, 32), "Max new tokens must be between 1 and 512"),
        (("hi", 10**9, 0, 5, 8, 32), "Max new tokens must be between 1 and 512"),
        (("hi", 12.5, 0, 5, 8, 32), "Max new tokens must be a whole number"),
        (("hi", "lots", 0, 5, 8, 32), "Max new tokens must be a number"),
        (("hi", 24, -0.1, 5, 8, 32), "Temperature must be between 0.0 and 2.0"),
        (("hi", 24, float("nan"), 5, 8, 32), "Temperature must be a number"),
        (("hi", 24, 0, 0, 8, 32), "Tree depth must be between 1 and 12"),
        (("hi", 24, 0, 5, 99, 32), "Tree top-k must be between 1 and 16"),
        (("hi", 24, 0, 5, 8, 100000), "Tree total tokens must be between 1 and 128"),
        (("hi", 24, 0, 5, 8, None), "Tree total tokens must be a number"),
        (("hi", 24, 0, 1, 2, 3), "proposes 2 candidate tokens"),
    ],
)
def test_validate_request_rejects_bad_input(args, message):
    with pytest.raises(DemoError, match=re.escape(message)):
        validate_request(*args)


def test_validate_request_uses_the_limits():
    limits = Limits(max_new_tokens=64, max_prompt_chars=10)
    with pytest.raises(DemoError, match="between 1 and 64"):
        validate_request("hi", 65, 0, 5, 8, 32, limits)
    with pytest.raises(DemoError, match="at most 10"):
        validate_request("x" * 11, 8, 0, 5, 8, 32, limits)


# ----------------------------------------------------------------------------------------- pairs config
def test_pairs_file_of_the_space_loads():
    pairs, default = load_pairs(REPO / "spaces" / "pairs.yaml")
    assert default == "smollm2-135m-instruct"
    assert pairs[default].target == "smollm2-135m-instruct" and pairs[default].draft == "reference"
    assert all(p.target and p.draft for p in pairs.values())


def test_the_embedded_pair_runs_as_the_bench_does_and_samples(tmp_path):
    """What users get: dtype auto (bf16 on CPUs with bf16 units) and a sampling temperature to start from; a pair
    file may set both, and a bad temperature is named."""
    pairs, default = load_pairs(REPO / "spaces" / "pairs.yaml")
    assert pairs[default].dtype == "auto" and pairs[default].temperature == 0.7
    assert ModelPair(name="x").dtype == "auto" and ModelPair(name="x").temperature == 0.7
    f = tmp_path / "pairs.yaml"
    f.write_text("pairs:\n  a:\n    target: x\n    draft: y\n    temperature: 0\n")
    assert load_pairs(f)[0]["a"].temperature == 0
    f.write_text("pairs:\n  a:\n    target: x\n    draft: y\n    temperature: hot\n")
    with pytest.raises(DemoError, match="temperature must be a number from 0"):
        load_pairs(f)


def test_the_starting_temperature_is_overridden_zero_included():
    """``demo --temperature 0`` starts the page greedy (0 is a value, not "keep the pair's own")."""
    from eagle3_hub.cli import command_parser

    module, parser = command_parser("demo")
    cache = module.make_cache(parser.parse_args(["--temperature", "0"]))
    assert cache.pairs[cache.default].temperature == 0
    assert module.make_cache(parser.parse_args([])).pairs[cache.default].temperature == 0.7
    with pytest.raises(DemoError, match="temperature must be a number from 0"):
        module.make_cache(parser.parse_args(["--temperature", "3"]))


def test_pairs_file_errors_say_what_is_wrong(tmp_path):
    bad = tmp_path / "pairs.yaml"
    bad.write_text("pairs:\n  a:\n    target: x\n")
    with pytest.raises(DemoError, match="needs both `target` and `draft`"):
        load_pairs(bad)
    bad.write_text("pairs:\n  a:\n    target: x\n    draft: y\n    colour: red\n")
    with pytest.raises(DemoError, match="unknown keys"):
        load_pairs(bad)
    bad.write_text("default: b\npairs:\n  a:\n    target: x\n    draft: y\n")
    with pytest.raises(DemoError, match="default pair 'b'"):
        load_pairs(bad)
    with pytest.raises(DemoError, match="not found"):
        load_pairs(tmp_path / "missing.yaml")


def test_missing_reference_draft_is_a_clear_error(tmp_path):
    pair = ModelPair(name="p", target="no-such-target-xyz", draft="reference")
    with pytest.raises(DemoError, match=r"reference EAGLE-3 draft for no-such-target-xyz is not in this install.*--draft"):
        resolve_draft(pair)
    with pytest.raises(DemoError, match="has no config.json"):
        resolve_draft(ModelPair(name="p", draft=str(tmp_path)))
    cache = PairCache({"p": pair}, "p")
    with pytest.raises(DemoError, match="not in this install"):
        cache.get("p")
    kind, message = cache.status("p")
    assert kind == "error" and "not in this install" in message
    with pytest.raises(DemoError, match="Unknown model pair"):
        cache.get("other")


def test_page_shows_a_missing_draft_instead_of_crashing():
    """A pair whose draft is not installed: the app still serves, and Generate answers with the reason."""
    gradio_client = pytest.importorskip("gradio_client")
    from eagle3_hub.demo import CSS, build_app

    cache = PairCache({"p": ModelPair(name="p", target="no-such-target-xyz", draft="reference", device="cpu")}, "p")
    app = build_app(cache)
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    try:
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        plain_html, eagle_html, stats_html = client.predict("p", "Hello", 8, 0.0, 5, 8, 24, False, api_name="/generate")[:3]
    finally:
        app.close()
    assert 'role="alert"' in stats_html and "not in this install" in stats_html and "--draft" in stats_html
    assert "Traceback" not in stats_html + plain_html + eagle_html


# ----------------------------------------------------------------------------------------- real SmolLM2
# smollm2 (target, tokenizer) and smollm2_tokenizer: conftest.py


def _chat_ids(tokenizer, prompt):
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return torch.tensor([tokenizer(text, add_special_tokens=False).input_ids])


def _greedy_reply(target, tokenizer, prompt, max_new_tokens):
    ids = _chat_ids(tokenizer, prompt)
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_detokenizer_pieces_rebuild_the_text(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    text = "Café naïve — 東京 🙂 tab\tand\nnew line; code: `x = y ** 2`"
    ids = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    detok = Detokenizer(tokenizer)
    for i, t in enumerate(ids):
        detok.add(t, drafted=i % 2 == 0)
    detok.flush()
    assert detok.text == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in p for p, _ in detok.pieces)  # split characters were joined, not garbled
    assert any(d for _, d in detok.pieces) and not all(d for _, d in detok.pieces)


def fit_draft(target, tokenizer, prompts, max_new_tokens=32, steps=30, draft_vocab_size=4096):
    """An EAGLE-3 draft fitted in seconds to the target's own greedy replies to ``prompts``.

    Only the first draft step is fitted: enough accepted tokens to see the highlighting on these prompts (a
    real draft comes from ``eagle3-hub train``). The draft vocabulary holds the reply tokens.
    """
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=draft_vocab_size)
    seqs = []
    for prompt in prompts:
        ids = _chat_ids(tokenizer, prompt)
        with torch.inference_mode():
            seqs.append(target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False))
    vocab_size = target.config.vocab_size
    needed = set(torch.cat([s[0] for s in seqs]).tolist())
    vocab = sorted(needed | set([i for i in range(vocab_size) if i not in needed][: draft_vocab_size - len(needed)]))
    draft.set_vocab_mapping(torch.tensor(vocab))
    to_draft = torch.full((vocab_size,), -1, dtype=torch.long)
    to_draft[torch.tensor(vocab)] = torch.arange(draft_vocab_size)
    data = []
    with torch.no_grad():
        for seq in seqs:  # feature of position t + token t+1 -> token t+2
            hidden = target(seq, output_hidden_states=True).hidden_states
            feats = torch.cat([hidden[i + 1] for i in draft.config.aux_layer_ids], dim=-1)  # (1, n, 3H)
            data.append((feats[:, :-2], seq[:, 1:-1], to_draft[seq[0, 2:]]))
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    draft.train()
    for _ in range(steps):
        loss = sum(torch.nn.functional.cross_entropy(draft(input_ids=x, target_hidden_states=f).logits[0], y) for f, x, y in data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft.eval()


@pytest.fixture(scope="module")
def fitted_draft_dir(smollm2, tmp_path_factory):
    target, tokenizer = smollm2
    draft = fit_draft(target, tokenizer, [BROWSER_PROMPT, *QUEUE_PROMPTS])
    folder = tmp_path_factory.mktemp("fitted-draft")
    draft.save_pretrained(folder, save_embeddings=False)  # the target's embedding is shared at load time
    return folder


@pytest.fixture(scope="module")
def pair_cache(fitted_draft_dir):
    pair = ModelPair(name="test", target="smollm2-135m-instruct", draft=str(fitted_draft_dir), dtype="float32", device="cpu")
    return PairCache({"test": pair}, "test")


@pytest.mark.slow  # the pair cache loads the real target itself
@pytest.mark.skipif(
    not (REFERENCE_DRAFT_ROOT / "smollm2-135m-instruct" / "config.json").exists(),
    reason="the reference draft eagle3_hub/reference_draft/smollm2-135m-instruct is not installed yet",
)
def test_default_pair_runs_with_the_reference_draft():
    # float32: bf16 (the pair's auto dtype on CPUs with bf16 units) may part from plain greedy at a near-tie
    pairs = {name: replace(pair, dtype="float32") for name, pair in DEFAULT_PAIRS.items()}
    cache = PairCache(pairs, "smollm2-135m-instruct")
    loaded = cache.get("smollm2-135m-instruct")
    messages = [{"role": "user", "content": QUEUE_PROMPTS[0]}]
    plain, eagle = list(race(loaded, messages, messages, Settings(max_new_tokens=24)))[-1]
    # lossless, and the draft contributes: more than one token per target forward
    assert plain.text == eagle.text and eagle.mean_acceptance_length > 1.0


def test_plain_decoder_matches_generate(smollm2):
    target, tokenizer = smollm2
    ids = _chat_ids(tokenizer, QUEUE_PROMPTS[0])
    with torch.inference_mode():
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    plain = PlainDecoder(target, ids, max_new_tokens=12, do_sample=False, temperature=1.0, eos_token_ids=[tokenizer.eos_token_id])
    tokens = []
    while not plain.done:
        tokens.append(plain.step())
    assert tokens == expected[0, ids.shape[1] :].tolist()
    # stops at the end-of-sequence token
    eos = tokens[3]
    plain = PlainDecoder(target, ids, max_new_tokens=12, do_sample=False, temperature=1.0, eos_token_ids=[eos])
    while not plain.done:
        plain.step()
    assert plain.new_tokens == 4


def test_race_is_lossless_and_highlights_accepted_draft_tokens(smollm2, pair_cache):
    target, tokenizer = smollm2
    loaded = pair_cache.get("test")
    messages = [{"role": "user", "content": BROWSER_PROMPT}]
    start = time.perf_counter()
    views = list(race(loaded, messages, messages, Settings(max_new_tokens=24)))
    wall = time.perf_counter() - start
    plain, eagle = views[-1]
    assert plain.state == eagle.state == "done"
    expected = _greedy_reply(target, tokenizer, BROWSER_PROMPT, 24)
    assert plain.text == eagle.text == expected
    assert plain.new_tokens == plain.steps  # one forward per token
    assert eagle.steps < eagle.new_tokens  # several tokens per target forward
    assert eagle.mean_acceptance_length > 1.2
    assert eagle.drafted_tokens == eagle.new_tokens - eagle.steps  # each step: accepted draft tokens + 1 bonus
    highlighted = "".join(p for p, drafted in eagle.pieces if drafted)
    assert highlighted and not any(d for _, d in plain.pieces)
    assert plain.tokens_per_second > 0 and eagle.tokens_per_second > 0
    # both streamed: some snapshot has text in both panes before either finished
    assert any(p.text and e.text and p.state == e.state == "running" for p, e in views[:-1])
    # honest clocks: the two never ran at once (their times add up to at most the wall time, and account
    # for most of it), and while both ran they had had about the same compute time (fair share)
    assert 0.6 * wall < plain.seconds + eagle.seconds <= wall
    step = eagle.seconds / eagle.steps + plain.seconds / plain.steps
    assert all(abs(p.seconds - e.seconds) <= 3 * step for p, e in views[:-1] if p.state == e.state == "running")
    page = render_pane("eagle", eagle)
    assert page.count('<mark class="e3-drafted">') >= 1 + sum(1 for _, d in eagle.pieces if d)  # + the legend


def _text_of(pane_html: str) -> str:
    match = re.search(r'<div class="e3-reply e3-current[^"]*">(.*?)</div>', pane_html, re.DOTALL)
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1))) if match else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_queue_serves_several_clients_without_mixing(smollm2, pair_cache):
    """Three users at once through the real Gradio queue: two prompts and an empty one. Each gets its own
    reply (equal to plain greedy decoding of its prompt), the empty one gets the message, nothing crashes."""
    gradio_client = pytest.importorskip("gradio_client")
    from eagle3_hub.demo import CSS, build_app

    target, tokenizer = smollm2
    app = build_app(pair_cache, Limits(max_new_tokens=64))
    generate_fn = next(f for f in app.fns.values() if f.api_name == "generate")
    assert generate_fn.queue and generate_fn.concurrency_limit == 1  # one generation at a time, others wait
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    try:
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        # (pair, prompt, max new tokens, temperature, depth, tree top-k, total tokens, chat mode)
        jobs = [client.submit("test", p, 12, 0.0, 5, 8, 32, False, api_name="/generate") for p in [*QUEUE_PROMPTS, "   "]]
        results = [job.result(timeout=240) for job in jobs]
    finally:
        app.close()
    for prompt, (plain_html, eagle_html, stats_html, *_rest) in zip(QUEUE_PROMPTS, results):
        expected = _greedy_reply(target, tokenizer, prompt, 12)
        assert _text_of(plain_html) == _text_of(eagle_html) == expected
        assert 'data-identical="1"' in stats_html
    assert "Type a prompt first" in results[2][2] and 'role="alert"' in results[2][2]


def test_chat_mode_keeps_the_conversation(pair_cache):
    """Chat mode: the second turn is answered with the first one in the prompt, and both turns stay on the page."""
    gradio_client = pytest.importorskip("gradio_client")
    from eagle3_hub.demo import CSS, build_app

    app = build_app(pair_cache)
    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    try:
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        first = client.predict("test", QUEUE_PROMPTS[0], 6, 0.0, 5, 8, 24, True, api_name="/generate")
        second = client.predict("test", "And five vegetables?", 6, 0.0, 5, 8, 24, True, api_name="/generate")
        other_user = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        fresh = other_user.predict("test", "And five vegetables?", 6, 0.0, 5, 8, 24, True, api_name="/generate")
    finally:
        app.close()
    replies = r'<div class="e3-reply[^"]*">(.*?)</div>'
    first_reply = re.findall(replies, first[1], re.DOTALL)
    assert len(first_reply) == 1 and first[1].count('class="e3-user"') == 1
    for pane in second[:2]:  # both panes: two user turns, the first reply kept (highlighting included)
        assert pane.count('class="e3-user"') == 2
        assert html.escape(QUEUE_PROMPTS[0]) in pane and "And five vegetables?" in pane
    assert re.findall(replies, second[1], re.DOTALL)[0] == first_reply[0]
    plain_replies, eagle_replies = (re.findall(replies, pane, re.DOTALL) for pane in second[:2])
    assert len(plain_replies) == len(eagle_replies) == 2
    assert [re.sub(r"<[^>]+>", "", r) for r in plain_replies] == [re.sub(r"<[^>]+>", "", r) for r in eagle_replies]
    # another user's session starts empty; the same question without the history gets another prompt
    assert fresh[1].count('class="e3-user"') == 1


def test_cli_overrides_the_default_pair(tmp_path):
    import argparse

    from eagle3_hub.commands.demo import add_arguments, make_cache

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cache = make_cache(parser.parse_args(["--draft", str(tmp_path), "--dtype", "bfloat16"]))
    pair = cache.pairs[cache.default]
    assert cache.default == "smollm2-135m-instruct"
    assert (pair.target, pair.draft, pair.dtype) == ("smollm2-135m-instruct", str(tmp_path), "bfloat16")
    cache = make_cache(parser.parse_args(["--pairs", str(REPO / "spaces" / "pairs.yaml"), "--pair", "qwen3-8b"]))
    assert cache.default == "qwen3-8b" and cache.pairs["qwen3-8b"].target == "Qwen/Qwen3-8B"
    with pytest.raises(DemoError, match="--pair 'nope'"):
        make_cache(parser.parse_args(["--pair", "nope"]))


# ----------------------------------------------------------------------------------------- browser
def _browser_ready() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not installed (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright not installed (pip install playwright; its own browser download is not needed)"
    return None


@contextlib.contextmanager
def _served_app(args: list[str], log_path: Path):
    """``python spaces/app.py ARGS`` on a free port until the block ends; yields its URL."""
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "w+") as log:
        server = subprocess.Popen(
            [sys.executable, str(REPO / "spaces" / "app.py"), *args, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.time() + 180
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2)
                    break
                except OSError:
                    if server.poll() is not None or time.time() > deadline:
                        log.seek(0)
                        pytest.fail(f"demo server did not start:\n{log.read()[-4000:]}")
                    time.sleep(0.5)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()


@pytest.mark.browser
def test_browser_side_by_side(smollm2, fitted_draft_dir, tmp_path):
    """Start the Space app, type a prompt, press Generate in headless Chromium, check both panes."""
    missing = _browser_ready()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import expect, sync_playwright

    target, tokenizer = smollm2
    expected = _greedy_reply(target, tokenizer, BROWSER_PROMPT, 24)
    profile = tmp_path / "chromium-profile"
    # float32 greedy, the reference's: the page starts at the pair's temperature (0.7 for the embedded pair) and dtype
    # (auto: bf16 on CPUs with bf16 units, where outputs may part at near-ties) unless told
    served = ["--draft", str(fitted_draft_dir), "--device", "cpu", "--dtype", "float32", "--temperature", "0"]
    with _served_app(served, tmp_path / "server.log") as url, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            viewport={"width": 1400, "height": 1100},
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page()
        page.goto(url)
        expect(page.locator("#stats")).to_contain_text("Ready", timeout=30_000)  # the pair loaded at start

        # an empty prompt: a message in the page, not a stack trace
        page.click("#generate")
        expect(page.locator('#stats [role="alert"]')).to_contain_text("Type a prompt first", timeout=30_000)

        page.click("#settings >> text=Settings")
        new_tokens = page.locator("#max-new-tokens input[type=number]")
        for _ in range(5):  # a late page-load update can put the default (96) back: set it until it sticks
            new_tokens.fill("24")
            new_tokens.press("Enter")
            new_tokens.blur()  # Gradio takes a number's value on change/blur
            page.wait_for_timeout(700)
            if new_tokens.input_value() == "24":
                break
        expect(new_tokens).to_have_value("24")
        page.fill("#prompt textarea", BROWSER_PROMPT)
        # record what the panes show while they stream
        page.evaluate("""() => {
            window.__e3 = [];
            const snap = () => {
                const p = document.querySelector('#plain-pane .e3-pane'), e = document.querySelector('#eagle-pane .e3-pane');
                const t = el => (el && el.querySelector('.e3-current')) ? el.querySelector('.e3-current').textContent : '';
                window.__e3.push({p: p && p.dataset.state, e: e && e.dataset.state, pt: t(p), et: t(e)});
            };
            new MutationObserver(snap).observe(document.body, {subtree: true, childList: true, characterData: true});
        }""")
        page.click("#generate")
        page.wait_for_selector('#stats .e3-stats[data-state="done"]', timeout=120_000)
        page.wait_for_selector('#plain-pane .e3-pane[data-state="done"]', timeout=10_000)
        page.wait_for_selector('#eagle-pane .e3-pane[data-state="done"]', timeout=10_000)

        plain_text = page.locator("#plain-pane .e3-current").text_content()
        eagle_text = page.locator("#eagle-pane .e3-current").text_content()
        assert plain_text == eagle_text == expected
        plain_tps = float(page.get_attribute("#plain-pane .e3-tps", "data-tps"))
        eagle_tps = float(page.get_attribute("#eagle-pane .e3-tps", "data-tps"))
        speedup = float(page.get_attribute("#stats .e3-speedup", "data-speedup"))
        accept = float(page.get_attribute("#eagle-pane .e3-accept", "data-accept"))
        drafted = int(page.get_attribute("#eagle-pane .e3-drafted-count", "data-drafted"))
        assert plain_tps > 0 and eagle_tps > 0
        assert speedup == pytest.approx(eagle_tps / plain_tps, rel=0.01)
        assert accept > 1.2 and drafted > 0
        assert page.get_attribute("#stats .e3-lossless", "data-identical") == "1"
        marks = page.locator("#eagle-pane .e3-current mark.e3-drafted")
        assert marks.count() >= 1 and all(marks.all_text_contents())  # (a drafted piece may be a newline)
        assert "".join(marks.all_text_contents()).strip()
        assert page.locator("#plain-pane .e3-current mark").count() == 0
        snapshots = page.evaluate("window.__e3")
        assert any(s["pt"] and s["et"] and s["p"] == s["e"] == "running" for s in snapshots), "panes did not stream together"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)
        browser.close()
