"""Loops made visible: the share of an output's 8-grams that repeat an earlier one (``eagle3_hub.repetition``),
reported beside every bench row and flagged above ``LOOP_SHARE_FLAG``; the continuation suite and the defaults of a
base model's bench."""

from __future__ import annotations

import types

import pytest

from eagle3_hub.benchmark.suites import load_suite
from eagle3_hub.commands.bench import defaults_for, parse_temperatures
from eagle3_hub.repetition import LOOP_SHARE_FLAG, repeated_ngram_share, repeated_ngrams


def test_repeated_ngram_share_counts_what_repeats_an_earlier_ngram():
    text = ["the", "cat", "sat", "on", "the", "mat", "and", "then", "it", "ran", "away", "from", "the", "dog"]
    assert repeated_ngram_share(text) == 0.0
    loop = ["I", "think", "it", "was", "1999", "."] * 10  # a sentence sixty times over: all but its first n-grams repeat
    share = repeated_ngram_share(loop)
    assert share == pytest.approx((len(loop) - 8 + 1 - 6) / (len(loop) - 8 + 1))
    assert share > LOOP_SHARE_FLAG
    assert repeated_ngram_share([1, 2, 3]) == 0.0  # shorter than one n-gram and another
    assert repeated_ngram_share([7] * 20, n=2) == pytest.approx(18 / 19)


def test_pooled_share_counts_each_output_within_itself():
    a = list(range(20))  # no repeat
    b = [1, 2, 3] * 7  # loops
    repeated, total = repeated_ngrams([a, b])
    assert total == 13 + 14
    assert repeated == round(repeated_ngram_share(b) * 14)
    # the same n-gram in two outputs is no loop
    assert repeated_ngrams([a, a]) == (0, 26)


def test_the_continuation_suite_ships_openings_of_documents():
    (suite,) = load_suite("continuation")
    assert suite.name == "continuation" and len(suite) == 16
    assert {q.category for q in suite.questions} == {"news", "encyclopedia", "story", "code"}
    assert all(len(q.turns) == 1 and len(q.turns[0]) > 150 for q in suite.questions)


def test_a_base_model_is_benched_on_continuations_greedy_and_sampled():
    base, chat = types.SimpleNamespace(chat_template=None), types.SimpleNamespace(chat_template="{{ x }}")
    assert defaults_for(base, None, None) == ("continuation", "0,0.7,1")
    assert defaults_for(chat, None, None) == ("mt_bench", "0")
    assert defaults_for(base, "mt_bench", "0") == ("mt_bench", "0")  # what the command line says wins
    assert parse_temperatures("0,0.7,1") == [0.0, 0.7, 1.0]
    with pytest.raises(ValueError, match="numbers >= 0"):
        parse_temperatures("-1")
    with pytest.raises(ValueError, match="numbers >= 0"):
        parse_temperatures("nan")


def test_every_bench_row_reports_its_loop_share_and_flags_loops():
    import torch

    from eagle3_hub.benchmark import bench, machine, report

    def rec(method, qid, ids):
        return bench.TurnRecord("s", qid, "c", 1, "greedy", method, 5, len(ids), 0.1, 0.0, 0.1, len(ids), [len(ids)], 1.0, ids)

    natural, looping = list(range(40)), [5, 6, 7, 8] * 10
    records = [rec("plain", 1, natural), rec("plain", 2, natural), rec("lookup", 1, natural), rec("lookup", 2, looping)]
    rows = {r["method"]: r for r in bench.summarize(records) if r["suite"] == "s"}
    assert rows["plain"]["loop_share"] == 0.0
    assert rows["lookup"]["loop_share"] == pytest.approx(repeated_ngrams([natural, looping])[0] / (33 + 33))
    results = {
        "results": bench.summarize(records),
        "lossless": {},
        "machine": machine.machine_info(torch.device("cpu")),
        "settings": {"target": "t", "draft": "d", "suites": [{"name": "s", "questions": 2}], "max_new_tokens": 40},
    }
    text = report.markdown_report(results)
    assert "Loop share" in text and f"{rows['lookup']['loop_share']:.2f} LOOPS" not in text  # below the flag
    records.append(rec("lookup", 3, looping))
    results["results"] = bench.summarize(records)
    share = next(r["loop_share"] for r in results["results"] if r["method"] == "lookup" and r["suite"] == "s")
    assert share > LOOP_SHARE_FLAG and f"{share:.2f} LOOPS" in report.markdown_report(results)
