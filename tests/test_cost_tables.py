"""The adaptive tree's cost-table cache: checked on read (shape, finite positive times, the device, dtype and tree
width it was measured for), measured again with one line naming the file when it fails a check, and kept in memory
with one warning when the cache cannot be written. Tiny random float32 targets; no timed assertions."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from test_tree_decoding import plain_greedy, prompt, random_draft
from tiny_models import make_tiny_target

from eagle3_hub.generation.tree import TreeConfig, generate
from eagle3_hub.generation.tree import costs as costs_mod
from eagle3_hub.generation.tree.costs import step_costs

TREE = {"depth": 3, "tree_top_k": 4, "total_tokens": 8, "adaptive": True}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(costs_mod, "_memo", {})
    monkeypatch.setattr(costs_mod, "_unwritable", set(), raising=False)


@pytest.fixture
def measured(monkeypatch):
    """A target, draft and config whose measurements are counted (the real measurement, with a fixed clock)."""
    calls = []
    monkeypatch.setattr(costs_mod, "_timed", lambda fn, device, repeats=3: 1e-3)
    real = costs_mod.measure

    def counting(costs, *a, **k):
        calls.append(costs.context)
        return real(costs, *a, **k)

    monkeypatch.setattr(costs_mod, "measure", counting)
    target = make_tiny_target("llama")
    draft = random_draft(target)
    config = TreeConfig(**TREE).resolve(torch.device("cpu"), torch.float32, False, draft.config.draft_vocab_size)
    return target, draft, config, calls


def _mutations():
    def times(data, value):
        data["verify"]["1"]["1"] = value
        return data

    def deep(data, value):
        data["longer"]["draft_read"]["1"] = value
        return data

    def field(name, value):
        def change(data):
            data[name] = value
            data["longer"][name] = value
            return data

        return change

    return {
        "a list": lambda data: [],
        "null": lambda data: None,
        "a number": lambda data: 3,
        "lists for numbers": lambda data: {**data, "verify": {"1": [0.1, 0.2]}},
        "a list for a table": lambda data: {**data, "draft_read": [0.1]},
        "a string time": lambda data: times(data, "fast"),
        "NaN": lambda data: times(data, math.nan),
        "infinity": lambda data: times(data, math.inf),
        "zero": lambda data: times(data, 0.0),
        "negative": lambda data: times(data, -1.0),
        "NaN in the longer table": lambda data: deep(data, math.nan),
        "no verify": lambda data: {k: v for k, v in data.items() if k != "verify"},
        "a bad count": lambda data: {**data, "draft_level": {"0": 0.1}},
        "another device": field("device", "cuda:NVIDIA H100 80GB HBM3"),
        "another dtype": field("dtype", "torch.bfloat16"),
        "another width": field("top_k", 2),
    }


@pytest.mark.parametrize("case", list(_mutations()))
def test_a_cached_table_that_fails_a_check_is_measured_again_and_said_so(measured, caplog, case):
    target, draft, config, calls = measured
    rows, slots = 1, config.total_tokens + config.lookup_tokens + 1
    first = step_costs(target, draft, config, rows, slots)
    path = costs_mod.cost_file(first.key)
    good = json.loads(path.read_text())
    path.write_text(json.dumps(_mutations()[case](json.loads(path.read_text()))))
    costs_mod._memo.clear()
    calls.clear()
    with caplog.at_level(logging.WARNING, logger=costs_mod.__name__):
        again = step_costs(target, draft, config, rows, slots)
    assert calls, "the bad table was used"
    assert again.fresh and again.verify == first.verify
    line = [r.getMessage() for r in caplog.records]
    assert len(line) == 1 and str(path) in line[0] and "EAGLE3_HUB_CACHE" in line[0] and "measuring it again" in line[0]
    assert json.loads(path.read_text()) == good  # replaced by a valid table
    costs_mod._memo.clear()
    calls.clear()
    step_costs(target, draft, config, rows, slots)
    assert not calls  # and read back from now on


def test_a_cut_cost_file_is_measured_again(measured, caplog):
    target, draft, config, calls = measured
    first = step_costs(target, draft, config, 1, 9)
    path = costs_mod.cost_file(first.key)
    path.write_text(path.read_text()[:50])
    costs_mod._memo.clear()
    with caplog.at_level(logging.WARNING, logger=costs_mod.__name__):
        step_costs(target, draft, config, 1, 9)
    assert "cannot be read" in caplog.text and str(path) in caplog.text
    assert json.loads(path.read_text())["key"] == first.key


def test_generate_survives_a_cost_file_of_the_wrong_shape(monkeypatch, caplog):
    """The defect: `[]` in the cache made every adaptive generate fail with a traceback until it was deleted."""
    monkeypatch.setattr(costs_mod, "_timed", lambda fn, device, repeats=3: 1e-3)
    target = make_tiny_target("llama")
    draft = random_draft(target)
    ids = prompt(seed=1)
    out = generate(target, draft, ids, max_new_tokens=8, eos_token_id=[], **TREE)
    (path,) = (costs_mod.cache_root() / "tree-costs").glob("*.json")
    path.write_text("[]")
    costs_mod._memo.clear()
    with caplog.at_level(logging.WARNING, logger=costs_mod.__name__):
        again = generate(target, draft, ids, max_new_tokens=8, eos_token_id=[], **TREE)
    assert torch.equal(again.sequences, out.sequences) and torch.equal(out.sequences, plain_greedy(target, ids, 8))
    assert str(path) in caplog.text and json.loads(path.read_text())["format"] == costs_mod.COSTS_FORMAT


def test_an_unwritable_cache_warns_once_and_keeps_the_table_in_memory(measured, tmp_path, monkeypatch, caplog):
    target, draft, config, calls = measured
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger=costs_mod.__name__):
        first = step_costs(target, draft, config, 1, 9)
        measured_once = len(calls)
        again = step_costs(target, draft, config, 1, 9)  # from memory: not measured again
        other = step_costs(target, draft, config.replace(tree_top_k=2), 1, 3)  # another table, same folder
    assert again is first and measured_once == 2 and len(calls) == 4 and other.key != first.key
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert str(blocker / "cache") in lines[0] and "EAGLE3_HUB_CACHE" in lines[0] and "kept in memory" in lines[0]


def test_a_target_cache_that_cannot_be_made_stops_before_converting(tmp_path, monkeypatch):
    """The defect: a GGUF target was de-quantised for tens of seconds, then the write into an impossible cache
    folder failed with a bare `[Errno 20] Not a directory` that named neither the cache nor EAGLE3_HUB_CACHE."""
    from eagle3_hub import targets

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(blocker / "cache"))

    def no_conversion(*a, **k):
        raise AssertionError("converted before the cache was checked")

    monkeypatch.setattr(targets, "_convert_gguf", no_conversion)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=rf"cache folder {blocker / 'cache' / 'gguf'} .*EAGLE3_HUB_CACHE"):
        targets.resolve_target(str(gguf))
