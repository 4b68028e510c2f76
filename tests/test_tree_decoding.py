"""EAGLE tree decoding: lossless greedy and sampling, batches, EOS / stop strings / streaming, the transformers
custom_generate entry points, errors. Tiny random targets in float32 (token equality needs float32)."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch
from scipy.stats import chisquare
from tiny_models import copy_draft, left_padded, make_tiny_target
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TextIteratorStreamer,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.generation.tree import (
    LOOKUP_SHARE,
    TREE_DEFAULTS,
    TreeDecodingOutput,
    TreeKVCache,
    acceptance,
    attention_kernels,
    custom_generate_files,
    drafting,
    fast_paths,
    generate,
    tree_defaults,
    tree_generate,
    verification,
    write_custom_generate,
)
from eagle3_hub.generation.tree.config import TreeConfig
from eagle3_hub.generation.tree.drafting import Drafter
from eagle3_hub.generation.tree.lookup import PromptLookup as _PromptLookup

# full trees (min_node_prob 0): every test of the tree's logic verifies all its nodes
TREE = {"depth": 5, "tree_top_k": 4, "total_tokens": 16, "min_node_prob": 0.0}


def random_draft(target, seed=0, **kwargs) -> Eagle3DraftModel:
    torch.manual_seed(seed)
    return Eagle3DraftModel.from_target(target, **kwargs).eval()


def prompt(n=12, seed=0, vocab=256):
    return torch.randint(3, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def plain_greedy(target, ids, max_new_tokens, eos=None, **kwargs):
    return target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        **kwargs,
    )


# ------------------------------------------------------------------------------------------- greedy
def test_greedy_equals_plain_generate(tiny_target):
    target = tiny_target
    draft = copy_draft(target)
    ids = prompt(seed=1)
    ref = plain_greedy(target, ids, 96)
    out = generate(target, draft, ids, max_new_tokens=96, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, ref)
    assert out.stats.new_tokens == 96
    assert out.stats.target_forwards < 96  # several tokens per forward


@pytest.mark.parametrize(
    "tree", [(1, 1, 1), (5, 1, 5), (5, 3, 2), (2, 6, 42), (3, 2, 6)], ids=lambda t: "depth{}-k{}-n{}".format(*t)
)
def test_greedy_tree_shapes(tree):
    """Chains, a single node, a tree smaller than its depth, the whole candidate pool."""
    target = make_tiny_target("phi3")
    draft = copy_draft(target)
    ids = prompt(n=1, seed=4)  # a one-token prompt
    ref = plain_greedy(target, ids, 60)
    depth, k, n = tree
    out = generate(
        target, draft, ids, max_new_tokens=60, eos_token_id=[], depth=depth, tree_top_k=k, total_tokens=n, min_node_prob=0.0
    )
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_fixed_shape_draft_levels_build_the_same_trees(arch, device, monkeypatch):
    """``draft_graph=True`` (tree levels over a fixed-shape scratch cache and the context's validity over the
    whole buffer: CUDA graphs on CUDA, eager on CPU) builds the same tree as the eager path at every step of the
    same depth, with holes in the caches (a left-padded batch whose rows finish at different steps, so the graphs
    are captured again for fewer rows), and stays lossless. The draft's attention output is made to matter (the
    copy draft alone ignores it)."""
    target = make_tiny_target(arch).to(device)
    draft = copy_draft(target).to(device)
    with torch.no_grad():
        torch.manual_seed(0)
        draft.midlayer.self_attn.o_proj.weight.normal_(std=0.3)
    trees: dict[bool, list] = {False: [], True: []}
    draft_tree = Drafter.draft_tree

    def recording(self, depth, *args):
        out = draft_tree(self, depth, *args)
        trees[self.levels is not None].append((depth, [t.clone() for t in out]))
        return out

    monkeypatch.setattr(Drafter, "draft_tree", recording)
    prompts = [prompt(n, seed=s)[0] for n, s in ((5, 3), (12, 4))]
    ids, mask = (t.to(device) for t in left_padded(prompts))
    outs = {
        g: generate(target, draft, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=[], draft_graph=g, **TREE)
        for g in (False, True)
    }
    for i, p in enumerate(prompts):
        ref = plain_greedy(target, p[None].to(device), 60)[0, len(p) :]
        assert torch.equal(outs[True].sequences[i, 12:], ref), f"row {i}"
    assert torch.equal(outs[True].sequences, outs[False].sequences)
    pairs = [(a, b) for a, b in zip(trees[False], trees[True]) if a[0] == b[0]]
    assert len(pairs) >= len(trees[False]) - 3  # the default path shrinks the depth in the last steps only
    for step, ((_, tree), (_, fixed)) in enumerate(pairs):
        assert all(torch.equal(x, y) for x, y in zip(tree, fixed)), f"step {step}"
    assert outs[True].stats.draft_forwards == outs[False].stats.draft_forwards + sum(
        b[0] - a[0] for a, b in zip(trees[False], trees[True])
    )
    assert outs[True].stats.mean_acceptance_length > 2  # the tree is accepted, so its levels are checked


def test_fixed_shape_draft_levels_draw_the_same_children(monkeypatch):
    """Drawn children (``draft_sampling``) in the fixed-shape levels take their noise from a buffer filled before
    each call, in the order the eager path draws it: from the same generator both paths build the same trees with
    the same draft distributions at every step of the same depth, so the noise is drawn anew for each tree."""
    target = make_tiny_target("llama")
    draft = random_draft(target, seed=1)
    records: dict[bool, list] = {False: [], True: []}
    draft_tree = Drafter.draft_tree

    def recording(self, depth, *args):
        out = draft_tree(self, depth, *args)
        records[self.levels is not None].append((depth, [t.clone() for t in out], self.proposal))
        return out

    monkeypatch.setattr(Drafter, "draft_tree", recording)
    ids = torch.cat([prompt(seed=1), prompt(seed=2)])
    shape = {"depth": 3, "tree_top_k": 3, "total_tokens": 8, "min_node_prob": 0.0, "grow_min_prob": 0.0, "adaptive": False}
    outs = {
        g: generate(
            target,
            draft,
            ids,
            max_new_tokens=40,
            eos_token_id=[],
            do_sample=True,
            temperature=0.9,
            generator=torch.Generator().manual_seed(0),
            draft_sampling=True,
            draft_graph=g,
            **shape,
        )
        for g in (False, True)
    }
    assert outs[True].stats.tree["draft_sampling"] and outs[True].stats.mean_acceptance_length > 1.5
    steps = list(itertools.takewhile(lambda p: p[0][0] == p[1][0], zip(records[False], records[True])))
    assert len(steps) >= len(records[False]) - 2  # the default path shrinks the depth in the last steps only
    for step, ((_, tree, proposal), (_, fixed, fixed_proposal)) in enumerate(steps):
        assert all(torch.equal(x, y) for x, y in zip(tree, fixed)), f"step {step}"
        assert torch.equal(proposal.slot_rows, fixed_proposal.slot_rows), f"step {step}"
        assert torch.allclose(proposal.log_q, fixed_proposal.log_q, atol=1e-5)  # attention over a longer buffer
    new = ids.shape[1] + 40 - 4  # the last step may differ: depth 3 and a bonus token
    assert torch.equal(outs[True].sequences[:, :new], outs[False].sequences[:, :new])


def test_cpu_verification_asks_for_logits_in_multiples_of_four_rows():
    """On CPU a verification computes the logits of the slots with children only, rounded up to a multiple of
    LOGITS_ROWS_MULTIPLE rows (MKL's small-batch sgemm is dearer for 3 or 7 rows); the output stays lossless."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    rows = []
    hook = target.get_output_embeddings().register_forward_hook(lambda m, i, o: rows.append(i[0].numel() // i[0].shape[-1]))
    ids = prompt(seed=1)
    try:
        out = generate(
            target, draft, ids, max_new_tokens=60, eos_token_id=[], depth=3, tree_top_k=4, total_tokens=8, min_node_prob=0.0
        )
    finally:
        hook.remove()
    assert torch.equal(out.sequences, plain_greedy(target, ids, 60))
    # after the prefill and the check that the head runs alone; the last steps draft smaller trees
    verify = rows[2:-3]
    # 1 row: a path that ended at a slot without logits has them computed then; 9: every slot
    assert verify and all(r % 4 == 0 or r in (1, 9) for r in verify), str(rows)
    assert any(r < 9 for r in verify)  # a subset of the slots, not all of them


def test_prefill_trusts_the_head_once_it_gave_the_models_logits():
    """The first run on a target checks at its prefill that the head alone gives the model's logits; later runs on it
    ask the model for none (transformers would hand its head a strided (b, 1, H) slice, a slow bmm path on CPU) and
    compute the last slot's themselves, losslessly. A target whose forward changes its logits is never trusted, and
    a new head weight is checked again."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    rows = []
    hook = target.get_output_embeddings().register_forward_hook(lambda m, i, o: rows.append(i[0].shape[:-1]))
    ids = prompt(seed=1)
    expected = plain_greedy(target, ids, 30)
    try:
        for run in range(2):
            rows.clear()
            out = generate(target, draft, ids, max_new_tokens=30, eos_token_id=[], **TREE)
            assert torch.equal(out.sequences, expected)
            # the prefill's head calls: the model's own (1 row) and the check (1 row); then none from the model
            # (0 rows) and one for the last slot
            assert [tuple(r) for r in rows[:2]] == ([(1, 1), (1, 1)] if run == 0 else [(1, 0), (1, 1)])
        with torch.no_grad():
            target.get_output_embeddings().weight.add_(0.0)  # in place: a new version of the weight
        rows.clear()
        generate(target, draft, ids, max_new_tokens=4, eos_token_id=[], **TREE)
        assert [tuple(r) for r in rows[:2]] == [(1, 1), (1, 1)]
    finally:
        hook.remove()

    scaled = make_tiny_target("llama")

    def halve_logits(module, args, output):  # logits the head alone does not give
        output.logits.mul_(0.5)

    scaled.register_forward_hook(halve_logits)
    for _ in range(2):
        out = generate(scaled, copy_draft(scaled), ids, max_new_tokens=30, eos_token_id=[], **TREE)
        assert torch.equal(out.sequences, plain_greedy(scaled, ids, 30))
        assert verification._head_verdicts[scaled][1] is False


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a torch build with oneDNN")
def test_packed_head_matches_the_linear_and_steps_aside_where_it_cannot():
    """The oneDNN-packed copy of the target's head gives F.linear's logits (to float32 rounding) for any number of
    rows, 3D and strided input, with a bias; it is packed again when the weight changes in place; it is not used for
    a hooked or a float16 head (bfloat16 where the CPU has bf16 kernels); and CPU tree decoding computes its
    verification logits and the draft's logits with it, losslessly."""
    torch.manual_seed(0)
    for bias in (False, True):
        head = torch.nn.Linear(64, 300, bias=bias)
        fast = fast_paths.packed_head(head)
        assert fast is not None
        for x in (
            torch.randn(1, 64),
            torch.randn(3, 64),
            torch.randn(13, 64),
            torch.randn(2, 5, 64),
            torch.randn(2, 7, 64)[:, ::2],
        ):
            torch.testing.assert_close(fast(x), head(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        head.weight.mul_(2)
    x = torch.randn(4, 64)
    torch.testing.assert_close(fast_paths.packed_head(head)(x), head(x), rtol=1e-5, atol=1e-5)
    assert fast_paths.packed_head(torch.nn.Linear(64, 300).to(torch.float16)) is None
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # a bf16 head: F.linear's numbers to bf16 rounding
        bf16 = torch.nn.Linear(64, 300, bias=False).to(torch.bfloat16)
        x = torch.randn(5, 64).bfloat16()
        got = fast_paths.packed_head(bf16)(x)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), bf16(x).float(), rtol=2e-2, atol=2e-2)
    hooked = torch.nn.Linear(64, 300)
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    assert fast_paths.packed_head(hooked) is None

    target = make_tiny_target("llama")
    calls = []
    real = fast_paths.packed_head

    def counting(head):
        fast = real(head)
        return None if fast is None else (lambda h: calls.append(h.shape) or fast(h))

    ids = prompt(seed=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(drafting, "packed_head", counting)  # the draft's head
        mp.setattr(verification, "packed_head", counting)  # the target's
        out = generate(target, copy_draft(target), ids, max_new_tokens=60, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, plain_greedy(target, ids, 60))
    # every verification after the prefill, and every draft forward
    assert len(calls) >= out.stats.target_forwards - 1 + out.stats.draft_forwards


# ------------------------------------------------------------------------------------ lookup branch
COPY_ALL = {1: 1.0, 2: 1.0, 3: 1.0}  # every match proposes m tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_min_node_prob_verifies_only_the_nodes_the_draft_gives_a_chance(arch, monkeypatch):
    """With ``min_node_prob`` a tree keeps the nodes whose cumulative draft probability reaches it (at least one,
    at most total_tokens): trees of varying size, fewer nodes per verification than without it, and the output
    stays plain greedy, also in a left-padded batch; sampling runs on the pruned trees."""
    target = make_tiny_target(arch)
    draft = copy_draft(target)
    with torch.no_grad():  # sharpen the copy draft's distribution, so that some nodes pass a threshold and some do not
        draft.lm_head.weight.mul_(20)
    trees = []
    grow = Drafter.grow

    def recording(self, depth, score, token, *args):
        out = grow(self, depth, score, token, *args)
        trees.append((self.min_node_logp, out))
        return out

    monkeypatch.setattr(Drafter, "grow", recording)
    ids = prompt(seed=7)
    ref = plain_greedy(target, ids, 80)
    shape = dict(depth=4, tree_top_k=4, total_tokens=16, lookup_tokens=0)
    full = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], min_node_prob=0.0, **shape)
    n_full = [out[0].shape[1] for _, out in trees]
    trees.clear()
    pruned = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], min_node_prob=0.1, **shape)
    n_pruned = [out[0].shape[1] for _, out in trees]
    assert torch.equal(full.sequences, ref) and torch.equal(pruned.sequences, ref)
    assert all(logp == pytest.approx(math.log(0.1)) for logp, _ in trees)
    assert all(1 <= n <= 16 for n in n_pruned) and max(n_full) == 16
    assert sum(n_pruned) / len(n_pruned) < sum(n_full) / len(n_full)  # fewer nodes per verification
    assert min(n_pruned) < 16 and max(n_pruned) > 1  # the threshold cuts some trees, not every one to a node
    # batches and sampling: still the target's own output / distribution machinery, on pruned trees
    prompts = [prompt(n, seed=s)[0] for n, s in ((5, 3), (12, 4))]
    bids, mask = left_padded(prompts)
    out = generate(target, draft, bids, attention_mask=mask, max_new_tokens=40, eos_token_id=[], min_node_prob=0.1, **shape)
    for i, p in enumerate(prompts):
        assert torch.equal(out.sequences[i, 12:], plain_greedy(target, p[None], 40)[0, len(p) :]), f"row {i}"
    sampled = generate(
        target,
        draft,
        ids,
        max_new_tokens=20,
        do_sample=True,
        min_node_prob=0.1,
        generator=torch.Generator().manual_seed(0),
        **shape,
    )
    assert sampled.sequences.shape == (1, ids.shape[1] + 20)


