"""The adaptive tree: the cost model (measured, cached, reused), the controller's decisions on synthetic costs, and
tree decoding staying the target's (greedy token for token, sampling in distribution) whatever it chooses. Tiny
random float32 targets; no timed assertions."""

from __future__ import annotations

import json
import random
import weakref

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from test_tree_decoding import _exact_three_token_distribution, copy_draft, plain_greedy, prompt, random_draft
from tiny_models import left_padded, make_tiny_target
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from eagle3_hub.generation.tree import TreeConfig, custom_generate_files, generate, verification
from eagle3_hub.generation.tree import controller as controller_mod
from eagle3_hub.generation.tree import costs as costs_mod
from eagle3_hub.generation.tree.controller import (
    LOOKUP_PRIOR,
    MIN_TIMED,
    RATE,
    StepShape,
    TreeController,
    levels_for,
    nodes_at,
)
from eagle3_hub.generation.tree.costs import StepCosts, monotone, step_costs
from eagle3_hub.generation.tree.drafting import CATCH_UP_TOKENS, Drafter
from eagle3_hub.generation.tree.outputs import TreeDecodingStats


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Cost tables go to a fresh cache per test, and nothing is remembered across tests."""
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(costs_mod, "_memo", {})
    monkeypatch.setattr(controller_mod, "_learnt", weakref.WeakKeyDictionary())


# ------------------------------------------------------------------------------------------- forced choices
def force_shapes(monkeypatch, seed=0, sequence=(0, 1, "max", 2, 0, "max", 1)):
    """Make the controller change the tree every step, through ``sequence`` (depths; "max": the configured depth;
    0: no tree), each row capped at a random depth of its own where the step's nodes allow. Returns the list of
    shapes it handed out."""
    rng = random.Random(seed)
    handed: list[StepShape] = []

    def choose(self, rows, lookup=0, max_depth=None, proposed=None, behind=False, context=None, remaining=None):
        want = sequence[len(handed) % len(sequence)]
        depth = self.config.depth if want == "max" else min(want, self.config.depth)
        if max_depth is not None:
            depth = min(depth, max_depth)
        shape = self.shape(depth)
        if depth >= 1:
            low = levels_for(shape.total_tokens, shape.top_k)
            caps = tuple(rng.randint(min(low, depth), depth) for _ in rows) if self.row_depths else None
            shape = StepShape(shape.depth, shape.top_k, shape.total_tokens, caps, lookup)
        handed.append(shape)
        self.chosen[shape.label] = self.chosen.get(shape.label, 0) + 1
        return shape

    monkeypatch.setattr(TreeController, "choose", choose)
    return handed


ADAPTIVE_TREE = {"depth": 5, "tree_top_k": 4, "total_tokens": 16, "min_node_prob": 0.0, "adaptive": True}


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "phi3"])
def test_greedy_equals_plain_while_the_tree_changes_every_step(arch, monkeypatch):
    target = make_tiny_target(arch)
    draft = copy_draft(target)
    ids = prompt(seed=2)
    ref = plain_greedy(target, ids, 80)
    handed = force_shapes(monkeypatch)
    out = generate(target, draft, ids, max_new_tokens=80, eos_token_id=[], **ADAPTIVE_TREE)
    assert torch.equal(out.sequences, ref)
    assert out.stats.tree["adaptive"] is True
    labels = {s.label for s in handed}
    assert {"none", "1/4/4", "2/4/7", "5/4/16"} <= {label.removesuffix("+lookup") for label in labels}
    assert out.stats.tree_steps == {label: sum(s.label == label for s in handed) for label in labels}
    assert any(s.row_depth and len(set(s.row_depth)) == 1 and s.row_depth[0] < s.depth for s in handed)
    assert out.stats.target_forwards < 80  # trees were accepted between the steps without one


def test_greedy_batch_with_lookup_and_eos_while_the_tree_changes(monkeypatch):
    """Rows with their own depths, a lookup branch riding with the trees, rows finishing at different steps."""
    target = make_tiny_target("llama")
    draft = random_draft(target)
    prompts = [prompt(n, seed=s)[0] for n, s in ((5, 3), (12, 4), (9, 5), (7, 6))]
    alone0 = plain_greedy(target, prompts[0][None], 70)
    eos = int(alone0[0, 5 + 15])
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    handed = force_shapes(monkeypatch, seed=1, sequence=(0, "max", 0, 0, 1, "max", 3, 2))
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=70, eos_token_id=eos, lookup_tokens=6, **ADAPTIVE_TREE)
    lengths = []
    for i, p in enumerate(prompts):
        alone = plain_greedy(target, p[None], 70, eos=eos)[0, len(p) :]
        assert torch.equal(out.sequences[i, L : L + len(alone)], alone), f"row {i}"
        lengths.append(len(alone))
    assert len(set(lengths)) > 1 and sum(lengths) == out.stats.new_tokens
    assert any(s.row_depth and len(set(s.row_depth)) > 1 for s in handed)  # rows of one step had their own depths
    assert any(s.lookup for s in handed) and all(s.lookup == 0 for s in handed if s.depth == 0)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_plain_after_long_runs_without_a_tree(batch, monkeypatch):
    """Runs without a tree longer than CATCH_UP_TOKENS: the draft reads only their latest tokens, the output stays
    plain greedy's (one prompt, and a left-padded batch)."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    prompts = [prompt(n, seed=s)[0] for n, s in ((6, 2), (11, 3), (8, 4))][:batch]
    ids, mask = left_padded(prompts)
    handed = force_shapes(monkeypatch, sequence=(0,) * (CATCH_UP_TOKENS + 5) + ("max", 1, "max"))
    out = generate(target, draft, ids, attention_mask=mask, max_new_tokens=60, eos_token_id=[], **ADAPTIVE_TREE)
    for i, p in enumerate(prompts):
        assert torch.equal(out.sequences[i, ids.shape[1] :], plain_greedy(target, p[None], 60)[0, len(p) :]), f"row {i}"
    assert sum(s.depth == 0 for s in handed) > 2 * CATCH_UP_TOKENS and out.stats.target_forwards < 60


