"""The demo's rough edges: numbers no slider sends (inf, nan, huge, negative, booleans) and two users at once."""

from __future__ import annotations

import html
import re
import threading

import pytest
import torch

from eagle3_hub.demo import DemoError, Limits, ModelPair, PairCache, Settings, serve_request, validate_request
from eagle3_hub.targets import reference_draft

GOOD = ("hi", 24, 0, 5, 8, 32)


@pytest.mark.parametrize(
    "position, name", [(1, "Max new tokens"), (2, "Temperature"), (3, "Tree depth"), (4, "Tree top-k"), (5, "Tree total tokens")]
)
@pytest.mark.parametrize(
    "value", [float("inf"), float("-inf"), float("nan"), "inf", "-Infinity", "NaN", "1e400", 10**400, True, [3], {"a": 1}, ""]
)
def test_numbers_no_slider_sends_get_a_clear_message(position, name, value):
    args = list(GOOD)
    args[position] = value
    with pytest.raises(DemoError, match=rf"^{re.escape(name)} must be a number, got "):
        validate_request(*args)


@pytest.mark.parametrize(
    "value, message", [(-5, "between 1 and 512"), (1e30, "between 1 and 512"), ("-5", "between 1 and 512"), (3.5, "whole number")]
)
def test_out_of_range_token_counts_say_the_range(value, message):
    with pytest.raises(DemoError, match=rf"Max new tokens must be (a )?{message}"):
        validate_request("hi", value, 0, 5, 8, 32)


def test_numbers_as_text_and_floats_still_work():
    assert validate_request("hi", " 24 ", "0.5", "5.0", 8.0, "1e1")[1] == Settings(24, 0.5, 5, 8, 10)


# ----------------------------------------------------------------------------------------- two users at once
def _text(pane_html: str) -> str:
    """The reply text of a pane (tags stripped, entities decoded)."""
    reply = pane_html.split("e3-reply e3-current", 1)[-1]
    reply = reply.split("</div>", 1)[0].split(">", 1)[-1]
    return html.unescape(re.sub(r"<[^>]+>", "", reply))


@pytest.mark.slow  # the pair cache loads the real target itself
@pytest.mark.skipif(not (reference_draft() / "config.json").exists(), reason="the reference draft is not installed")
def test_two_users_at_once_get_their_own_lossless_answers(monkeypatch):
    """Two requests through the demo's request handler at the same moment (as two browser tabs on the API would):
    both finish, each answer belongs to its own prompt, and at greedy both panes of each equal plain greedy."""
    try:
        cache = PairCache({"p": ModelPair(name="p", dtype="float32", device="cpu")}, "p")
        loaded = cache.get("p")
    except (FileNotFoundError, DemoError) as e:
        pytest.skip(f"embedded SmolLM2 target unavailable: {e}")
    prompts = ["List three colours.", "Name two planets."]
    expected = {}
    for p in prompts:
        ids = loaded.encode([{"role": "user", "content": p}])
        with torch.inference_mode():
            out = loaded.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
        expected[p] = loaded.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    import eagle3_hub.demo.app as demo  # where serve_request looks the race up

    real_race, running, overlap = demo.race, threading.Semaphore(1), []

    def watched_race(*args, **kwargs):
        """The demo's race, noting when two of them run on the shared models at the same time."""
        if not running.acquire(blocking=False):
            overlap.append(True)
            yield from real_race(*args, **kwargs)
            return
        try:
            yield from real_race(*args, **kwargs)
        finally:
            running.release()

    monkeypatch.setattr(demo, "race", watched_race)
    start, pages, errors = threading.Barrier(len(prompts)), {}, []

    def user(prompt):
        try:
            start.wait()
            for page in serve_request(cache, "p", prompt, 10, 0.0, 4, 4, 12, False, [], limits=Limits()):
                pages[prompt] = page
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=user, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert not overlap, "two races ran on the shared models at the same time"
    for p in prompts:
        plain_html, eagle_html, stats_html, history, _ = pages[p]
        assert 'data-identical="1"' in stats_html, stats_html
        assert _text(plain_html).strip() == expected[p].strip()
        assert _text(eagle_html).strip() == expected[p].strip()
        assert html.escape(p) in plain_html