def test_min_node_prob_stops_drafting_levels_that_could_not_add_a_node(monkeypatch):
    """Once every frontier node scores below min_node_prob, the deeper levels are not drafted (their nodes would
    score lower still): the trees are the same as with every level drafted, step by step, with fewer draft
    forwards, and the output is plain greedy."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    with torch.no_grad():
        draft.lm_head.weight.mul_(20)
    trees: dict[bool, list] = {True: [], False: []}
    draft_tree = Drafter.draft_tree
    mode = {"stop": True}

    def recording(self, depth, *args):
        out = draft_tree(self, depth, *args)
        trees[mode["stop"]].append([t.clone() for t in out])
        return out

    monkeypatch.setattr(Drafter, "draft_tree", recording)
    ids = prompt(seed=7)
    shape = dict(depth=4, tree_top_k=4, total_tokens=16, lookup_tokens=0, min_node_prob=0.1)
    stopping = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], **shape)
    mode["stop"] = False
    monkeypatch.setattr(Drafter, "can_grow", lambda self, f_score: True)  # every level
    every = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], **shape)
    assert torch.equal(stopping.sequences, plain_greedy(target, ids, 80))
    assert torch.equal(stopping.sequences, every.sequences)
    assert len(trees[True]) == len(trees[False])
    for step, (a, b) in enumerate(zip(trees[True], trees[False])):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {step}"
    assert stopping.stats.draft_forwards < every.stats.draft_forwards


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_grow_min_prob_drafts_deep_where_the_draft_is_sure_and_stays_lossless(arch, monkeypatch):
    """With ``grow_min_prob`` a further level is drafted only while some frontier node's cumulative draft probability
    reaches it: the trees keep every node of the levels they have (``total_tokens`` where the pool allows), their
    depth varies from step to step up to ``depth``, there are fewer draft forwards than with every level drafted, and
    the output is plain greedy, also in a left-padded batch."""
    target = make_tiny_target(arch)
    draft = copy_draft(target)
    with torch.no_grad():  # a sharp copy: sure on some steps, unsure on others
        draft.lm_head.weight.mul_(20)
    depths, levels = [], []
    grow, can_grow = Drafter.grow, Drafter.can_grow

    def recording(self, depth, score, token, *args):
        levels.append(1)
        out = grow(self, depth, score, token, *args)
        depths.append(int(out[2].max()))
        return out

    def counting(self, f_score):
        ok = can_grow(self, f_score)
        levels[-1] += int(ok)
        return ok

    monkeypatch.setattr(Drafter, "grow", recording)
    monkeypatch.setattr(Drafter, "can_grow", counting)
    ids = prompt(seed=7)
    ref = plain_greedy(target, ids, 80)
    shape = dict(depth=6, tree_top_k=4, total_tokens=8, lookup_tokens=0, min_node_prob=0.0)
    every = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], grow_min_prob=0.0, **shape)
    every_levels = list(levels)
    assert max(every_levels) == 6  # (fewer near the end, where fewer tokens are left to draft)
    depths.clear(), levels.clear()
    grown = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], grow_min_prob=0.3, **shape)
    assert torch.equal(every.sequences, ref) and torch.equal(grown.sequences, ref)
    assert grown.stats.tree["grow_min_prob"] == 0.3
    assert min(levels) < 6 and max(levels) > 2  # shallow on some steps, deep on others
    assert sum(levels) / len(levels) < sum(every_levels) / len(every_levels)
    assert all(d <= lv for d, lv in zip(depths, levels))
    assert grown.stats.draft_forwards < every.stats.draft_forwards
    prompts = [prompt(n, seed=s)[0] for n, s in ((5, 3), (12, 4))]
    bids, mask = left_padded(prompts)
    out = generate(target, draft, bids, attention_mask=mask, max_new_tokens=40, eos_token_id=[], grow_min_prob=0.3, **shape)
    for i, p in enumerate(prompts):
        assert torch.equal(out.sequences[i, 12:], plain_greedy(target, p[None], 40)[0, len(p) :]), f"row {i}"


def test_levels_no_node_of_the_tree_could_reach_are_not_drafted():
    """A node at depth d needs its d - 1 ancestors in the tree, so a tree of total_tokens nodes never uses a level past
    total_tokens: depth 6 with 3 nodes drafts what depth 3 does, with the same draft forwards and the same output."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    ids = prompt(seed=5)
    shape = dict(tree_top_k=3, total_tokens=3, lookup_tokens=0, min_node_prob=0.0, grow_min_prob=0.0)
    capped = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], depth=6, **shape)
    shallow = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], depth=3, **shape)
    assert torch.equal(capped.sequences, plain_greedy(target, ids, 40))
    assert torch.equal(capped.sequences, shallow.sequences)
    assert capped.stats.draft_forwards == shallow.stats.draft_forwards
    assert capped.stats.accepted_per_step == shallow.stats.accepted_per_step