def _drafter_and_queue(rows: int):
    """A started drafter of a tiny target, ``queue(positions)`` (the same positions in every row, random features
    and tokens) and the features' width."""
    target = make_tiny_target("llama")
    config = TreeConfig(
        depth=2,
        tree_top_k=2,
        total_tokens=3,
        lookup_tokens=0,
        min_node_prob=0.0,
        grow_min_prob=0.0,
        draft_graph=False,
        adaptive=False,
    )
    drafter = Drafter(random_draft(target), target, config, TreeDecodingStats())
    drafter.start(rows, 128)
    F = 3 * target.config.hidden_size

    def queue(pos):
        n = len(pos)
        drafter.queue(
            torch.randn(rows, n, F),
            torch.randint(3, 200, (rows, n)),
            torch.tensor([pos] * rows),
            torch.ones(rows, n, dtype=torch.bool),
        )

    return drafter, queue, F


def test_draft_reads_the_tokens_of_steps_without_a_tree():
    """A step without a tree queues its accepted token's features after those not yet read: the draft's next
    read takes them (up to CATCH_UP_TOKENS of the latest), so its context has those committed positions once, in
    order."""
    drafter, queue, F = _drafter_and_queue(rows=1)
    queue([0, 1, 2])
    drafter.draft_tree(2, torch.tensor([4]), holes=False)
    queue([3])  # a step without a tree
    feats = torch.randn(1, 2, F)
    drafter.queue(feats, torch.randint(3, 200, (1, 2)), torch.tensor([[4, 5]]), torch.ones(1, 2, dtype=torch.bool))
    assert drafter.pending[-1][0] is feats  # queued as it came: nothing is copied per step
    assert drafter.waiting()[2].tolist() == [[3, 4, 5]]  # and one with a tree: read together
    drafter.draft_tree(2, torch.tensor([7]), holes=False)
    assert drafter.cache.length == 6 and drafter.valid.shape[1] == 6
    queue([6])
    assert drafter.waiting()[2].tolist() == [[6]]  # what was read is not read again


def test_a_catch_up_reads_only_the_latest_tokens_of_a_long_run_without_trees():
    """After many steps without a tree the draft reads the last CATCH_UP_TOKENS of them (a trial of a tree costs one
    short read, not one over the whole run); the positions left out are absent from its cache, and a step's tokens
    stay together."""
    drafter, queue, _ = _drafter_and_queue(rows=2)
    queue([0, 1, 2])
    drafter.draft_tree(2, torch.tensor([4, 4]), holes=True)
    for p in range(3, 3 + 3 * CATCH_UP_TOKENS):  # steps without a tree
        queue([p])
    last = 3 + 3 * CATCH_UP_TOKENS
    queue([last, last + 1])  # then a tree step's two tokens
    assert drafter.waiting()[2][0].tolist() == list(range(last + 2 - CATCH_UP_TOKENS, last + 2))
    drafter.draft_tree(2, torch.tensor([last + 3] * 2), holes=True)
    assert drafter.cache.length == 3 + CATCH_UP_TOKENS and drafter.valid.shape[1] == 3 + CATCH_UP_TOKENS


def test_a_step_without_a_tree_chooses_its_token_without_a_walk(monkeypatch):
    """A step without a tree (and without the lookup branch) takes its token as plain decoding does: acceptance
    walks only the steps with a tree, and the output stays the target's."""
    from eagle3_hub.generation.tree import decode

    walks = []
    real_walk = decode.accept_walk
    monkeypatch.setattr(decode, "accept_walk", lambda *a, **k: walks.append(1) or real_walk(*a, **k))
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    handed = force_shapes(monkeypatch, sequence=(0, "max", 0, 0, 1))
    out = generate(
        target,
        draft,
        prompt(seed=2),
        max_new_tokens=40,
        do_sample=True,
        eos_token_id=[],
        generator=torch.Generator().manual_seed(0),
        **ADAPTIVE_TREE,
    )
    assert out.stats.new_tokens == 40
    assert 0 < len(walks) == sum(s.depth >= 1 for s in handed) < len(handed)


def test_the_prompt_is_read_at_prefill_and_a_catch_up_read_is_timed_as_its_own_kind(monkeypatch):
    """The draft reads the prompt with the prefill, so no step's time holds it; a tree after steps without one
    reads their tokens too: its time is a catch-up step's, not a tree step's (counted as a tree step, one slow read
    makes every tree look dear and the controller stops drafting)."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    handed = force_shapes(monkeypatch, sequence=(0, 0, 0, 0))  # no tree at all: only the prompt's read
    out = generate(target, draft, prompt(seed=2), max_new_tokens=6, eos_token_id=[], **ADAPTIVE_TREE)
    assert len(handed) == 5 and out.stats.draft_forwards == 1

    seen = []
    real = TreeController.observe

    def observe(self, rows, shape, accepted, seconds=None, looked_up=None, proposed=None, behind=False, context=None):
        seen.append((shape.depth, seconds, behind))
        return real(self, rows, shape, accepted, seconds, looked_up, proposed, behind, context)

    monkeypatch.setattr(TreeController, "observe", observe)
    force_shapes(monkeypatch, sequence=(1, 1, 0, 0, 1, 1))
    generate(target, draft, prompt(seed=2), max_new_tokens=20, eos_token_id=[], **ADAPTIVE_TREE)
    assert all(seconds is not None for _, seconds, _ in seen[:-1])  # the last step ends the row: not timed
    assert [behind for _, _, behind in seen[:6]] == [False, False, False, True, True, False]  # after steps without trees


def test_a_catch_up_step_keeps_its_own_factor():
    """A batch near break-even: trees pay once the draft is up to date, but a tree after steps without one also
    reads their tokens, and that trial loses. While the draft is behind, the catch-up's factor decides (a tree
    is not tried again); once it drafts, the tree's."""
    costs = synthetic(lambda r, s: 0.03 + 1e-4 * r * s, draft_read=1e-4, draft_level=1e-4)
    c = TreeController(CONFIG, costs, rows=8)
    rows = list(range(8))
    settle(c, rows, lambda r: 2)
    shape = c.choose(rows)
    assert shape.depth >= 1
    for _ in range(5):  # tree steps at the table's times
        c.observe(rows, shape, [2] * 8, c.step_seconds(8, shape.depth))
    assert c.factor_of(shape.depth, behind=True) == pytest.approx(1.0)  # no catch-up seen yet: the tree's
    for _ in range(MIN_TIMED):
        c.observe(rows, shape, [2] * 8, 3 * c.step_seconds(8, shape.depth), behind=True)
    assert c.factor["catch_up"] == pytest.approx(3.0) and c.factor["tree"] == pytest.approx(1.0)
    assert c.choose(rows, behind=True).depth == 0
    assert c.choose(rows).depth >= 1
    for _ in range(200):  # without trees the catch-up's extra fades: the batch tries a tree again
        c.observe(rows, c.shape(0), [0] * 8, c.step_seconds(8, 0))
    assert c.choose(rows, behind=True).depth >= 1


