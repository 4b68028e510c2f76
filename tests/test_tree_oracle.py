"""The target as its own draft (``generate(..., proposer="target")``): the acceptance a perfect draft would reach
with a tree shape and walk. Its output is the target's (greedy: plain greedy's tokens; a batch: each row's own), and
in greedy decoding a chain of its own argmaxes is accepted whole at every step."""

from __future__ import annotations

import pytest
import torch
from tiny_models import left_padded, make_tiny_target

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.generation.tree import generate


def _pair(arch="llama"):
    target = make_tiny_target(arch)
    torch.manual_seed(0)
    return target, Eagle3DraftModel.from_target(target).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_target_as_draft_gives_plain_greedy_and_accepts_the_whole_depth(arch):
    target, draft = _pair(arch)
    ids = torch.randint(3, 200, (1, 10), generator=torch.Generator().manual_seed(1))
    ref = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    depth = 3
    # a chain of the target's own argmaxes: every step accepts the whole depth and the target's token after it
    chain = dict(depth=depth, tree_top_k=1, total_tokens=depth, min_node_prob=0.0, lookup_tokens=0)
    out = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], proposer="target", **chain)
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted_per_step[1:-1] == [depth + 1] * (len(out.stats.accepted_per_step) - 2)
    # a tree: the target's output, and more accepted than a random draft's tree of the same shape
    tree = dict(depth=depth, tree_top_k=2, total_tokens=8, min_node_prob=0.0, lookup_tokens=0)
    oracle = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], proposer="target", **tree)
    drafted = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], **tree)
    assert torch.equal(oracle.sequences, ref) and torch.equal(drafted.sequences, ref)
    assert oracle.stats.mean_acceptance_length > drafted.stats.mean_acceptance_length + 1


def test_the_target_as_draft_decodes_a_left_padded_batch_row_by_row():
    target, draft = _pair()
    prompts = [torch.randint(3, 200, (n,), generator=torch.Generator().manual_seed(n)) for n in (6, 11, 8)]
    ids, mask = left_padded(prompts)
    shape = dict(depth=2, tree_top_k=3, total_tokens=6, lookup_tokens=0)
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[], proposer="target", **shape)
    for r, p in enumerate(prompts):
        ref = target.generate(
            p[None],
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert out.sequences[r, -20:].tolist() == ref[0, -20:].tolist()


def test_the_target_as_draft_samples_with_the_tree_walk():
    """Sampling: the children are the target's most probable tokens under its processed distribution (top-p cuts
    the rest); the walk accepts a child with its target probability, so more than a random draft's top tokens.
    (Children drawn from a draft are another walk: over this flat random target a random draft's draws do better.)"""
    target, draft = _pair()
    ids = torch.randint(3, 200, (1, 10), generator=torch.Generator().manual_seed(2))
    tree = dict(depth=3, tree_top_k=4, total_tokens=10, lookup_tokens=0)
    kw = dict(max_new_tokens=48, eos_token_id=[], do_sample=True, temperature=0.5, top_p=0.9, **tree)
    oracle = generate(target, draft, ids, proposer="target", generator=torch.Generator().manual_seed(0), **kw)
    drafted = generate(target, draft, ids, generator=torch.Generator().manual_seed(0), draft_sampling=False, **kw)
    assert oracle.sequences.shape == (1, 58) and oracle.stats.new_tokens == 48
    assert oracle.stats.mean_acceptance_length > drafted.stats.mean_acceptance_length


def test_an_unknown_proposer_is_named():
    target, draft = _pair()
    with pytest.raises(ValueError, match="proposer must be 'draft' or 'target', got 'oracle'"):
        generate(target, draft, torch.tensor([[5, 6, 7]]), max_new_tokens=4, proposer="oracle")
