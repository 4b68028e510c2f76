"""The lean forward of Llama-family targets that CPU tree decoding verifies with (eagle3_hub/generation/tree/lean_forward.py)."""

from __future__ import annotations

import pytest
import torch
from test_tree_decoding import TREE, copy_draft, left_padded, plain_greedy, prompt
from tiny_models import make_tiny_target
from transformers import DynamicCache

from eagle3_hub import generate
from eagle3_hub.generation.tree import lean_forward
from eagle3_hub.generation.tree.fast_paths import pack_linear
from eagle3_hub.generation.tree.lean_forward import LeanTargetForward, unsupported_reason
from eagle3_hub.generation.tree.verification import forward_cache_kwarg

LEAN_ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


def _tree_mask(n_prefix: int, n: int, dtype=torch.float32) -> torch.Tensor:
    """(1, 1, n, n_prefix + n) additive: every new token sees the prefix, itself, and every other earlier new
    token but its predecessor (a tree's two branches)."""
    allowed = torch.ones(n, n_prefix + n, dtype=torch.bool)
    allowed[:, n_prefix:] = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(1, n, 2):
        allowed[i, n_prefix + i - 1] = False
    return torch.zeros(1, 1, n, n_prefix + n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize("arch", LEAN_ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_computes_what_transformers_computes(arch, dtype):
    """A prompt causally (its query heads attend unfolded), then tree-masked blocks over the cache (a large tree, a small one and a single token,
    whose grouped query heads attend folded), in a batch of two: the same hidden states at every layer
    (transformers' indexing, the last one normed) and the same cache as the model's own forward."""
    target = make_tiny_target(arch, dtype=dtype)
    lean = LeanTargetForward.for_model(target, forward_cache_kwarg(target))
    assert lean is not None, unsupported_reason(target)
    assert lean.packed == (pack_linear(target.lm_head.weight) is not None)  # oneDNN-packed projections where it can
    _same_as_transformers(target, lean, dtype)
    if lean.packed:
        _same_as_transformers(target, LeanTargetForward(target), dtype)  # and F.linear over the model's weights


def _same_as_transformers(target, lean, dtype):
    g = torch.Generator().manual_seed(3)
    theirs, ours = DynamicCache(), DynamicCache()
    start = 0
    for n in (16, 7, 3, 1):
        ids = torch.randint(3, 256, (2, n), generator=g)
        pos = torch.arange(start, start + n).expand(2, n)
        mask = _tree_mask(start, n, dtype).expand(2, 1, n, start + n)
        with torch.no_grad():
            ref = target(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=True,
                **{forward_cache_kwarg(target): theirs},
            )
        last, states = lean(ids, pos, mask, ours)
        assert len(states) == len(ref.hidden_states) == target.config.num_hidden_layers + 1
        tol = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        for a, b in zip(ref.hidden_states, states):
            torch.testing.assert_close(b, a, **tol)
        torch.testing.assert_close(target.lm_head(last), ref.logits, **tol)
        start += n
    for a, b in zip(theirs.layers, ours.layers):
        torch.testing.assert_close(b.keys, a.keys, **tol)
        torch.testing.assert_close(b.values, a.values, **tol)


def test_lean_forward_steps_aside_where_it_does_not_reproduce_the_model():
    """Other architectures, eager attention, foreign hooks and adapters get transformers' forward; the probe
    rejects a lean forward whose output differs from the model's, and runs again after the weights change."""
    assert LeanTargetForward.for_model(make_tiny_target("gemma2")) is None
    assert LeanTargetForward.for_model(make_tiny_target("phi3")) is None  # fused qkv: another layer class
    eager = make_tiny_target("llama")
    eager.config._attn_implementation = "eager"
    assert "eager" in unsupported_reason(eager)

    hooked = make_tiny_target("llama")
    hooked.model.layers[1].mlp.register_forward_hook(lambda m, i, o: o * 2)
    assert "hooks" in unsupported_reason(hooked) and LeanTargetForward.for_model(hooked) is None

    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(make_tiny_target("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert LeanTargetForward.for_model(adapted.base_model.model) is None

    a, b = make_tiny_target("llama", seed=0), make_tiny_target("llama", seed=1)
    with pytest.MonkeyPatch.context() as mp:  # projections oneDNN cannot pack (or too many bytes): F.linear
        mp.setattr(lean_forward, "pack_linear", lambda *args: None)
        assert not LeanTargetForward.for_model(b).packed
        mp.setattr(lean_forward, "PACKED_MAX_BYTES", 0)
        assert not LeanTargetForward.for_model(make_tiny_target("llama")).packed
    assert not LeanTargetForward(a)._agrees_with(b, forward_cache_kwarg(b))
    assert LeanTargetForward(a)._agrees_with(a, forward_cache_kwarg(a))

    # the verdict is kept while the weights are unchanged, and checked again after an in-place change
    calls = []
    real = LeanTargetForward._agrees_with

    def counting(self, model, kw):
        calls.append(1)
        return real(self, model, kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LeanTargetForward, "_agrees_with", counting)
        assert LeanTargetForward.for_model(a) is not None and LeanTargetForward.for_model(a) is not None
        assert len(calls) == 1
        with torch.no_grad():
            a.model.norm.weight.mul_(2)
        assert LeanTargetForward.for_model(a) is not None
        assert len(calls) == 2
    # packed copies follow an in-place change of a projection (a stale copy would fail the probe: F.linear)
    packed = LeanTargetForward.for_model(a).packed
    with torch.no_grad():
        a.model.layers[0].mlp.up_proj.weight.mul_(-1)
    assert LeanTargetForward.for_model(a).packed == packed


@pytest.mark.parametrize("arch", LEAN_ARCHS)
def test_tree_decoding_verifies_through_the_lean_forward_losslessly(arch):
    """CPU tree decoding verifies through the lean forward (stats.lean_forward) and its output is plain greedy's,
    at batch 1 and in a left-padded batch; a target it does not reproduce decodes through transformers'."""
    target = make_tiny_target(arch)
    draft = copy_draft(target)
    ids = prompt(seed=21)
    out = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], **TREE)
    assert out.stats.lean_forward
    assert torch.equal(out.sequences, plain_greedy(target, ids, 80))
    prompts = [prompt(n=5, seed=22)[0], prompt(n=13, seed=23)[0]]
    batch, mask = left_padded(prompts)
    out = generate(target, draft, batch, attention_mask=mask, max_new_tokens=40, eos_token_id=[], **TREE)
    assert out.stats.lean_forward
    for r, p in enumerate(prompts):
        ref = plain_greedy(target, p[None], 40)[0, len(p) :]
        assert torch.equal(out.sequences[r, batch.shape[1] :], ref)

    # a draft bound for assisted generation leaves feature hooks on the target: they only read outputs
    draft.bind(target)
    target.generate(ids, assistant_model=draft, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert draft._hook_handles and unsupported_reason(target) is None
    out = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], **TREE)
    assert out.stats.lean_forward and torch.equal(out.sequences, plain_greedy(target, ids, 80))

    other = make_tiny_target("gemma2")
    ids = prompt(seed=24)
    out = generate(other, copy_draft(other), ids, max_new_tokens=30, eos_token_id=[], **TREE)
    assert not out.stats.lean_forward
    assert torch.equal(out.sequences, plain_greedy(other, ids, 30))