@pytest.mark.parametrize("forced", [True, False], ids=["shape-every-step", "controller"])
def test_sampling_keeps_the_target_distribution_with_the_controller(forced, monkeypatch):
    """As test_tree_decoding's chi-square test, with the adaptive tree: rows with their own depths in the first
    tree (forced), or whatever the controller chooses on this machine."""
    target = make_tiny_target("llama", vocab_size=16)
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    draft = copy_draft(target)
    ids = torch.tensor([[3, 7, 11, 5]])
    monkeypatch.setattr(verification, "LOGITS_SUBSET_DEVICES", ())
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(6), TopPLogitsWarper(0.9)])
    exact = _exact_three_token_distribution(target, ids, processors)
    if forced:
        handed = force_shapes(monkeypatch, sequence=("max", 0, 1))
    n = 8000
    out = generate(
        target,
        draft,
        ids.expand(n, -1),
        max_new_tokens=5,
        do_sample=True,
        eos_token_id=[],
        generator=torch.Generator().manual_seed(0),
        temperature=0.7,
        top_k=6,
        top_p=0.9,
        depth=3,
        tree_top_k=4,
        total_tokens=12,
        min_node_prob=0.0,
        adaptive=True,
    )
    if forced:
        assert handed[0].depth == 3 and len(set(handed[0].row_depth)) == 2  # rows capped at 2 or 3 levels
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


def test_the_real_controller_runs_lossless_and_reports_its_shapes():
    target = make_tiny_target("qwen2")
    draft = copy_draft(target)
    ids = prompt(seed=5)
    ref = plain_greedy(target, ids, 60)
    out = generate(target, draft, ids, max_new_tokens=60, eos_token_id=[])  # the default: adaptive
    assert torch.equal(out.sequences, ref)
    assert out.stats.tree["adaptive"] is True
    assert sum(out.stats.tree_steps.values()) == out.stats.steps
    fixed = generate(target, draft, ids, max_new_tokens=60, eos_token_id=[], adaptive=False)
    assert torch.equal(fixed.sequences, ref) and fixed.stats.tree["adaptive"] is False and not fixed.stats.tree_steps


def test_a_run_starts_from_the_acceptance_the_last_run_of_the_pair_saw(monkeypatch):
    """A random draft is rarely accepted: the second run's rows start from the first run's shares, not the prior, and
    a run with other sampling settings or another draft starts from the prior."""
    target = make_tiny_target("llama")
    draft = random_draft(target)
    ids = prompt(seed=3)
    starts = []
    init = TreeController.__init__

    def spy(self, *args, start=None, **kw):
        starts.append(start)
        init(self, *args, start=start, **kw)

    monkeypatch.setattr(TreeController, "__init__", spy)
    ref = plain_greedy(target, ids, 40)
    choose = TreeController.choose
    force_shapes(monkeypatch, sequence=("max",))  # every step a full tree: every position tried
    first = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[])
    assert torch.equal(first.sequences, ref) and starts == [None]
    monkeypatch.setattr(TreeController, "choose", choose)
    second = generate(target, draft, ids, max_new_tokens=40, eos_token_id=[])
    assert torch.equal(second.sequences, ref)
    learnt = starts[-1]
    assert learnt is not None and learnt.ndim == 1
    assert learnt[0] < 0.3 < controller_mod.PRIOR_ACCEPT  # what the first run saw, far below the prior
    generate(target, draft, ids, max_new_tokens=5, eos_token_id=[], do_sample=True, temperature=0.7)
    assert starts[-1] is None  # other settings: the prior
    generate(target, random_draft(target), ids, max_new_tokens=5, eos_token_id=[])
    assert starts[-1] is None  # another draft: the prior


def test_the_learnt_shares_count_the_tried_positions_only():
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01), rows=2)
    assert c.learnt() is None  # nothing tried
    shape = c.shape(CONFIG.depth)
    for _ in range(controller_mod.MIN_LEARNT):
        c.observe([0, 1], shape, [2, 0])  # row 0 accepts 2 (tries 3 positions), row 1 none (tries 1)
    learnt = c.learnt()
    assert learnt[0] == pytest.approx(0.5) and learnt[1] == pytest.approx(1.0) and learnt[2] == pytest.approx(0.0)
    assert (learnt[3:] == c.prior).all()  # never tried: the prior
    again = TreeController(CONFIG, c.costs, rows=3, start=learnt)
    assert np.allclose(again.alpha, np.tile(learnt, (3, 1)))