def test_prompt_lookup_proposes_what_followed_the_latest_longest_suffix():
    tokens = [0, 0, 5, 6, 7, 8, 5, 6, 9, 1, 5, 6]  # two left-padding slots
    look = _PromptLookup(tokens, start=2, share=COPY_ALL)
    assert look.propose(3) == [9, 1, 5]  # "5 6" last seen before 9 (not before 7)
    tokens += [7]
    assert look.propose(2) == [8, 5]  # "5 6 7" (3-gram) beats "6 7" and "7"
    tokens += [4]
    assert look.propose(4) == []  # 4 never seen before
    tokens += [8, 5]
    assert look.propose(11) == [6, 9, 1, 5, 6, 7, 4, 8, 5, 6, 9]  # "8 5", then on from the copy itself
    assert _PromptLookup([0, 0, 3], start=2, share=COPY_ALL).propose(2) == []  # the padding is not text
    assert _PromptLookup([0, 3, 0, 3], start=1, share=COPY_ALL).propose(2) == [0, 3]
    assert _PromptLookup([1, 2, 2, 2, 2], start=0).propose(4) == [2, 2, 2, 2]  # a loop of period 1
    assert _PromptLookup([1, 2, 3, 1, 2, 3, 1], start=0, share=COPY_ALL).propose(5) == [2, 3, 1, 2, 3]  # period 3


def test_prompt_lookup_proposes_fewer_tokens_after_a_shorter_match():
    """LOOKUP_SHARE (3-token match: all 20, 2-token: 6, 1-token: 3, at least 1), on one text."""
    text = list(range(100, 130))  # 30 distinct tokens
    assert LOOKUP_SHARE == {3: 1.0, 2: 0.3, 1: 0.15}
    assert _PromptLookup(text + [100, 101, 102], start=0).propose(20) == text[3:23]
    assert _PromptLookup(text + [7, 100, 101], start=0).propose(20) == text[2:8]
    assert _PromptLookup(text + [7, 100], start=0).propose(20) == text[1:4]
    assert _PromptLookup(text + [7, 100], start=0).propose(2) == text[1:2]  # rounded, at least one
    assert _PromptLookup(text + [7, 8], start=0).propose(20) == []


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text"])
def test_greedy_with_lookup_branch_equals_plain_generate(arch):
    """Random targets repeat themselves: the lookup branch is accepted often, next to an untrained draft (which
    is almost never) and next to the copy draft (whose tree holds the same tokens: both branches compete)."""
    target = make_tiny_target(arch)
    ids = prompt(seed=2)
    ref = plain_greedy(target, ids, 300)
    shallow = {"depth": 1, "tree_top_k": 4, "total_tokens": 4}
    plain_tree = generate(target, random_draft(target), ids, max_new_tokens=300, eos_token_id=[], lookup_tokens=0, **shallow)
    out = generate(target, random_draft(target), ids, max_new_tokens=300, eos_token_id=[], lookup_tokens=6, **shallow)
    assert torch.equal(plain_tree.sequences, ref) and torch.equal(out.sequences, ref)
    assert out.stats.lookup_accepted > 30 and out.stats.target_forwards < plain_tree.stats.target_forwards
    assert max(out.stats.accepted_per_step) > shallow["depth"] + 1  # the branch is longer than the tree is deep
    both = generate(
        target,
        copy_draft(target),
        ids,
        max_new_tokens=300,
        eos_token_id=[],
        lookup_tokens=8,
        depth=3,
        tree_top_k=4,
        total_tokens=8,
        min_node_prob=0.0,
    )
    assert torch.equal(both.sequences, ref)


def test_lookup_branch_in_a_left_padded_batch_with_eos():
    target = make_tiny_target("llama")
    draft = random_draft(target)
    prompts = [prompt(n, seed=s)[0] for n, s in ((5, 3), (12, 4), (9, 5))]
    alone0 = plain_greedy(target, prompts[0][None], 80)
    eos = int(alone0[0, 5 + 20])
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=80, eos_token_id=eos, lookup_tokens=5, **TREE)
    for i, p in enumerate(prompts):
        alone = plain_greedy(target, p[None], 80, eos=eos)[0, len(p) :]
        assert torch.equal(out.sequences[i, L : L + len(alone)], alone), f"row {i}"
    assert out.stats.lookup_accepted > 0


@pytest.mark.parametrize("processor", [{"repetition_penalty": 1.1}, {"suppress_tokens": [7, 9]}])
def test_lookup_branch_with_logits_processors(processor):
    """Repetition penalty reads the history: the acceptance walk runs over the tree and the branch. Suppressed
    tokens do not: one pass over every slot's scores, the branch's slots included."""
    target = make_tiny_target("qwen2")
    ids = prompt(seed=6)
    kwargs = {"max_new_tokens": 64, "do_sample": False, "eos_token_id": None, "pad_token_id": 0, **processor}
    ref = target.generate(ids, **kwargs)
    out = target.generate(
        ids,
        custom_generate=tree_generate,
        draft=random_draft(target),
        lookup_tokens=6,
        return_dict_in_generate=True,
        **TREE,
        **kwargs,
    )
    assert torch.equal(out.sequences, ref) and out.stats.lookup_accepted > 0


def test_max_new_tokens_zero_and_one():
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    ids = prompt(seed=5)
    assert torch.equal(generate(target, draft, ids, max_new_tokens=0).sequences, ids)
    out = generate(target, draft, ids, max_new_tokens=1, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(target, ids, 1))
    assert out.stats.target_forwards == 1 and out.stats.draft_forwards == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])  # gemma3: sliding window of 64 < 512 tokens
