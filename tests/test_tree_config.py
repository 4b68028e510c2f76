"""TreeConfig and the plain signatures of the tree decoding entry points."""

from __future__ import annotations

import inspect

import pytest
import torch
from test_tree_decoding import copy_draft, plain_greedy, prompt
from tiny_models import make_tiny_target

import eagle3_hub
from eagle3_hub.generation.tree import TREE_DEFAULTS, TreeConfig, generate, tree_generate


def test_a_config_object_and_keywords_give_the_same_run():
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    ids = prompt(seed=4)
    shape = dict(depth=4, tree_top_k=3, total_tokens=9, lookup_tokens=0, min_node_prob=0.0, grow_min_prob=0.0)
    by_keywords = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], **shape)
    by_config = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[], config=TreeConfig(**shape))
    assert torch.equal(by_config.sequences, plain_greedy(target, ids, 40))
    assert torch.equal(by_config.sequences, by_keywords.sequences)
    assert by_config.stats.accepted_per_step == by_keywords.stats.accepted_per_step
    assert by_config.stats.tree == {
        "depth": 4,
        "top_k": 3,
        "total_tokens": 9,
        "lookup_tokens": 0,
        "min_node_prob": 0.0,
        "grow_min_prob": 0.0,
        "adaptive": False,
        "draft_sampling": False,
        "draft_int8": False,
    }
    # a keyword overrides the config's field; the rest come from the config, then the device defaults
    mixed = generate(target, draft, ids, max_new_tokens=8, config=TreeConfig(depth=2, tree_top_k=3), total_tokens=5)
    assert {k: mixed.stats.tree[k] for k in ("depth", "top_k", "total_tokens")} == {"depth": 2, "top_k": 3, "total_tokens": 5}
    assert mixed.stats.tree["min_node_prob"] == TREE_DEFAULTS["cpu"]["min_node_prob"]
    out = target.generate(
        ids,
        custom_generate=tree_generate,
        draft=draft,
        tree_config=TreeConfig(**shape),
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, by_keywords.sequences) and out.stats.tree == by_config.stats.tree


def test_resolve_fills_the_device_defaults_and_checks():
    cpu = TreeConfig().resolve(torch.device("cpu"), torch.float32, do_sample=False, draft_vocab=256)
    want = TREE_DEFAULTS["cpu"]
    assert (cpu.depth, cpu.tree_top_k, cpu.total_tokens, cpu.lookup_tokens) == (
        want["depth"],
        want["top_k"],
        want["total_tokens"],
        want["lookup_tokens"],
    )
    assert cpu.draft_graph is False and cpu.min_node_prob == want["min_node_prob"]
    sampled = TreeConfig().resolve(torch.device("cpu"), torch.float32, do_sample=True, draft_vocab=256)
    assert sampled.lookup_tokens == 0  # the lookup branch is greedy only
    graph = TreeConfig(draft_graph=True).resolve(torch.device("cpu"), torch.float32, False, 256)
    assert graph.min_node_prob == 0.0 and graph.grow_min_prob == 0.0  # one tree shape for the graph
    with pytest.raises(ValueError, match="total_tokens=100 is larger than the 12 candidates"):
        TreeConfig(depth=2, tree_top_k=3, total_tokens=100).resolve(torch.device("cpu"), torch.float32, False, 256)


def test_the_entry_points_have_plain_signatures():
    for fn in (generate, eagle3_hub.generate):
        params = inspect.signature(fn).parameters
        assert list(params)[:3] == ["target", "draft", "input_ids"]
        assert "config" in params and "trust_remote_code" in params
        assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
        assert "__signature__" not in vars(fn)
    assert "tree_config" in inspect.signature(tree_generate).parameters