# ------------------------------------------------------------------------------------------- the config
def test_adaptive_is_the_default_unless_a_shape_is_given():
    cpu = torch.device("cpu")

    def resolve(**kw):
        return TreeConfig(**kw).resolve(cpu, torch.float32, do_sample=False, draft_vocab=256)

    assert resolve().adaptive is True
    assert resolve(lookup_tokens=0, min_node_prob=0.0).adaptive is True  # not a shape
    for shape in ({"depth": 4}, {"tree_top_k": 2}, {"total_tokens": 5}):
        assert resolve(**shape).adaptive is False  # a shape given is the shape used
        assert resolve(**shape, adaptive=True).adaptive is True  # ...or the largest the controller may choose
    assert resolve(adaptive=False).adaptive is False
    with pytest.raises(ValueError, match="adaptive must be True, False or None"):
        resolve(adaptive="yes")


def test_the_controller_and_costs_travel_with_custom_generate():
    files = custom_generate_files()
    assert {"custom_generate/controller.py", "custom_generate/costs.py"} <= set(files)


# ------------------------------------------------------------------------------------------- decisions
def synthetic(verify, draft_read=0.0, draft_level=0.0, top_k=4):
    """A cost table from ``verify(rows, slots)`` seconds at the measured grid."""
    rows, slots = (1, 2, 4, 8), (1, 2, 4, 8, 16, 32)
    return StepCosts(
        key="synthetic",
        top_k=top_k,
        device="test",
        verify={r: {s: verify(r, s) for s in slots} for r in rows},
        draft_read={r: draft_read * r for r in rows},
        draft_level={r: draft_level * r for r in rows},
    )


CONFIG = TreeConfig(
    depth=4,
    tree_top_k=4,
    total_tokens=12,
    lookup_tokens=0,
    min_node_prob=0.0,
    grow_min_prob=0.0,
    draft_graph=False,
    adaptive=True,
)


def settle(controller, rows, accepted_of, steps=30):
    """Feed ``steps`` observations of full-depth trees: row r accepted ``accepted_of(r)`` draft tokens."""
    shape = controller.shape(controller.config.depth)
    for _ in range(steps):
        controller.observe(rows, shape, [accepted_of(r) for r in rows])


def test_compute_bound_verification_chooses_no_tree():
    """Every slot costs as much as the first (a CPU at a large batch): even a good draft does not pay."""
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01 * r * s, draft_read=0.002, draft_level=0.002), rows=8)
    rows = list(range(8))
    settle(c, rows, lambda r: 2)
    assert c.choose(rows).depth == 0


def test_cheap_verification_and_high_acceptance_choose_the_deepest_tree():
    """A flat verification (a GPU at batch 1) and a draft accepted to the end: the full tree."""
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01 + 1e-5 * s, draft_read=5e-4, draft_level=5e-4), rows=1)
    settle(c, [0], lambda r: 4)
    shape = c.choose([0])
    assert (shape.depth, shape.total_tokens) == (4, 12) and shape.row_depth is None


def test_low_acceptance_chooses_a_shallow_tree_or_none():
    costs = synthetic(lambda r, s: 0.01 * (1 + 0.05 * s), draft_read=1e-3, draft_level=1e-3)
    good, bad = TreeController(CONFIG, costs, rows=1), TreeController(CONFIG, costs, rows=1)
    settle(good, [0], lambda r: 4)
    settle(bad, [0], lambda r: 0)
    assert good.choose([0]).depth == 4
    assert bad.choose([0]).depth < good.choose([0]).depth
    assert bad.choose([0]).depth == 0  # nothing accepted: the draft's cost buys nothing


def test_a_rejecting_row_gets_a_shallower_tree_than_an_accepting_row():
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01 + 1e-5 * r * s, draft_read=1e-4, draft_level=1e-4), rows=3)
    settle(c, [0, 1, 2], lambda r: (4, 0, 3)[r])
    shape = c.choose([0, 1, 2])
    assert shape.depth == 4
    assert shape.row_depth == (4, 2, 3)  # the deepest level each reaches
    assert shape.row_depth[1] == levels_for(shape.total_tokens, shape.top_k)  # no shallower than its nodes need
    assert TreeController(CONFIG, c.costs, rows=3, row_depths=False).choose([0, 1, 2]).row_depth is None


def test_finished_rows_weigh_nothing():
    """The accepting rows finished: the choice is the remaining (rejecting) rows' alone."""
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01 * r * (1 + 0.05 * s), draft_read=1e-3, draft_level=1e-3), rows=4)
    settle(c, [0, 1, 2, 3], lambda r: 4 if r < 2 else 0)
    assert c.choose([0, 1, 2, 3]).depth >= 1
    assert c.choose([2, 3]).depth == 0


def test_the_batch_is_done_when_its_slowest_row_is():
    """A step costs nearly as much for one row as for two: a tree that only the accepting row uses makes it finish
    early and leaves the rejecting row decoding alone at almost the same price per step."""
    costs = synthetic(lambda r, s: 0.010 + 0.001 * r + 0.0004 * r * s)
    c = TreeController(CONFIG, costs, rows=2)
    settle(c, [0, 1], lambda r: (4, 0)[r])
    assert c.choose([0, 1]).depth >= 1  # the most tokens per second: row 0's
    assert c.choose([0, 1], remaining=[100, 100]).depth == 0  # done soonest: row 1 sets the pace
    assert c.choose([0, 1], remaining=[100, 2]).depth >= 1  # row 1 is nearly done: row 0 sets it
    both = TreeController(CONFIG, costs, rows=2)
    settle(both, [0, 1], lambda r: 4)
    assert both.choose([0, 1], remaining=[100, 100]).depth == 4
    one = TreeController(CONFIG, costs, rows=1)  # one row: done soonest is the most tokens per second
    settle(one, [0], lambda r: 1)
    assert one.choose([0], remaining=[50]) == one.choose([0])


def test_steps_without_a_tree_relax_the_estimates_so_a_tree_is_tried_again():
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01 * (1 + 0.05 * s), draft_read=1e-3, draft_level=1e-3), rows=1)
    settle(c, [0], lambda r: 0)
    depths = []
    for _ in range(200):
        shape = c.choose([0])
        depths.append(shape.depth)
        c.observe([0], shape, [0] if shape.depth else [])
    assert depths[0] == 0 and max(depths) >= 1