def test_greedy_long_generation(arch, monkeypatch):
    if arch == "gemma3_text":  # the logits of every tree slot (as on GPUs), not only of those with children
        monkeypatch.setattr(verification, "LOGITS_SUBSET_DEVICES", ())
    target = make_tiny_target(arch)
    ids = prompt(seed=2)
    ref = plain_greedy(target, ids, 520)
    out = generate(target, copy_draft(target), ids, max_new_tokens=520, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_acceptance_length > 1.3
    # an untrained draft: nearly every step rejects the whole tree
    out = generate(
        target,
        random_draft(target),
        ids,
        max_new_tokens=520,
        eos_token_id=[],
        depth=3,
        tree_top_k=3,
        total_tokens=8,
        min_node_prob=0.0,
    )
    assert torch.equal(out.sequences, ref)


def test_greedy_eos_inside_an_accepted_block():
    target = make_tiny_target("gemma2")
    draft = copy_draft(target)
    ids = prompt(seed=1)
    blocks = []
    generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], on_step=lambda t, d: blocks.append((t[0], d[0])), **TREE)
    # a token in the middle of a block of accepted draft tokens that did not occur before: make it the EOS
    seen, eos, pos = set(), None, 0
    for tokens, from_draft in blocks:
        for j, tok in enumerate(tokens):
            if eos is None and j < from_draft and j < len(tokens) - 1 and tok not in seen:
                eos, eos_pos = tok, pos + j
            seen.add(tok)
        pos += len(tokens)
    assert eos is not None, "the copy draft should have accepted blocks"
    ref = plain_greedy(target, ids, 80, eos=eos)
    out = generate(target, draft, ids, max_new_tokens=80, eos_token_id=eos, **TREE)
    assert torch.equal(out.sequences, ref)
    assert out.sequences.shape[1] == ids.shape[1] + eos_pos + 1 and out.sequences[0, -1] == eos


def test_reduced_draft_vocabulary_maps_draft_ids_to_target_ids():
    """A copy draft over 64 target tokens in shuffled order (``d2t``): proposals must land on the right target
    ids, or nothing would be accepted."""
    target = make_tiny_target("llama")
    ids = prompt(seed=2)
    ref = plain_greedy(target, ids, 200)
    used = torch.unique(ref[0, ids.shape[1] :])
    others = torch.tensor([i for i in range(256) if i not in set(used.tolist())])
    vocab = torch.cat([used, others[: 64 - len(used)]])[torch.randperm(64, generator=torch.Generator().manual_seed(0))]
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    H = target.config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * H :] = torch.eye(H)
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.set_vocab_mapping(vocab)
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[vocab])
    out = generate(target, draft.eval(), ids, max_new_tokens=200, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_acceptance_length > 1.5


def test_bfloat16_runs():
    """bf16: a verification and a one-token forward round differently, so equality with plain greedy is not
    guaranteed; check that it runs and agrees on most tokens."""
    target = make_tiny_target("qwen2", dtype=torch.bfloat16)
    draft = copy_draft(target).to(torch.bfloat16)
    ids = prompt(seed=3)
    ref = plain_greedy(target, ids, 40)
    out = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], **TREE)
    assert out.sequences.shape == ref.shape
    assert (out.sequences == ref).float().mean() > 0.5


def test_batch_left_padding_rows_equal_their_batch_one_output():
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    prompts = [prompt(n, seed=s)[0] for n, s in ((5, 3), (12, 4), (9, 5))]
    # EOS = a token that row 0 produces early: that row finishes first, the others run to max_new_tokens
    alone0 = plain_greedy(target, prompts[0][None], 60)
    eos = int(alone0[0, 5 + 12])
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=eos, **TREE)
    lengths = []
    for i, p in enumerate(prompts):
        alone = plain_greedy(target, p[None], 60, eos=eos)[0, len(p) :]
        row = out.sequences[i, L:]
        assert torch.equal(row[: len(alone)], alone), f"row {i}"
        assert (row[len(alone) :] == 0).all()  # right padding after the row stopped
        lengths.append(len(alone))
    assert len(set(lengths)) > 1  # rows finished at different steps
    assert sum(lengths) == out.stats.new_tokens


def test_finished_rows_leave_the_cache_without_a_copy_of_it():
    """The last rows move into finished rows' places within the buffer (no new buffer per finished row); any other
    order still selects the right rows."""
    cache = TreeKVCache(num_layers=2, capacity=12)
    kv = [(torch.randn(5, 2, 7, 4), torch.randn(5, 2, 7, 4)) for _ in range(2)]
    cache.load(kv)
    full = cache.buffer.clone()
    ptr = cache.buffer.data_ptr()
    cache.select_rows(torch.tensor([0, 4, 2, 3]))  # row 1 finished; the last row takes its place
    assert cache.buffer.data_ptr() == ptr and cache.buffer.shape[2] == 4
    assert torch.equal(cache.buffer[..., :7, :], full[:, :, [0, 4, 2, 3], :, :7])
    cache.select_rows(torch.tensor([0, 1]))  # the last two finished: nothing moves
    assert cache.buffer.data_ptr() == ptr and torch.equal(cache.buffer[..., :7, :], full[:, :, [0, 4], :, :7])
    cache.select_rows(torch.tensor([1, 0]))  # another order: a copy
    assert torch.equal(cache.buffer[..., :7, :], full[:, :, [4, 0], :, :7])
    k, _ = cache.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), 0)  # the rows decode on
    assert k.shape == (2, 2, 8, 4) and torch.equal(k[:, :, :7], full[0, 0][[4, 0], :, :7])


def test_middle_rows_finishing_first_keep_every_row_equal_to_its_batch_one_output():
    target = make_tiny_target("qwen2")
    draft = copy_draft(target)
    prompts = [prompt(n, seed=s)[0] for n, s in ((7, 11), (5, 12), (9, 13), (6, 14))]
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    eos = int(plain_greedy(target, prompts[1][None], 40)[0, 5 + 9])  # row 1 stops early; rows after it move
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=eos, **TREE)
    lengths = []
    for i, p in enumerate(prompts):
        alone = plain_greedy(target, p[None], 40, eos=eos)[0, len(p) :]
        assert torch.equal(out.sequences[i, L : L + len(alone)], alone), f"row {i}"
        lengths.append(len(alone))
    assert lengths[1] < 40 and len(set(lengths)) > 1


def test_repetition_penalty_through_custom_generate():
    """A history-dependent logits processor (each tree node sees its own prefix)."""
    target = make_tiny_target("qwen2")
    draft = copy_draft(target)
    ids = prompt(seed=6)
    kwargs = {
        "max_new_tokens": 48,
        "do_sample": False,
        "repetition_penalty": 1.3,
        "eos_token_id": None,
        "pad_token_id": 0,
    }
    ref = target.generate(ids, **kwargs)
    out = target.generate(
        ids, custom_generate=tree_generate, draft=draft, depth=4, tree_top_k=4, total_tokens=12, min_node_prob=0.0, **kwargs
    )
    assert torch.equal(out, ref)
    # sampling with it (the acceptance walk applies the processor per row and node): runs, stays in bounds
    kwargs.update(do_sample=True, temperature=0.8, top_k=20)
    out = target.generate(ids.expand(3, -1), custom_generate=tree_generate, draft=draft, **TREE, **kwargs)
    assert out.shape == (3, ids.shape[1] + 48) and int(out.max()) < 256


