"""Loops cut out of training data (``data.max_repeat_share``): where a loop begins (``repetition.loop_start``), the
cut applied when the data is assembled (``data.cut_loops``: the caches keep the target's raw answers, so another
threshold generates nothing), its counts in the generation report, and the recipe key's check."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from eagle3_hub.repetition import LOOP_NGRAM, loop_start, repeated_ngram_share
from eagle3_hub.targets import load_target
from eagle3_hub.training.data import GENERATION_REPORT, build_conversations, cut_loops
from eagle3_hub.training.recipe import load_recipe
from eagle3_hub.training.sources import DataError

SENTENCE = "I think it was 1999.\n"


def test_loop_start_keeps_the_looping_sentence_once():
    words = ["Q", ":", "when", "was", "it", "?", "A", ":"] + ["I", "think", "it", "was", "1999", "."] * 10
    assert words[: loop_start(words)] == ["Q", ":", "when", "was", "it", "?", "A", ":", "I", "think", "it", "was", "1999", "."]
    assert loop_start(list(range(40))) is None  # nothing repeats
    assert loop_start([5] * 30) == 1  # one token again and again: kept once
    # a phrase that recurs once before the loop does not cut the answer short; without a long run, the first repeat
    phrase = ["the", "number", "of", "apples", "is", "ten", "and"] + ["so"]
    text = phrase + list("abcdefghijkl") + phrase + list("mnopqrstuv") + ["I", "think", "it", "was", "1999", "."] * 6
    start = loop_start(text)
    assert text[start : start + 5] == ["I", "think", "it", "was", "1999"] and start > 2 * len(phrase)
    short = phrase + list("abcdefghijkl") + phrase
    assert loop_start(short) == len(phrase) + 12


def _conversation(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def test_answers_above_the_threshold_are_cut_where_the_loop_begins(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prose = "The train left the station at noon, and by evening it had crossed the river and the hills beyond."
    rows = [
        _conversation("When did it happen?", "Hard to say. " + SENTENCE * 60),  # loops after a start: cut
        _conversation("And the year?", "1999. " * 80),  # loops from its first token: dropped
        _conversation("Tell me a story.", prose),  # no loop: kept whole
        _conversation("The cat sat. " * 30, prose + " Then it stopped."),  # a looping prompt: dropped
    ]
    ds = Dataset.from_list([{"messages": m} for m in rows])
    out, report = cut_loops(ds, tok, 0.3)
    answers = [ex["messages"][1]["content"] for ex in out]
    # the looping sentence once (a token or so of its second time may stay: " I" after "say." is another token
    # than "I" after a line break, so the first repeated 8-gram starts one token later)
    assert answers[0].startswith("Hard to say. " + SENTENCE) and answers[0].count("1999") == 1
    assert answers[1] == prose
    assert report["cut"] == 1 and report["dropped"] == 1 and report["dropped_prompts"] == 1
    assert report["answers"] == 4 and report["loop_share"] > 0.5 and report["loop_share_kept"] == 0.0
    # the measure is the bench's: token ids of the target's tokenizer
    loop_ids = tok("Hard to say. " + SENTENCE * 60, add_special_tokens=False).input_ids
    assert repeated_ngram_share(loop_ids) > 0.3 and len(tok(answers[0]).input_ids) >= LOOP_NGRAM
    # the held-out split's groups stay with their rows
    grouped, _ = cut_loops(ds.add_column("prompt", ["a", "b", "c", "d"]), tok, 0.3)
    assert list(grouped["prompt"]) == ["a", "c"] and list(grouped["messages"]) == list(out["messages"])
    # without a threshold nothing changes, but the loops are measured
    same, measured = cut_loops(ds, tok, None)
    assert same is ds and measured == {"max_repeat_share": None, "answers": 4, "loop_share": report["loop_share"]}


def test_a_threshold_cuts_the_cached_answers_without_generating_again(tmp_path, tiny_target_dir, data_dir):
    """The tiny target loops ("freezer freezer ..."): the raw answers stay in the regen cache and the cut comes when
    the data is assembled, so a run with a threshold reuses the cache, generates nothing, and reports the cut."""
    target, tok = load_target(str(tiny_target_dir), dtype=torch.float32)
    sources = [str(data_dir / "prompts.json"), {"path": str(data_dir / "sharegpt.jsonl"), "max_samples": 10}]
    kw = dict(target=target, tokenizer=tok, work_dir=tmp_path, max_new_tokens=48, batch_size=8, regenerate_with="same_forward")
    raw = build_conversations(sources, **kw)
    (cache,) = tmp_path.glob("regen-*.jsonl")
    cached, calls = cache.read_text(), json.loads((tmp_path / GENERATION_REPORT).read_text())["calls"]
    shares = [repeated_ngram_share(tok(ex["messages"][-1]["content"], add_special_tokens=False).input_ids) for ex in raw]
    assert sum(s > 0.15 for s in shares) >= 3  # the raw answers loop

    cut = build_conversations(sources, max_repeat_share=0.15, **kw)
    assert cache.read_text() == cached  # the cache keeps the raw answers
    report = json.loads((tmp_path / GENERATION_REPORT).read_text())
    assert report["calls"] == calls  # nothing generated again
    loops = report["loops"]
    assert loops["max_repeat_share"] == 0.15 and loops["cut"] + loops["dropped"] == sum(s > 0.15 for s in shares)
    assert loops["cut"] >= 1 and len(cut) == len(raw) - loops["dropped"] - loops["dropped_prompts"]
    raw_by_prompt = {ex["messages"][0]["content"]: ex["messages"][-1]["content"] for ex in raw}
    shortened = 0
    for ex in cut:
        answer, before = ex["messages"][-1]["content"], raw_by_prompt[ex["messages"][0]["content"]]
        assert before.startswith(answer)
        shortened += answer != before
    assert shortened == loops["cut"]
    assert loops["loop_share_kept"] < loops["loop_share"]


def test_without_a_threshold_data_that_needed_no_generation_writes_no_report(tmp_path, tiny_target_dir, data_dir):
    target, tok = load_target(str(tiny_target_dir), dtype=torch.float32)
    src = {"path": str(data_dir / "ultrachat.parquet"), "regenerate": False}
    build_conversations([src], target, tok, tmp_path / "plain", regenerate_with="generate")
    assert not (tmp_path / "plain" / GENERATION_REPORT).exists()
    build_conversations([src], target, tok, tmp_path / "cut", regenerate_with="generate", max_repeat_share=0.5)
    report = json.loads((tmp_path / "cut" / GENERATION_REPORT).read_text())
    assert report["loops"]["cut"] == report["loops"]["dropped"] == 0 and "calls" not in report


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, "high", True, [0.2]])
def test_a_bad_max_repeat_share_is_named_when_the_recipe_is_read(tmp_path, bad):
    config = tmp_path / "r.yaml"
    config.write_text(f"data:\n  max_repeat_share: {json.dumps(bad)}\n")
    with pytest.raises(ValueError, match=r"data.max_repeat_share must be a number in \(0, 1\] or null"):
        load_recipe(config)
    with pytest.raises(DataError, match="max_repeat_share"):  # called as a library, before anything is read
        build_conversations([], None, None, tmp_path, max_repeat_share=bad)


def test_max_repeat_share_is_off_by_default_and_takes_numbers_up_to_one():
    assert load_recipe()["data"]["max_repeat_share"] is None
    assert load_recipe(None, {"data": {"max_repeat_share": 1}})["data"]["max_repeat_share"] == 1
    assert load_recipe(None, {"data": {"max_repeat_share": 0.2}})["data"]["max_repeat_share"] == 0.2


def test_a_recipe_threshold_reaches_the_training_data(tmp_path, tiny_target_dir, data_dir):
    """`eagle3-hub train` passes data.max_repeat_share to the data it builds: the run's metrics count the cut."""
    from training_helpers import recipe_for

    from eagle3_hub.training.train import train

    sources = [data_dir / "prompts.json", {"path": str(data_dir / "sharegpt.jsonl"), "max_samples": 10}]
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        sources,
        data={"max_new_tokens": 48, "regenerate_with": "same_forward", "max_repeat_share": 0.15, "max_length": 96},
        train={"max_steps": 2, "save_every": 2, "eval_every": 2},
    )
    train(recipe)
    metrics = json.loads((tmp_path / "work" / "draft" / "training_metrics.json").read_text())
    loops = metrics["data"]["generation"]["loops"]
    assert loops["max_repeat_share"] == 0.15 and loops["cut"] + loops["dropped"] >= 1