def test_a_choice_of_no_tree_stands_and_its_steps_relax_as_one_by_one(monkeypatch):
    """After the shapes were weighed and no tree won, the choice stands for STANDING_STEPS steps of the same rows
    (nothing is weighed); those steps' relaxing and timings then count as if observed one by one. A lookup branch on
    offer, or other rows, are weighed at once."""
    costs = synthetic(lambda r, s: 0.01 * r * s, draft_read=0.002, draft_level=0.002)  # trees never pay
    rows = list(range(4))

    def run(steps):
        c = TreeController(CONFIG, costs, rows=4)
        settle(c, rows, lambda r: 1)
        weighed, behind = [], False
        for i in range(steps):
            shape = c.choose(rows, behind=behind, context=40 + i)
            weighed.append(c.weighed)
            assert shape.depth == 0
            c.observe(rows, shape, [0] * 4, 1.3 * c.step_seconds(4, 0, context=40 + i), behind=behind, context=40 + i)
            behind = True
        return c, weighed

    steps = 2 * controller_mod.STANDING_STEPS
    standing, weighed = run(steps)
    assert weighed == ([True] + [False] * (controller_mod.STANDING_STEPS - 1)) * 2
    assert standing.chosen == {"none": steps}
    monkeypatch.setattr(controller_mod, "STANDING_STEPS", 1)
    every_step, weighed = run(steps)
    assert all(weighed)
    assert not standing.stale and not every_step.stale  # applies what stood: both have seen the same steps
    assert standing.alpha == pytest.approx(every_step.alpha)
    assert standing.lookup_gain == pytest.approx(every_step.lookup_gain)
    assert standing.catch_up_weight == pytest.approx(every_step.catch_up_weight)
    assert standing.factor == pytest.approx(every_step.factor) and standing.factor["none"] == pytest.approx(1.3)
    monkeypatch.undo()
    c = TreeController(CONFIG, costs, rows=4)
    assert c.choose(rows).depth == 0 and c.weighed
    assert c.choose(rows, lookup=4, behind=True) is not None and c.weighed  # a branch on offer: weighed
    c.choose(rows, behind=True)
    assert c.choose(rows[:3], behind=True) is not None and c.weighed  # a row finished: weighed


def _trial_steps(controller, rows, accepted, steps=400):
    """Run ``steps`` steps, trees accepting ``accepted`` draft tokens per row; the steps that chose a tree."""
    trials, behind = [], False
    for i in range(steps):
        shape = controller.choose(rows, behind=behind)
        if shape.depth:
            trials.append(i)
        controller.observe(rows, shape, [min(accepted, shape.depth) if shape.depth else 0] * len(rows), behind=behind)
        behind = shape.depth == 0
    return trials


def test_trials_that_do_not_pay_come_ever_more_rarely(monkeypatch):
    """A batch where the draft is never accepted: each tree it tries is a trial the next step does not follow, so
    the estimates relax ever more slowly and the trials thin out; without the backoff they come at a fixed pace."""
    costs = synthetic(lambda r, s: 0.01 * (1 + 0.05 * s), draft_read=1e-3, draft_level=1e-3)
    c = TreeController(CONFIG, costs, rows=4)
    settle(c, [0, 1, 2, 3], lambda r: 0)
    trials = _trial_steps(c, [0, 1, 2, 3], 0)
    gaps = [b - a for a, b in zip(trials, trials[1:])]
    assert len(gaps) >= 3 and gaps[0] < gaps[1] < gaps[2], trials
    assert c.failed_trials >= 3 and c.relax < controller_mod.RELAX / 4
    monkeypatch.setattr(controller_mod, "MAX_BACKOFF", 0)
    fixed = TreeController(CONFIG, costs, rows=4)
    settle(fixed, [0, 1, 2, 3], lambda r: 0)
    assert len(_trial_steps(fixed, [0, 1, 2, 3], 0)) > 2 * len(trials)


def test_a_trial_that_pays_restores_the_pace():
    costs = synthetic(lambda r, s: 0.01 * (1 + 0.05 * s), draft_read=1e-3, draft_level=1e-3)
    c = TreeController(CONFIG, costs, rows=2)
    settle(c, [0, 1], lambda r: 0)
    _trial_steps(c, [0, 1], 0, steps=300)
    assert c.failed_trials >= 2
    assert _trial_steps(c, [0, 1], CONFIG.depth, steps=300)[-1] == 299  # trees accepted whole: drafting on
    assert c.failed_trials == 0 and c.relax == controller_mod.RELAX


def test_the_lookup_branch_rides_only_where_it_pays():
    """Its slots are verified for every row: nearly free at batch 1 on a flat verification, dear on a batch whose
    verification grows with its tokens. A branch that adds many tokens beyond the tree pays even there; one that
    adds none is left out, and only rows that proposed a branch count."""
    config = TreeConfig(
        depth=3,
        tree_top_k=4,
        total_tokens=6,
        lookup_tokens=20,
        min_node_prob=0.0,
        grow_min_prob=0.0,
        draft_graph=False,
        adaptive=True,
    )
    flat = synthetic(lambda r, s: 0.03 + 1e-5 * r * s, draft_read=1e-3, draft_level=1e-3)
    steep = synthetic(lambda r, s: 0.03 + 2e-3 * r * s, draft_read=1e-3, draft_level=1e-3)
    for costs, rows, expect in ((flat, [0], 20), (steep, list(range(8)), 0)):
        c = TreeController(config, costs, rows=len(rows))
        shape = c.shape(3)
        for i in range(30):  # trees accepted to depth 2; every other step the branch copies 1 token past the tree
            s = StepShape(shape.depth, shape.top_k, shape.total_tokens, None, 20)
            c.observe(rows, s, [2 + i % 2 * 2] * len(rows), looked_up=[bool(i % 2)] * len(rows))
        chosen = c.choose(rows, lookup=20)
        assert chosen.depth >= 1 and chosen.lookup == expect, (rows, chosen)
        assert chosen.label.endswith("+lookup") == bool(expect)
    c = TreeController(config, steep, rows=8)
    rows = list(range(8))
    for _ in range(30):  # the branch copies 12 tokens past the tree's depth every step
        s = StepShape(3, 4, 6, None, 20)
        c.observe(rows, s, [15] * 8, looked_up=[True] * 8)
    assert c.lookup_gain[0] > 11
    assert c.choose(rows, lookup=20).lookup == 20
    assert c.choose(rows, lookup=20, proposed=[True] + [False] * 7).lookup == 0  # one row's copy pays for one row