# ------------------------------------------------------------------------------------------- sampling
def _exact_three_token_distribution(target, ids, processors):
    """p(x1, x2, x3 | ids) of the processed target distribution, by enumerating all prefixes (vocab 16)."""
    V = target.config.vocab_size

    def dist(seqs):
        logits = target(seqs).logits[:, -1].float()
        return torch.softmax(processors(seqs, logits), dim=-1)

    with torch.no_grad():
        p1 = dist(ids)[0]  # (V,)
        s2 = torch.cat([ids.expand(V, -1), torch.arange(V)[:, None]], dim=1)
        p2 = dist(s2)  # (V, V)
        s3 = torch.cat([s2.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], dim=1)
        p3 = dist(s3).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.mark.parametrize(
    "sampling, sparse_limit, drafted",
    [
        ({}, None, "top-k"),
        ({"temperature": 0.7, "top_k": 6, "top_p": 0.9}, None, "top-k"),
        ({"temperature": 0.7, "top_p": 0.9}, 2, "top-k"),
        ({}, None, "sampled"),
        ({"temperature": 0.7, "top_k": 6, "top_p": 0.9}, None, "sampled"),
        ({"temperature": 0.7, "top_p": 0.9}, 2, "sampled"),
        ({"temperature": 0.7, "top_p": 0.9}, None, "sampled-random-draft"),
        ({"temperature": 0.7, "top_p": 0.9}, None, "sampled-fixed-shapes"),
        ({"temperature": 0.7, "top_p": 0.9}, None, "sampled-int8"),
    ],
    ids=[
        "plain",
        "temperature-topk-topp",
        "temperature-topp-scattered",
        "drawn-plain",
        "drawn-temperature-topk-topp",
        "drawn-temperature-topp-scattered",
        "drawn-by-a-random-draft",
        "drawn-in-fixed-shapes",
        "drawn-by-an-int8-draft",
    ],
)
def test_sampling_keeps_the_target_distribution(sampling, sparse_limit, drafted, monkeypatch):
    """8000 rows sample 5 tokens each; the first 3 (the first from the prefill, the next two decided by the
    first tree: accepted draft tokens or the residual) must follow the exact joint distribution. The walk reads a
    top-k / top-p distribution on its support (``nucleus``), or scattered over the vocabulary when it is wide. The
    tree's children are the draft's top-k (one-hot proposals) or drawn from it (``draft_sampling``: recursive
    rejection sampling with its probabilities), also from a random draft, whose q is far from p, and in the fixed-shape
    levels of ``draft_graph`` (their noise drawn outside the levels), and by a draft whose products run in int8
    (``draft_int8``: its q is what it drew from)."""
    if sparse_limit is not None:
        monkeypatch.setattr(acceptance, "SPARSE_LIMIT", sparse_limit)
    target = make_tiny_target("llama", vocab_size=16)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # a peakier random target: the draft's candidates get accepted often
    draft = random_draft(target, seed=3) if drafted == "sampled-random-draft" else copy_draft(target)
    ids = torch.tensor([[3, 7, 11, 5]])
    if sampling:  # logits of every tree slot from the verification forward (the other test: per visited node)
        monkeypatch.setattr(verification, "LOGITS_SUBSET_DEVICES", ())
    processors = LogitsProcessorList()
    if "temperature" in sampling:
        processors.append(TemperatureLogitsWarper(0.7))
        if "top_k" in sampling:
            processors.append(TopKLogitsWarper(6))
        processors.append(TopPLogitsWarper(0.9))
    exact = _exact_three_token_distribution(target, ids, processors)  # (16, 16, 16)

    n = 8000
    accepted = []
    out = generate(
        target,
        draft,
        ids.expand(n, -1),
        max_new_tokens=5,
        do_sample=True,
        eos_token_id=[],
        generator=torch.Generator().manual_seed(0),
        depth=3,
        tree_top_k=4,
        total_tokens=12,
        min_node_prob=0.0,
        on_step=lambda t, d: accepted.append(sum(d)),
        draft_sampling=drafted != "top-k",
        **({"draft_graph": True, "grow_min_prob": 0.0} if drafted == "sampled-fixed-shapes" else {}),
        draft_int8=drafted == "sampled-int8",
        **sampling,
    )
    assert out.stats.tree["draft_sampling"] == (drafted != "top-k")
    if drafted != "sampled-random-draft":
        assert accepted[1] > 0.3 * n  # the first tree accepted draft tokens in many rows (not just residual draws)
    x = out.sequences[:, ids.shape[1] : ids.shape[1] + 3]
    for k in (2, 3):  # the joint of the first two tokens (more power per cell), then of all three
        cells = x[:, 0] * 16 + x[:, 1] if k == 2 else (x[:, 0] * 16 + x[:, 1]) * 16 + x[:, 2]
        counts = torch.bincount(cells, minlength=16**k).double()
        expected = (exact.sum(-1) if k == 2 else exact).flatten().double() * n
        assert counts[expected == 0].sum() == 0  # nothing outside the processed support (top-k / top-p)
        big = expected >= 5  # chi-square on well-populated cells, the rest pooled
        obs = torch.cat([counts[big], counts[~big].sum()[None]])
        exp = torch.cat([expected[big], expected[~big].sum()[None]])
        obs, exp = obs[exp > 0], exp[exp > 0]
        p_value = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue
        assert p_value > 1e-3, (k, p_value)


@pytest.mark.parametrize("on_support", [False, True], ids=["dense", "support"])
def test_recursive_rejection_over_drawn_children_emits_the_target_distribution(on_support):
    """One node, 200,000 rows: three children drawn without replacement from a draft distribution q far from the
    target's p (over a draft vocabulary of 6 of the target's 8 tokens); the accepted child, or the draw from the last
    residual, must follow p (chi-square), on p's support or over the vocabulary; and a child is accepted more often
    than the one-hot rule would (sum min(p, q) against p of the draft's top child)."""
    n, V = 200_000, 8
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.30, 0.25, 0.15, 0.10, 0.08, 0.07, 0.05, 0.0])
    draft_targets = torch.tensor([0, 1, 2, 3, 5, 7])  # draft id -> target id: tokens 4 and 6 are outside
    log_q = torch.tensor([0.05, 0.40, 0.30, 0.05, 0.15, 0.05]).log()
    draft_of = torch.full((V,), -1)
    draft_of[draft_targets] = torch.arange(6)
    u = torch.rand(n, 6, generator=gen)
    drawn = (log_q - torch.log(-torch.log(u))).topk(3, dim=-1).indices  # (n, 3) without replacement
    tok = torch.cat([torch.zeros(n, 1, dtype=torch.long), draft_targets[drawn]], dim=1)  # slot 0 the root
    cand = torch.tensor([False, True, True, True]).expand(n, 4)
    proposal = verification.Proposal(log_q.expand(n, 1, 6), torch.zeros(n, 4, dtype=torch.long), draft_of)
    support = probs = None
    if on_support:  # p's support, largest first (the nucleus' form), padded with a zero-probability token
        support = torch.tensor([0, 1, 2, 3, 4, 5, 6, 6]).expand(n, 8)
        probs = p.expand(n, 8)
    accept, residual = acceptance.proposal_level(
        p.expand(n, V) if probs is None else probs, support, cand, tok, torch.zeros(n, dtype=torch.long), proposal, gen
    )
    assert (accept.sum(dim=-1) <= 1).all()
    has = accept.any(dim=-1)
    from_residual = torch.multinomial(residual, 1, generator=gen).squeeze(1)
    if support is not None:
        from_residual = support.gather(1, from_residual[:, None]).squeeze(1)
    out = torch.where(has, tok.gather(1, accept.int().argmax(dim=-1, keepdim=True)).squeeze(1), from_residual)
    counts = torch.bincount(out, minlength=V).double()
    assert counts[p == 0].sum() == 0
    expected = p[p > 0].double() / p.double().sum() * n
    assert chisquare(counts[p > 0].numpy(), expected.numpy()).pvalue > 1e-3
    q = torch.zeros(V).index_copy(0, draft_targets, log_q.exp())
    assert has.double().mean() > torch.minimum(p, q).sum() > p[draft_targets[log_q.argmax()]]


def test_the_lookup_branch_merges_into_the_drafted_tree():
    """A copied token equal to a drafted child is no second candidate: the copy goes on under the drafted node
    (a path accepted through drafted nodes continues along the copied text), and the copied slot is marked."""
    root = torch.tensor([1, 1])
    # drafted: slot 1 = 10 (root's child), slot 2 = 11 (root's child), slot 3 = 20 (under slot 1)
    node_tok = torch.tensor([[10, 11, 20], [10, 11, 20]])
    node_parent = torch.tensor([[0, 0, 1], [0, 0, 1]])
    node_depth = torch.tensor([[1, 1, 2], [1, 1, 2]])
    # row 0 copies 10, 20, 30 (follows the drafted path 10 -> 20, then leaves it); row 1 copies 12, 20, 30
    chain = torch.tensor([[10, 20, 30], [12, 20, 30]])
    tree = verification.Tree.build(root, node_tok, node_parent, node_depth, chain, depth=2)
    assert tree.parent[0].tolist() == [0, 0, 0, 1, 0, 1, 3]  # 30 hangs under the drafted 20 (slot 3)
    assert tree.duplicate[0].tolist() == [False, False, False, False, True, True, False]
    assert tree.parent[1].tolist() == [0, 0, 0, 1, 0, 4, 5]  # 12 is new: its own chain under it
    assert not tree.duplicate[1].any()
    assert tree.level[0].tolist() == [0, 1, 1, 2, 1, 2, 3]
    assert tree.anc[0, 6].nonzero().squeeze(1).tolist() == [0, 1, 3, 6]  # attends to its merged path