def test_the_lookup_estimate_relaxes_back_while_the_branch_is_left_out():
    c = TreeController(CONFIG, synthetic(lambda r, s: 0.01, draft_read=1e-3, draft_level=1e-3), rows=2)
    with_branch = StepShape(4, 4, 12, None, 5)
    c.observe([0, 1], with_branch, [7, 1], looked_up=[True, False], proposed=[True, True])
    high = LOOKUP_PRIOR + RATE * (3 - LOOKUP_PRIOR)  # 3 tokens past the tree's 4 levels
    assert c.lookup_gain.tolist() == pytest.approx([high, LOOKUP_PRIOR * (1 - RATE)])
    c.observe([0, 1], with_branch, [1, 1], looked_up=[False, False], proposed=[False, True])
    assert c.lookup_gain[0] == pytest.approx(high)  # no branch of its own: nothing learnt
    low = float(c.lookup_gain[1])
    for _ in range(50):
        c.observe([0, 1], c.shape(2), [1, 1])
    assert low < float(c.lookup_gain[1]) < LOOKUP_PRIOR


def test_the_factor_is_the_median_of_recent_steps():
    """Time the table leaves out (sampling, host work) counts, and one slow step does not decide."""
    costs = synthetic(lambda r, s: 0.01 + 1e-4 * s, draft_read=1e-4, draft_level=1e-4)
    c = TreeController(CONFIG, costs, rows=1)
    settle(c, [0], lambda r: 1)
    shape = c.shape(4)
    modelled = c.step_seconds(1, 4)
    for factor in (1.2, 1.2, 50.0, 1.2):
        c.observe([0], shape, [1], modelled * factor)
    assert c.factor["tree"] == pytest.approx(1.2)
    for _ in range(9):  # tree steps turn out much slower than the table says: the plain step wins
        c.observe([0], shape, [1], modelled * 10)
    assert c.choose([0]).depth == 0


def test_what_the_table_leaves_out_scales_with_the_step():
    """A batch's last row: tree steps at 16 rows ran 1.5x the table, and a tree for one row is priced at 1.5x the
    table's one-row tree, not at the 16-row step's extra seconds added to it; steps where rows finish (the caches drop
    them) are not timed."""
    costs = synthetic(lambda r, s: 0.01 + 1e-3 * r * s, draft_read=1e-4, draft_level=1e-4)
    config = TreeConfig(
        depth=2,
        tree_top_k=4,
        total_tokens=4,
        lookup_tokens=0,
        min_node_prob=0.0,
        grow_min_prob=0.0,
        draft_graph=False,
        adaptive=True,
    )
    c = TreeController(config, costs, rows=16)
    rows = list(range(16))
    for _ in range(9):  # a tree's steps at 1.5x the table, each row accepting one token in two
        c.observe(rows, c.shape(2), [1, 0] * 8, 1.5 * c.step_seconds(16, 2))
        c.observe(rows, c.shape(0), [0] * 16, 1.5 * c.step_seconds(16, 0))
    assert c.factor["tree"] == pytest.approx(1.5)
    assert c.step_seconds(1, 2) * c.factor_of(2) == pytest.approx(1.5 * c.step_seconds(1, 2))
    assert c.choose([0]).depth >= 1  # one row: a tree's slots cost little beside the step's fixed part


def test_one_slow_first_tree_step_does_not_stop_drafting():
    """A shape's first step warms up (several times its later time): until MIN_TIMED tree steps are timed, a tree is
    priced with the factor of the steps without a tree, and the batch goes on drafting."""
    costs = synthetic(lambda r, s: 0.03 + 1e-4 * s, draft_read=1e-3, draft_level=1e-3)
    c = TreeController(CONFIG, costs, rows=1)
    c.alpha[:] = 0.8
    c.observe([0], c.shape(4), [3], 4 * c.step_seconds(1, 4))  # the first tree step
    for _ in range(5):
        c.observe([0], c.shape(0), [0], 1.2 * c.step_seconds(1, 0))
    c.alpha[:] = 0.8
    assert c.factor_of(4) == pytest.approx(1.2)
    assert c.choose([0]).depth >= 1


def test_the_modelled_time_follows_the_context():
    """A step after 512 tokens costs what the table measured there; in between, along the line; a table without a
    long measurement costs the same at every context."""
    short = synthetic(lambda r, s: 0.01 * r * s)
    long = synthetic(lambda r, s: 0.03 * r * s)
    long.context = 512
    assert short.verify_s(2, 4, 288) == pytest.approx(0.08)
    short.longer = long
    assert short.verify_s(2, 4) == pytest.approx(0.08)  # the table's own context
    assert short.verify_s(2, 4, 288) == pytest.approx(0.16)  # halfway from 64 to 512
    assert short.verify_s(2, 4, 960) == pytest.approx(0.40)  # past it: the same line
    assert short.verify_s(2, 4, 8) == pytest.approx(0.08)  # shorter: the short table's
    c = TreeController(CONFIG, short, rows=2)
    assert c.step_seconds(2, 0, context=512) == pytest.approx(0.06)
    assert StepCosts.from_json(short.to_json()).verify_s(2, 4, 288) == pytest.approx(0.16)


def test_a_lookup_step_much_dearer_than_the_table_keeps_its_own_factor():
    """A batch whose verifications with the branch run far past the table: after one such step the branch is left
    out, though the tree steps around it keep the table's times; until one is seen, it borrows the tree's."""
    config = TreeConfig(
        depth=3,
        tree_top_k=4,
        total_tokens=6,
        lookup_tokens=20,
        min_node_prob=0.0,
        grow_min_prob=0.0,
        draft_graph=False,
        adaptive=True,
    )
    c = TreeController(config, synthetic(lambda r, s: 0.03 + 1e-4 * r * s, draft_read=1e-3, draft_level=1e-3), rows=8)
    rows = list(range(8))
    tree, branch = c.shape(3), StepShape(3, 4, 6, None, 20)
    for _ in range(12):  # trees accepted to depth 2, at the table's times plus a little
        c.observe(rows, tree, [2] * 8, 1.1 * c.step_seconds(8, 3))
    assert c.factor_of(3, 20) == pytest.approx(1.1)  # no branch seen yet: the tree's
    assert c.choose(rows, lookup=20).lookup == 20  # the prior's gain pays for the branch's modelled slots
    for _ in range(MIN_TIMED):
        c.observe(rows, branch, [3] * 8, 10 * c.step_seconds(8, 3, 20), looked_up=[True] * 8)
    assert c.factor["lookup"] == pytest.approx(10) and c.factor["tree"] == pytest.approx(1.1)
    assert c.choose(rows, lookup=20).lookup == 0


def test_steps_much_faster_than_the_table_make_it_stale():
    """A table measured on a busier machine: the run's steps take a fraction of what it says. Slower steps (this run
    shares the machine) never make a table stale: noise only adds time."""
    costs = synthetic(lambda r, s: 0.01 + 1e-4 * s, draft_read=1e-3, draft_level=1e-3)
    shape = TreeController(CONFIG, costs, rows=1).shape(4)
    modelled = TreeController(CONFIG, costs, rows=1).step_seconds(1, 4)
    slow, fast = TreeController(CONFIG, costs, rows=1), TreeController(CONFIG, costs, rows=1)
    for i in range(20):
        slow.observe([0], shape, [1], 3.0 * modelled)
        fast.observe([0], shape, [1], 0.2 * modelled if i % 4 else 5 * modelled)  # one slow step in four
        assert not fast.stale or i + 1 >= 9  # not before a median of RESIDUAL_STEPS steps
    assert fast.stale and not slow.stale
    plain = TreeController(CONFIG, costs, rows=1)  # steps without a tree count as well
    for _ in range(9):
        plain.observe([0], plain.shape(0), [], 0.1 * plain.step_seconds(1, 0))
    assert plain.stale
    fresh = synthetic(lambda r, s: 0.002 + 2e-5 * s, draft_read=2e-4, draft_level=2e-4)
    fast.replace_costs(fresh)
    assert fast.costs is fresh and not fast.stale and set(fast.factor.values()) == {1.0}
    assert fast.alpha[0, 0] > 0.9 and fast.alpha[0, 1] < 0.1  # what was learnt about acceptance stays


def _scaled_table_on_disk(target, draft, config, rows, slots, factor):
    """Measure the table, write it to the cache with every time multiplied by ``factor``, forget the memo."""
    costs = step_costs(target, draft, config, rows, slots)
    data = costs.to_json()
    data["verify"] = {r: {s: t * factor for s, t in by.items()} for r, by in data["verify"].items()}
    for part in ("draft_read", "draft_level"):
        data[part] = {r: t * factor for r, t in data[part].items()}
    costs_mod.cost_file(costs.key).write_text(json.dumps(data))
    costs_mod._memo.clear()
    return costs.key