@pytest.mark.parametrize("copied", ["target-path", "fixed"])
def test_sampling_with_the_lookup_branch_keeps_the_target_distribution(copied, monkeypatch):
    """Whatever the lookup branch copies, each copied token is one more one-hot candidate at its node: the first
    3 sampled tokens keep the exact joint distribution. ``target-path``: the copy is the target's own most likely
    continuation, so it mostly repeats the drafted children and is merged into them; ``fixed``: a copy unrelated
    to the text."""
    target = make_tiny_target("llama", vocab_size=16)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    draft = copy_draft(target)
    ids = torch.tensor([[3, 7, 11, 5]])
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])
    exact = _exact_three_token_distribution(target, ids, processors)  # (16, 16, 16)

    def propose(self, m):
        if copied == "fixed":
            return [5, 9, 2, 5]
        x1 = self.tokens[-1]  # the first tree's root: the prefill's sample
        x2 = int(exact[x1].sum(-1).argmax())
        return [x2, int(exact[x1, x2].argmax()), 4]

    monkeypatch.setattr(_PromptLookup, "propose", propose)
    duplicates = []
    build = verification.Tree.build.__func__

    def spy(cls, *args):
        tree = build(cls, *args)
        duplicates.append(int(tree.duplicate.sum()) if tree.duplicate is not None else 0)
        return tree

    monkeypatch.setattr(verification.Tree, "build", classmethod(spy))
    n = 8000
    out = generate(
        target,
        draft,
        ids.expand(n, -1),
        max_new_tokens=3,
        do_sample=True,
        eos_token_id=[],
        temperature=0.7,
        top_p=0.9,
        generator=torch.Generator().manual_seed(1),
        depth=2,
        tree_top_k=3,
        total_tokens=6,
        min_node_prob=0.0,
        lookup_tokens=4,
        adaptive=False,
    )
    assert out.stats.lookup_accepted > 100  # copied tokens were accepted (not only residual draws)
    if copied == "target-path":
        assert duplicates[0] > 0.5 * n  # most copies repeat a drafted child: merged, not proposed twice
    x = out.sequences[:, ids.shape[1] : ids.shape[1] + 3]
    for k in (2, 3):
        cells = x[:, 0] * 16 + x[:, 1] if k == 2 else (x[:, 0] * 16 + x[:, 1]) * 16 + x[:, 2]
        counts = torch.bincount(cells, minlength=16**k).double()
        expected = (exact.sum(-1) if k == 2 else exact).flatten().double() * n
        assert counts[expected == 0].sum() == 0
        big = expected >= 5
        obs = torch.cat([counts[big], counts[~big].sum()[None]])
        exp = torch.cat([expected[big], expected[~big].sum()[None]])
        obs, exp = obs[exp > 0], exp[exp > 0]
        p_value = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue
        assert p_value > 1e-3, (k, p_value)


def test_sampling_computes_the_head_once_per_step_not_once_per_level(monkeypatch):
    """With score-only processors the walk reads the logits and processed scores of every slot with children from
    one head product and one processor call per step; only a walk that stops at a leaf needs that leaf's logits."""
    target = make_tiny_target("llama", vocab_size=16)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # peaky: walks go deep
    draft = copy_draft(target)
    calls = []
    real = verification.Verifier.lm_head
    monkeypatch.setattr(verification.Verifier, "lm_head", lambda self, h: calls.append(h.shape) or real(self, h))
    out = generate(
        target,
        draft,
        torch.tensor([[3, 7, 11, 5]]),
        max_new_tokens=40,
        do_sample=True,
        eos_token_id=[],
        temperature=0.7,
        top_p=0.9,
        generator=torch.Generator().manual_seed(0),
        depth=3,
        tree_top_k=2,
        total_tokens=4,
        min_node_prob=0.0,
    )
    st = out.stats
    assert st.mean_acceptance_length > 1.2  # the walks did pass several levels
    # a level-by-level walk: the prefill, the verification's last slot, and one per level visited (accepted + 1)
    per_level = 1 + st.steps + (st.new_tokens - 1)
    assert len(calls) <= 2 * st.steps + 1 < per_level  # the prefill, one per step, a leaf now and then


# ------------------------------------------------------------------------------------------- transformers entry points
def test_custom_generate_callable():
    target = make_tiny_target("qwen3")
    draft = copy_draft(target)
    ids = prompt(seed=7)
    ref = plain_greedy(target, ids, 40)
    out = target.generate(
        ids,
        custom_generate=tree_generate,
        draft=draft,
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        **TREE,
    )
    assert torch.equal(out, ref)
    out = target.generate(
        ids,
        custom_generate=tree_generate,
        draft=draft,
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
    )
    assert isinstance(out, TreeDecodingOutput) and torch.equal(out.sequences, ref)