@pytest.mark.parametrize("factor", [1000.0, 0.001])
def test_a_cached_table_slower_than_the_run_is_measured_again(factor):
    """A cached table 1000x too slow (measured beside other work) is measured again during the run and replaced on
    disk, with the output still plain greedy's; a table faster than the run is kept."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    ids = prompt(seed=3)
    ref = plain_greedy(target, ids, 48)
    tree = {"depth": 3, "tree_top_k": 4, "total_tokens": 8, "adaptive": True}
    config = TreeConfig(**tree).resolve(torch.device("cpu"), torch.float32, False, draft.config.draft_vocab_size)
    key = _scaled_table_on_disk(target, draft, config, 1, config.total_tokens + config.lookup_tokens + 1, factor)
    cached = json.loads(costs_mod.cost_file(key).read_text())
    out = generate(target, draft, ids, max_new_tokens=48, eos_token_id=[], **tree)
    assert torch.equal(out.sequences, ref)
    on_disk = json.loads(costs_mod.cost_file(key).read_text())
    assert out.stats.costs_measured_again is (factor > 1)
    if factor > 1:
        assert on_disk["verify"]["1"]["1"] < cached["verify"]["1"]["1"] / 10 and costs_mod._memo[key].fresh
        assert "measured again" in str(out.stats)
        again = generate(target, draft, ids, max_new_tokens=48, eos_token_id=[], **tree)  # the new table holds
        assert not again.stats.costs_measured_again and torch.equal(again.sequences, ref)
    else:
        assert on_disk == cached


def test_nodes_shrink_with_the_depth():
    assert [nodes_at(CONFIG, d) for d in range(5)] == [0, 3, 6, 9, 12]
    small = TreeConfig(depth=5, tree_top_k=3, total_tokens=2)
    assert [nodes_at(small, d) for d in range(1, 6)] == [1, 2, 2, 2, 2]
    assert levels_for(4, 4) == 1 and levels_for(5, 4) == 2 and levels_for(21, 4) == 3


# ------------------------------------------------------------------------------------------- the cost model
def test_costs_are_measured_once_cached_on_disk_and_extended(tmp_path, monkeypatch):
    target = make_tiny_target("llama")
    draft = random_draft(target)
    config = TreeConfig(depth=3, tree_top_k=4, total_tokens=8).resolve(torch.device("cpu"), torch.float32, False, 256)
    first = step_costs(target, draft, config, rows=2, slots=9)
    assert set(first.verify) == {1, 2} and set(first.verify[2]) == {1, 2, 4, 8, 16}
    assert set(first.draft_read) == set(first.draft_level) == {1, 2}
    files = list((tmp_path / "cache" / "tree-costs").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"] == first.key
    assert first.verify_s(2, 16) >= first.verify_s(2, 1) > 0 and first.draft_s(1, 3) >= first.draft_s(1, 1) > 0
    assert first.draft_s(1, 0) == 0

    monkeypatch.setattr(costs_mod, "_memo", {})

    def no_measuring(costs, *a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs_mod, "measure", no_measuring)
    again = step_costs(target, draft, config, rows=2, slots=9)  # from the file
    assert again.verify == first.verify
    monkeypatch.undo()
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(costs_mod, "_memo", {})
    bigger = step_costs(target, draft, config, rows=4, slots=9)  # a larger batch: its rows are added
    assert set(bigger.verify) == {1, 2, 4} and set(bigger.verify[1]) == set(first.verify[1])
    # the rows measured before are kept, lowered only where the new rows' readings make the table monotone
    assert all(bigger.verify[1][s] <= first.verify[1][s] for s in first.verify[1])
    assert bigger.verify[1] == {s: min([first.verify[1][s]] + [bigger.verify[r][s] for r in (2, 4)]) for s in first.verify[1]}
    other = step_costs(target, draft, config.replace(tree_top_k=2), rows=1, slots=3)
    assert other.key != first.key  # another tree width, another table
    assert "| rows |" in bigger.table() and "draft level" in bigger.table()


def test_a_slot_grid_stopped_at_a_slow_forward_stays_covered(monkeypatch):
    """A forward slower than SLOW_FORWARD_S stops a row's slot grid; the monotone pass may then lower that reading
    (a larger batch measured faster: the slow one was noise). The table still covers what was asked, and is not
    measured again on the next read."""
    target = make_tiny_target("llama")
    draft = random_draft(target)
    config = TreeConfig(depth=3, tree_top_k=4, total_tokens=8).resolve(torch.device("cpu"), torch.float32, False, 256)
    calls = []

    def timed(fn, device, repeats=3):
        calls.append(1)
        return 0.3 if len(calls) == 4 else 1e-3 * len(calls)  # row 1, slot 8: one slow reading

    monkeypatch.setattr(costs_mod, "_timed", timed)
    first = step_costs(target, draft, config, rows=2, slots=9)
    assert set(first.verify[1]) == {1, 2, 4, 8} and set(first.verify[2]) == {1, 2, 4, 8, 16}
    assert first.verify[1][8] < costs_mod.SLOW_FORWARD_S  # lowered to row 2's reading
    monkeypatch.setattr(costs_mod, "_memo", {})

    def no_measuring(costs, *a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs_mod, "measure", no_measuring)
    assert step_costs(target, draft, config, rows=2, slots=9).slow_rows == {1}


def test_a_cost_table_is_monotone_and_interpolates():
    verify = {1: {1: 1.0, 2: 0.8, 4: 2.0}, 2: {1: 0.9, 2: 2.0, 4: 3.0}}
    monotone(verify)
    assert verify == {1: {1: 0.8, 2: 0.8, 4: 2.0}, 2: {1: 0.9, 2: 2.0, 4: 3.0}}
    table = StepCosts(key="k", top_k=2, device="test", verify=verify, draft_read={1: 1.0, 2: 1.0}, draft_level={1: 0.5, 2: 1.0})
    assert table.verify_s(1, 3) == pytest.approx(1.4)
    assert table.verify_s(1, 8) == pytest.approx(4.4)  # past the grid: the last slope
    assert table.verify_s(4, 1) == pytest.approx(1.1)  # more rows: the last slope of rows
    assert table.draft_s(2, 3) == pytest.approx(3.0)


def test_the_cost_cache_follows_the_package_cache_rule(monkeypatch, tmp_path):
    from eagle3_hub.targets import cache_dir

    monkeypatch.delenv("EAGLE3_HUB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert costs_mod.cache_root() == cache_dir()
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "mine"))
    assert costs_mod.cache_root() == cache_dir()


# ------------------------------------------------------------------------------------------- the bench command
def test_bench_profile_prints_the_cost_table(tmp_path, capsys):
    import argparse

    from test_bench import make_tokenizer

    from eagle3_hub.commands import bench as bench_command

    target = make_tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    make_tokenizer().save_pretrained(tmp_path / "target")
    copy_draft(target).save_pretrained(tmp_path / "draft")
    parser = argparse.ArgumentParser()
    bench_command.add_arguments(parser)
    args = parser.parse_args(
        [
            "--target",
            str(tmp_path / "target"),
            "--draft",
            str(tmp_path / "draft"),
            "--profile",
            "--batch-size",
            "1,2",
            "--dtype",
            "float32",
            "--quiet",
        ]
    )
    assert bench_command.run(args) == 0
    printed = capsys.readouterr().out
    assert "| rows |" in printed and "| 2 |" in printed and "draft level" in printed
    assert len(list((tmp_path / "cache" / "tree-costs").glob("*.json"))) == 1
    args = parser.parse_args(["--trees", "adaptive=1;adaptive=0;depth=3,tree_top_k=8,total_tokens=6"])
    assert bench_command.tree_grid_from_args(args) == [
        {"adaptive": 1},
        {"adaptive": 0},
        {"depth": 3, "tree_top_k": 8, "total_tokens": 6},
    ]


def test_fixed_shape_draft_levels_follow_the_controller(monkeypatch):
    """With the draft graph's fixed shapes (run eagerly on a CPU) every depth the controller picks gets its own
    shapes, and rows keep the step's depth."""
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    ids = prompt(seed=9)
    ref = plain_greedy(target, ids, 50)
    handed = force_shapes(monkeypatch, sequence=("max", 0, 2, 1, "max"))
    out = generate(target, draft, ids, max_new_tokens=50, eos_token_id=[], draft_graph=True, **ADAPTIVE_TREE)
    assert torch.equal(out.sequences, ref)
    assert {s.label.removesuffix("+lookup") for s in handed} >= {"none", "1/4/4", "2/4/7", "5/4/16"}
    assert all(s.row_depth is None for s in handed)