def test_custom_generate_from_a_saved_draft_folder(tmp_path):
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    folder = tmp_path / "draft-repo"
    draft.save_pretrained(folder)  # writes custom_generate/: the Hub entry as generate.py, the package's modules
    files = custom_generate_files()
    assert files["custom_generate/generate.py"].name == "hub_entry.py"
    assert {"custom_generate/lean_forward.py", "custom_generate/api.py"} <= set(files)
    for name, source in files.items():
        assert (folder / name).read_text() == source.read_text(), name
    assert write_custom_generate(folder) == folder / "custom_generate" / "generate.py"  # idempotent
    for name, source in files.items():
        assert (folder / name).read_text() == source.read_text(), name
    ids = prompt(seed=8)
    ref = plain_greedy(target, ids, 40)
    out = target.generate(
        ids,
        custom_generate=str(folder),
        trust_remote_code=True,
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert torch.equal(out, ref)
    # an explicit draft overrides the one in the repo: the random draft gives the same tokens, fewer accepted
    # (without the lookup branch, which would accept this target's loops whatever the draft)
    seen = []
    out = target.generate(
        ids,
        custom_generate=str(folder),
        trust_remote_code=True,
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        draft=random_draft(target),
        lookup_tokens=0,
        on_step=lambda t, d: seen.append(d[0]),
    )
    assert torch.equal(out, ref) and sum(seen) < 10
    streamer = CountingStreamer()  # transformers would drop a streamer for a callable; the repo form keeps it
    out = target.generate(
        ids,
        custom_generate=str(folder),
        trust_remote_code=True,
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        streamer=streamer,
    )
    assert torch.equal(out, ref) and streamer.ends == 1
    assert list(itertools.chain(*streamer.puts[1:])) == ref[0, ids.shape[1] :].tolist()


_WITHOUT_PACKAGE = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "eagle3_hub" or name.startswith("eagle3_hub."):
            raise ImportError("eagle3_hub is not installed here")
sys.meta_path.insert(0, Block())
import torch
from transformers import AutoModelForCausalLM
target = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids = torch.tensor(json.loads(sys.argv[3]))
out = target.generate(ids, custom_generate=sys.argv[2], trust_remote_code=True, max_new_tokens=30, do_sample=False,
                      eos_token_id=None, pad_token_id=0, return_dict_in_generate=True)
print(json.dumps({"sequences": out.sequences.tolist(), "lean_forward": out.stats.lean_forward}))
"""


def test_custom_generate_runs_without_the_package(tmp_path):
    """A draft folder (weights, modeling code, custom_generate/) is all transformers needs."""
    target = make_tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    copy_draft(target).save_pretrained(tmp_path / "draft")  # with custom_generate/generate.py
    ids = prompt(seed=13)
    ref = plain_greedy(target, ids, 30)
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_PACKAGE,
            str(tmp_path / "target"),
            str(tmp_path / "draft"),
            json.dumps(ids.tolist()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["sequences"] == ref.tolist()
    assert got["lean_forward"]  # the copy of lean_forward.py next to generate.py was imported


# ------------------------------------------------------------------------------------------- streaming, stop strings
# tiny targets with SmolLM2's tokenizer (smollm2_tokenizer, conftest.py): real text, no real weights
def _tiny_with_vocab(tokenizer, arch="llama"):
    return make_tiny_target(
        arch,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def test_text_iterator_streamer_ends_cleanly(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    target = _tiny_with_vocab(tokenizer)
    draft = copy_draft(target)
    ids = tokenizer("The quick brown fox", return_tensors="pt")["input_ids"]
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            out=generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], streamer=streamer, **TREE)
        )
    )
    thread.start()
    text = "".join(streamer)  # ends only when the streamer's end() was called
    thread.join(timeout=60)
    assert not thread.is_alive()
    new = result["out"].sequences[0, ids.shape[1] :]
    assert text == tokenizer.decode(new)
    assert torch.equal(result["out"].sequences, plain_greedy(target, ids, 40))


class CountingStreamer(BaseStreamer):
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ends += 1


def test_streamer_gets_prompt_then_blocks_and_one_end_also_on_error():
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    ids = prompt(seed=9)
    streamer = CountingStreamer()
    out = generate(target, draft, ids, max_new_tokens=30, eos_token_id=[], streamer=streamer, **TREE)
    assert streamer.ends == 1
    assert streamer.puts[0] == ids[0].tolist()
    assert list(itertools.chain(*streamer.puts[1:])) == out.sequences[0, ids.shape[1] :].tolist()
    assert len(streamer.puts) - 1 < 30  # blocks of several tokens

    def fail(tokens, from_draft):
        raise RuntimeError("consumer went away")

    streamer = CountingStreamer()
    with pytest.raises(RuntimeError, match="consumer went away"):
        generate(target, draft, ids, max_new_tokens=30, streamer=streamer, on_step=fail, **TREE)
    assert streamer.ends == 1


def test_stop_strings_match_plain_generate(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    target = _tiny_with_vocab(tokenizer, "qwen2")
    draft = copy_draft(target)
    ids = tokenizer("Once upon a time", return_tensors="pt")["input_ids"]
    free = plain_greedy(target, ids, 60)
    text = tokenizer.decode(free[0, ids.shape[1] :])
    stop = text[len(text) // 3 : len(text) // 3 + 3]  # a piece from the middle of the continuation
    assert stop.strip()
    ref = plain_greedy(target, ids, 60, stop_strings=[stop], tokenizer=tokenizer)
    assert ref.shape[1] < free.shape[1]
    out = generate(target, draft, ids, max_new_tokens=60, eos_token_id=[], stop_strings=[stop], tokenizer=tokenizer, **TREE)
    assert torch.equal(out.sequences, ref)


def test_on_step_and_stats_add_up():
    target = make_tiny_target("mistral")
    draft = copy_draft(target)
    ids = prompt(seed=10)
    steps = []
    out = generate(target, draft, ids, max_new_tokens=50, eos_token_id=[], on_step=lambda t, d: steps.append((t, d)), **TREE)
    st = out.stats
    assert sum(len(t[0]) for t, _ in steps) == st.new_tokens == 50
    assert steps[0][0][0] == out.sequences[0, ids.shape[1] : ids.shape[1] + 1].tolist()
    assert all(0 <= d[0] <= len(t[0]) for t, d in steps) and sum(d[0] for _, d in steps) > 0
    assert st.target_forwards == len(steps) == st.steps + 1
    assert st.accepted_per_step == [len(t[0]) for t, _ in steps]
    assert st.mean_acceptance_length == pytest.approx(50 / st.target_forwards)
    assert st.draft_time_s > 0 and st.verify_time_s > 0 and st.total_time_s >= st.draft_time_s + st.verify_time_s
    assert "tok/s" in str(st)


def test_bound_draft_keeps_its_feature_hooks_without_capturing():
    target = make_tiny_target("llama")
    draft = copy_draft(target).bind(target)
    ids = prompt(seed=11)
    out = generate(target, draft, ids, max_new_tokens=20, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, plain_greedy(target, ids, 20))
    assert draft._hook_handles and len(draft._hook_handles) == 3


# ------------------------------------------------------------------------------------------- errors
def test_clear_errors():
    target = make_tiny_target("llama", max_position_embeddings=32)
    draft = copy_draft(target)
    ids = prompt(seed=12)
    other = make_tiny_target("llama", hidden_size=32, intermediate_size=64)
    with pytest.raises(ValueError, match="does not fit the target"):
        generate(target, copy_draft(other), ids, max_new_tokens=4)
    with pytest.raises(ValueError, match="context is 32 positions"):
        generate(target, draft, prompt(40, seed=1), max_new_tokens=4)
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        generate(target, draft, ids, max_new_tokens=4, depth=0)
    with pytest.raises(ValueError, match="total_tokens=100 is larger than the 12 candidates"):
        generate(target, draft, ids, max_new_tokens=4, depth=2, tree_top_k=3, total_tokens=100)
    with pytest.raises(ValueError, match="exceeds the draft vocabulary"):
        generate(target, random_draft(target, draft_vocab_size=8), ids, max_new_tokens=4, tree_top_k=9)
    with pytest.raises(ValueError, match="left padding"):
        generate(target, draft, ids, attention_mask=torch.tensor([[1] * 11 + [0]]), max_new_tokens=4)
    with pytest.raises(ValueError, match="needs an EAGLE-3 draft"):
        target.generate(ids, custom_generate=tree_generate, max_new_tokens=4)
    with pytest.raises(ValueError, match="stop_strings need the target's tokenizer"):
        generate(target, draft, ids, max_new_tokens=4, stop_strings=["x"])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        generate(target, draft, ids, max_new_tokens=4, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="lookup_tokens must be a non-negative integer"):
        generate(target, draft, ids, max_new_tokens=4, lookup_tokens=-1)
    assert generate(target, draft, ids, max_new_tokens=4, do_sample=True).stats.tree["lookup_tokens"] == 0
    for name in ("min_node_prob", "grow_min_prob"):  # the two thresholds: probabilities, and not with draft_graph
        for bad in (-0.1, 1.0, True, "0.1"):
            with pytest.raises(ValueError, match=f"{name} must be a probability in"):
                generate(target, draft, ids, max_new_tokens=4, **{name: bad})
        with pytest.raises(ValueError, match=f"set {name}=0 or draft_graph=False"):
            generate(target, draft, ids, max_new_tokens=4, draft_graph=True, **{name: 0.1})
        assert generate(target, draft, ids, max_new_tokens=4, draft_graph=True).stats.tree[name] == 0.0
    # drawn children: on when sampling unless draft_graph (there when asked) or the lookup branch (refused together),
    # off when greedy
    tree = {k: generate(target, draft, ids, max_new_tokens=4, do_sample=v).stats.tree for k, v in (("s", True), ("g", False))}
    assert tree["s"]["draft_sampling"] and not tree["g"]["draft_sampling"]
    for kwargs in ({"draft_graph": True, "min_node_prob": 0.0, "grow_min_prob": 0.0}, {"lookup_tokens": 4}):
        assert not generate(target, draft, ids, max_new_tokens=4, do_sample=True, **kwargs).stats.tree["draft_sampling"]
    graph = {"draft_graph": True, "min_node_prob": 0.0, "grow_min_prob": 0.0}
    assert generate(target, draft, ids, max_new_tokens=4, do_sample=True, draft_sampling=True, **graph).stats.tree[
        "draft_sampling"
    ]
    with pytest.raises(ValueError, match="set lookup_tokens=0 or draft_sampling=False"):
        generate(target, draft, ids, max_new_tokens=4, do_sample=True, draft_sampling=True, lookup_tokens=4)
    with pytest.raises(ValueError, match="draft_sampling must be True, False or None"):
        generate(target, draft, ids, max_new_tokens=4, draft_sampling="yes")


def test_drawn_children_form_an_ancestor_closed_tree_of_distinct_siblings():
    """Sampled trees: parents precede their children, siblings are distinct tokens, and every parent has the draft
    distribution its children were drawn from."""
    target = make_tiny_target("llama")
    draft = random_draft(target, seed=5)
    ids = prompt(seed=4)
    trees = []
    original = verification.Tree.build.__func__

    def build(cls, *args, **kwargs):
        tree = original(cls, *args, **kwargs)
        trees.append(tree)
        return tree

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verification.Tree, "build", classmethod(build))
        generate(target, draft, ids.expand(3, -1), max_new_tokens=24, do_sample=True, temperature=1.0, **TREE)
    assert trees and all(t.proposal is not None for t in trees)
    for t in trees:
        S = t.tok.shape[1]
        for r in range(t.tok.shape[0]):
            parents = t.parent[r, 1:].tolist()
            assert all(p < i + 1 for i, p in enumerate(parents))  # parents precede their children
            for p in set(parents):
                kids = [t.tok[r, i + 1].item() for i, q in enumerate(parents) if q == p]
                assert len(kids) == len(set(kids))
                row = t.proposal.slot_rows[r, p]
                assert row >= 0  # an expanded node has its distribution, which gave each of its children a chance
                assert all(t.proposal.log_q[r, row, t.proposal.draft_of[c]] > -float("inf") for c in kids)
            assert t.proposal.slot_rows.shape[1] == S


def test_a_drawn_childs_score_says_nothing_of_its_token():
    """What keeps sampled trees lossless: the score that decides whether the tree keeps a node's j-th drawn child is
    the j-th largest draft log-probability there, whichever token was drawn; the draws are without replacement, the
    first distributed as the draft's distribution at the drawing temperature (chi-square)."""
    from types import SimpleNamespace

    n, k = 200_000, 3
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0]).expand(n, 6)
    parent = torch.full((n,), -0.7)
    me = SimpleNamespace(top_k=k, sampling=(0.8, torch.Generator().manual_seed(0)), log_probs=Drafter.log_probs)
    score, ids, logq = Drafter.children(me, parent, logits)
    top = Drafter.log_probs(logits[:1]).topk(k).values[0]
    assert torch.equal(score, (parent[:, None] + top).expand(n, k))  # the same for every row, whatever it drew
    assert (ids[:, 0] != ids[:, 1]).all() and (ids[:, 1] != ids[:, 2]).all() and (ids[:, 0] != ids[:, 2]).all()
    assert torch.allclose(logq[0], torch.log_softmax(logits[0] / 0.8, dim=-1))
    counts = torch.bincount(ids[:, 0], minlength=6).double()
    q = logq[0].double().exp()
    assert chisquare(counts.numpy(), (q / q.sum() * n).numpy()).pvalue > 1e-3


def test_attention_kernels_leave_out_cudnn_on_cuda_only():
    """On CUDA, tree decoding (and the benchmark, for every method) runs SDPA without cuDNN's kernel, whose per-shape
    per-shape plans cost time at every decoding step; the flags come back afterwards; elsewhere nothing changes."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_kernels(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_tree_defaults_per_device():
    assert set(TREE_DEFAULTS) >= {"cpu", "cuda"}
    assert tree_defaults("cpu") == TREE_DEFAULTS["cpu"]
    assert tree_defaults("cuda:0") == TREE_DEFAULTS["cuda"]
    assert tree_defaults("cpu", torch.bfloat16) == TREE_DEFAULTS["cpu-bfloat16"] != TREE_DEFAULTS["cpu"]
    assert tree_defaults("cpu", torch.float32) == TREE_DEFAULTS["cpu"]
    assert tree_defaults("cuda", torch.bfloat16) == TREE_DEFAULTS["cuda"]
    # sampling has its own row where one was measured, else the greedy one
    assert tree_defaults("cpu", torch.bfloat16, do_sample=True) == TREE_DEFAULTS["cpu-bfloat16-sampling"]
    assert tree_defaults("cpu", torch.float32, do_sample=True) == TREE_DEFAULTS["cpu"]
    sampled = TreeConfig().resolve(torch.device("cpu"), torch.bfloat16, do_sample=True, draft_vocab=256)
    assert (sampled.depth, sampled.tree_top_k, sampled.total_tokens, sampled.lookup_tokens) == (3, 8, 10, 0)
    # batches from 4 rows on take smaller trees on a bf16 CPU; a batch of 2 keeps the batch-1 tree
    assert tree_defaults("cpu", torch.bfloat16, batch=2) == TREE_DEFAULTS["cpu-bfloat16"]
    four = TreeConfig().resolve(torch.device("cpu"), torch.bfloat16, do_sample=False, draft_vocab=256, batch=8)
    assert (four.depth, four.tree_top_k, four.total_tokens, four.lookup_tokens) == (2, 8, 4, 20)
    assert tree_defaults("cpu", torch.float32, batch=8) == TREE_DEFAULTS["cpu"]
    for shape in TREE_DEFAULTS.values():
        assert shape["total_tokens"] <= shape["top_k"] + (shape["depth"] - 1) * shape["top_k"] ** 2
        assert shape["lookup_tokens"] >= 0
        assert 0 <= shape["min_node_prob"] < 1
        assert 0 <= shape["grow_min_prob"] < 1


def test_a_bfloat16_cpu_target_gets_the_bfloat16_tree():
    target = make_tiny_target("llama").to(torch.bfloat16)
    draft = Eagle3DraftModel.from_target(target).eval().to(torch.bfloat16)
    out = generate(target, draft, torch.tensor([[5, 17, 33, 9]]), max_new_tokens=8)
    want = TREE_DEFAULTS["cpu-bfloat16"]
    keys = ("depth", "top_k", "total_tokens", "min_node_prob", "grow_min_prob")
    assert {k: out.stats.tree[k] for k in keys} == {k: want[k] for k in keys}
    assert out.sequences.shape == (1, 12)


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_cuda_greedy_batch_and_sampling(arch):
    """On CUDA: float32 greedy equals plain greedy (batch 1 and a left-padded batch, row by row); bfloat16
    runs and mostly agrees; sampling runs with CUDA generators."""
    target = make_tiny_target(arch).to("cuda")
    draft = copy_draft(target).to("cuda")
    ids = prompt(seed=1).cuda()
    ref = plain_greedy(target, ids, 80)
    out = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, ref)
    assert out.stats.target_forwards < 80 and out.stats.verify_time_s > 0  # timed with CUDA events
    prompts = [prompt(n, seed=s)[0].cuda() for n, s in ((5, 3), (12, 4))]
    batch = torch.zeros(2, 12, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(batch)
    for i, p in enumerate(prompts):
        batch[i, 12 - len(p) :], mask[i, 12 - len(p) :] = p, 1
    out = generate(target, draft, batch, attention_mask=mask, max_new_tokens=40, eos_token_id=[], **TREE)
    for i, p in enumerate(prompts):
        assert torch.equal(out.sequences[i, 12:], plain_greedy(target, p[None], 40)[0, len(p) :]), f"row {i}"
    target16, draft16 = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    ref = plain_greedy(target16, ids, 40)
    out = generate(target16, draft16, ids, max_new_tokens=40, eos_token_id=[], **TREE)
    assert (out.sequences == ref).float().mean() > 0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = generate(
        target16,
        draft16,
        ids,
        max_new_tokens=40,
        eos_token_id=[],
        do_sample=True,
        temperature=0.8,
        top_p=0.9,
        generator=gen,
        **TREE,
    )
    assert out.sequences.shape == (1, ids.shape[1] + 40)
    # drawn children inside the draft's CUDA graph: the noise is the graph's input
    kw = {"max_new_tokens": 40, "eos_token_id": [], "do_sample": True, "temperature": 0.8, "top_p": 0.9, "draft_sampling": True}
    out = generate(target16, draft16, ids, generator=gen, **kw, **TREE)
    assert out.sequences.shape == (1, ids.shape[1] + 40) and out.stats.tree["draft_sampling"]


# ------------------------------------------------------------------------------------------- the real target
def test_smollm2_greedy_lossless(smollm2):
    target, tokenizer = smollm2
    draft = random_draft(target, draft_vocab_size=4096)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    ids = chat["input_ids"]
    ref = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=64,
        do_sample=False,
        eos_token_id=[],
        pad_token_id=tokenizer.pad_token_id,
    )
    out = generate(target, draft, ids, max_new_tokens=64, eos_token_id=[], depth=3, tree_top_k=4, total_tokens=8)
    assert torch.equal(out.sequences, ref)


@pytest.mark.slow
def test_smollm2_greedy_lossless_long(smollm2):
    """520 tokens on the real target (slow on a CPU). The copy draft reads the last layer (the target's
    own prediction), so some tree tokens get accepted on this real text too."""
    target, tokenizer = smollm2
    draft = copy_draft(target, aux_layer_ids=[1, 14, target.config.num_hidden_layers - 1])
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a long list of fruits, one per line, numbered."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    ids = chat["input_ids"]
    ref = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=520, do_sample=False, eos_token_id=[], pad_token_id=2
    )
    out = generate(target, draft, ids, max_new_tokens=520, eos_token_id=[], depth=4, tree_top_k=4, total_tokens=8)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_acceptance_length > 1.0


def test_smollm2_reference_draft_is_lossless_and_accepts(smollm2, smollm2_reference_draft):
    """The draft shipped for the embedded target, with the device's default tree: token for token plain greedy
    in float32, and more than one token per target forward."""
    target, tokenizer = smollm2
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "List five fruits that are rich in vitamin C."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    ids = chat["input_ids"]
    ref = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=48,
        do_sample=False,
        eos_token_id=[],
        pad_token_id=tokenizer.pad_token_id,
    )
    out = generate(target, smollm2_reference_draft, ids, max_new_tokens=48, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_acceptance_length > 1.0


def test_cli_generate(tmp_path, smollm2_tokenizer, capsys):
    tokenizer = smollm2_tokenizer
    import argparse

    from eagle3_hub.commands import generate as cli

    target = _tiny_with_vocab(tokenizer)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    copy_draft(target).save_pretrained(tmp_path / "draft")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--prompt",
            "Hello",
            "--target",
            str(tmp_path / "target"),
            "--draft",
            str(tmp_path / "draft"),
            "--max-new-tokens",
            "12",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--stats",
        ]
    )
    rc = cli.run(args)
    assert rc == 0
    captured = capsys.readouterr()
    assert "tok/s" in captured.err and captured.out.strip()
