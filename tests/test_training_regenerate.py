"""Training data written through tree decoding (``data.regenerate_with``, ``data.regenerate_draft``): the same
conversations as plain ``generate`` in float32 greedy, sampled synthesis seeded, the decoder and its speed recorded,
and the choice of draft checked before any model loads.

A tiny random float32 Llama with SmolLM2's tokenizer (``tiny_target_dir``) and a random draft sized to it: a random
draft accepts little, but every token it does not propose is the target's own, so the text must not change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.targets import load_target, reference_draft
from eagle3_hub.training.data import GENERATION_REPORT, build_conversations
from eagle3_hub.training.generation import regenerate, regeneration_draft, synthesize_prompts
from eagle3_hub.training.recipe import load_recipe, parse_overrides


@pytest.fixture(scope="module")
def tiny_pair(tiny_target_dir, tmp_path_factory):
    """(target, tokenizer, draft folder): the tiny target in float32 and a random draft saved for it."""
    target, tok = load_target(str(tiny_target_dir), dtype=torch.float32)
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=512).float()
    draft.set_vocab_mapping(torch.randperm(target.config.vocab_size)[:512].sort().values)
    folder = tmp_path_factory.mktemp("tiny_draft")
    draft.save_pretrained(folder)
    return target, tok, str(folder)


def test_tree_decoding_writes_the_conversations_plain_generate_writes(tmp_path, tiny_pair, data_dir):
    target, tok, draft = tiny_pair
    sources = [str(data_dir / "prompts.json"), {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4}]
    # batches of 4 prompts of different lengths (left padding), two user turns
    kw = dict(target=target, tokenizer=tok, max_new_tokens=12, batch_size=4, max_turns=2)
    plain = build_conversations(sources, work_dir=tmp_path / "plain", regenerate_with="generate", **kw)
    tree = build_conversations(sources, work_dir=tmp_path / "tree", regenerate_with="tree", regenerate_draft=draft, **kw)
    assert len(plain) == 10 and sum(len(ex["messages"]) == 4 for ex in plain) == 4
    assert list(tree["messages"]) == list(plain["messages"])
    assert all(m["content"] for ex in tree for m in ex["messages"] if m["role"] == "assistant")

    report = json.loads((tmp_path / "tree" / GENERATION_REPORT).read_text())
    assert report["regenerate_with"] == "tree" and report["draft"] == draft
    (regen,) = [c for name, c in report["calls"].items() if name.startswith("regen-")]
    assert regen[0]["decoder"] == "tree" and regen[0]["draft"] == draft and regen[0]["samples"] >= 10
    assert regen[0]["new_tokens"] > 0 and regen[0]["tokens_per_s"] > 0 and regen[0]["tokens_per_cpu_minute"] > 0
    plain_report = json.loads((tmp_path / "plain" / GENERATION_REPORT).read_text())
    assert {c[0]["decoder"] for c in plain_report["calls"].values()} == {"generate"} and plain_report["draft"] is None
    # every cached answer names its decoder; a rerun from the caches generates nothing and records no call
    lines = [json.loads(line) for p in (tmp_path / "tree").glob("regen-*.jsonl") for line in Path(p).read_text().splitlines()]
    assert {rec["by"] for rec in lines} == {"tree"}
    again = build_conversations(sources, work_dir=tmp_path / "tree", regenerate_with="tree", regenerate_draft=draft, **kw)
    assert list(again["messages"]) == list(plain["messages"])
    assert json.loads((tmp_path / "tree" / GENERATION_REPORT).read_text())["calls"] == report["calls"]


def test_same_forward_writes_the_conversations_plain_generate_writes(tmp_path, tiny_pair, data_dir):
    target, tok, _ = tiny_pair
    sources = [str(data_dir / "prompts.json"), {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4}]
    kw = dict(target=target, tokenizer=tok, synthesize=3, max_new_tokens=12, batch_size=4, max_turns=2)
    plain = build_conversations(sources, work_dir=tmp_path / "plain", regenerate_with="generate", **kw)
    lean = build_conversations(sources, work_dir=tmp_path / "lean", regenerate_with="same_forward", **kw)
    assert list(lean["messages"]) == list(plain["messages"])
    report = json.loads((tmp_path / "lean" / GENERATION_REPORT).read_text())
    assert report["regenerate_with"] == "same_forward" and report["draft"] is None
    (regen,) = [c for name, c in report["calls"].items() if name.startswith("regen-")]
    assert regen[0]["decoder"] == "same_forward" and regen[0]["new_tokens"] > 0
    assert report["calls"]["synth-seed0.jsonl"][0]["decoder"] == "generate"  # sampled: a seed keeps its prompts
    lines = [json.loads(line) for p in (tmp_path / "lean").glob("regen-*.jsonl") for line in Path(p).read_text().splitlines()]
    assert {rec["by"] for rec in lines} == {"same_forward"}


def test_prompt_synthesis_through_tree_decoding(tmp_path, tiny_pair):
    target, tok, draft = tiny_pair
    kw = dict(max_new_tokens=10, batch_size=2, openers=["Write a poem", "Solve the puzzle"])
    # greedy: the prompts plain generate writes
    greedy = [
        synthesize_prompts(target, tok, 2, tmp_path / f"{name}.jsonl", temperature=0.0, draft=d, **kw)
        for name, d in (("greedy-plain", None), ("greedy-tree", draft))
    ]
    assert list(greedy[0]["messages"]) == list(greedy[1]["messages"])
    # sampled: lossless tree sampling, seeded: the same seed writes the same prompts again
    report: dict = {}
    sampled = [
        synthesize_prompts(target, tok, 4, tmp_path / f"sampled-{run}.jsonl", seed=3, draft=draft, report=report, **kw)
        for run in (0, 1)
    ]
    assert list(sampled[0]["messages"]) == list(sampled[1]["messages"])
    assert len({ex["messages"][0]["content"] for ex in sampled[0]}) == 4
    assert report["decoder"] == "tree" and report["samples"] >= 4 and report["new_tokens"] > 0
    assert {json.loads(line)["by"] for line in Path(tmp_path / "sampled-0.jsonl").read_text().splitlines()} == {"tree"}


def test_regenerate_takes_a_loaded_draft_and_reports_its_speed(tmp_path, tiny_pair, data_dir):
    target, tok, draft = tiny_pair
    from datasets import Dataset

    ds = Dataset.from_list([{"messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(3)])
    loaded = Eagle3DraftModel.from_pretrained(draft, dtype=torch.float32)
    runs = {}
    for name, d in (("plain", None), ("tree", loaded)):
        report: dict = {}
        runs[name] = (
            regenerate(ds, target, tok, tmp_path / f"{name}.jsonl", max_new_tokens=24, batch_size=3, draft=d, report=report),
            report,
        )
    assert list(runs["tree"][0]["messages"]) == list(runs["plain"][0]["messages"])
    assert runs["plain"][1]["decoder"] == "generate" and runs["tree"][1]["decoder"] == "tree"
    plain, tree = runs["plain"][1], runs["tree"][1]
    assert tree["new_tokens"] == plain["new_tokens"] > 0  # the same tokens, counted alike
    # one batched forward per new position for generate; tree decoding commits >= 1 token per row and forward
    assert plain["target_forwards"] == 24 and tree["target_forwards"] <= 24 and tree["acceptance_length"] >= 1


def test_the_regeneration_draft_is_chosen_and_checked_before_any_model_loads(tmp_path, tiny_pair):
    _, _, draft = tiny_pair
    shipped = reference_draft(None)
    embedded = str(shipped) if (shipped / "config.json").is_file() else None
    assert regeneration_draft("auto", None, None) == embedded  # the embedded target's reference draft
    assert regeneration_draft("auto", None, str(tmp_path)) is None  # no draft for this target: plain generate
    assert regeneration_draft("auto", draft, str(tmp_path)) == draft
    assert regeneration_draft("tree", draft, None) == draft
    assert regeneration_draft("generate", draft, None) is None
    assert regeneration_draft("same_forward", draft, None) is None  # no draft: the verifier alone
    assert regeneration_draft("auto", "someone/draft-repo", None) == "someone/draft-repo"  # a Hub id
    with pytest.raises(ValueError, match="data.regenerate_with: tree needs an EAGLE-3 draft"):
        regeneration_draft("tree", None, str(tmp_path))
    with pytest.raises(ValueError, match='must be one of auto, tree, generate, same_forward \\(default "auto"\\), got "fast"'):
        regeneration_draft("fast", None, None)
    with pytest.raises(FileNotFoundError, match="no config.json there"):
        regeneration_draft("auto", str(tmp_path), None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        regeneration_draft("tree", str(tmp_path / "missing" / "draft"), None)


def test_a_draft_that_does_not_fit_the_target_is_refused(tmp_path, tiny_pair):
    from tiny_models import make_tiny_target

    target, tok, _ = tiny_pair
    other = Eagle3DraftModel.from_target(make_tiny_target("llama"), draft_vocab_size=64)  # another vocabulary
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match=r"regeneration draft .* \(data.regenerate_draft\): This draft does not fit"):
        build_conversations(
            [],
            target,
            tok,
            tmp_path / "w",
            synthesize=1,
            max_new_tokens=4,
            batch_size=1,
            synthesize_batch_size=1,
            regenerate_with="tree",
            regenerate_draft=str(tmp_path / "other"),
        )


def test_the_recipe_keys_and_their_defaults():
    data = load_recipe()["data"]
    assert data["regenerate_with"] == "auto" and data["regenerate_draft"] is None
    over = parse_overrides(["--data.regenerate_with", "tree", "--data.regenerate_draft", "runs/x/draft"])
    assert load_recipe(None, over)["data"]["regenerate_draft"] == "runs/x/draft"


def test_data_that_needed_no_generation_names_no_decoder(tmp_path, tiny_pair, data_dir):
    target, tok, draft = tiny_pair
    src = {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4, "regenerate": False}
    ds = build_conversations([src], target, tok, tmp_path / "kept", regenerate_with="auto", regenerate_draft=draft)
    assert len(ds) == 4 and not (tmp_path / "kept" / GENERATION_REPORT).exists()


def test_auto_on_a_cpu_answers_through_the_same_forward_and_samples_prompts_with_generate(tmp_path, tiny_pair, data_dir):
    target, tok, draft = tiny_pair
    sources = [str(data_dir / "prompts.json")]
    kw = dict(target=target, tokenizer=tok, synthesize=3, max_new_tokens=12, batch_size=4)
    plain = build_conversations(sources, work_dir=tmp_path / "plain", regenerate_with="generate", **kw)
    auto = build_conversations(sources, work_dir=tmp_path / "auto", regenerate_with="auto", regenerate_draft=draft, **kw)
    assert list(auto["messages"]) == list(plain["messages"])  # the same seed, the same prompts and answers
    report = json.loads((tmp_path / "auto" / GENERATION_REPORT).read_text())
    assert report["regenerate_with"] == "auto" and report["draft"] is None
    (regen,) = [c for name, c in report["calls"].items() if name.startswith("regen-")]
    assert regen[0]["decoder"] == "same_forward"
    assert report["calls"]["synth-seed0.jsonl"][0]["decoder"] == "generate"


def test_sampled_answers_mix_settings_by_share_and_resume_to_the_same_data(tmp_path, tiny_pair, data_dir):
    """data.answer_sampling: each prompt answered at one setting (drawn by its text and the seed), sampled batches
    seeded, so a run killed after its first batch resumes to what an uninterrupted run writes."""
    target, tok, _ = tiny_pair
    sources = [str(data_dir / "prompts.json"), {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4}]
    sampling = [{"temperature": 0}, {"temperature": 1.0, "top_p": 0.9, "share": 2}]
    kw = dict(
        target=target, tokenizer=tok, max_new_tokens=10, batch_size=2, regenerate_with="same_forward", answer_sampling=sampling
    )
    whole = build_conversations(sources, work_dir=tmp_path / "whole", **kw)
    (cache,) = (tmp_path / "whole").glob("regen-*.jsonl")
    recs = [json.loads(line) for line in Path(cache).read_text().splitlines()]
    tags = [r["sampling"] for r in recs]
    assert set(tags) == {"greedy", "T=1,top_p=0.9"} and {r["by"] for r in recs} == {"same_forward"}
    # a sample's setting follows its prompt (its text and the seed), not its place in the data or a batch
    from eagle3_hub.training.generation import answer_settings, assign_setting
    from eagle3_hub.training.sources import prompt_key

    settings = answer_settings(sampling)
    assert all(settings[assign_setting(settings, prompt_key(r["messages"]), 0)].tag == r["sampling"] for r in recs)
    # kill after the first batch: keep its lines only, then rerun
    (tmp_path / "resumed").mkdir()
    first = recs[:2]
    (tmp_path / "resumed" / cache.name).write_text("".join(json.dumps(r) + "\n" for r in first))
    resumed = build_conversations(sources, work_dir=tmp_path / "resumed", **kw)
    assert list(resumed["messages"]) == list(whole["messages"])
    # greedy answers are plain greedy's; the sampled ones are not all the same as greedy's
    greedy = build_conversations(
        sources,
        work_dir=tmp_path / "greedy",
        target=target,
        tokenizer=tok,
        max_new_tokens=10,
        batch_size=2,
        regenerate_with="same_forward",
    )
    greedy_by_prompt = {json.dumps(ex["messages"][0]): ex["messages"] for ex in greedy}
    for r in recs:
        same = greedy_by_prompt[json.dumps(r["messages"][0])] == r["messages"]
        if r["sampling"] == "greedy":
            assert same
    assert not all(greedy_by_prompt[json.dumps(r["messages"][0])] == r["messages"] for r in recs if r["sampling"] != "greedy")


def test_sampled_answers_of_kept_prompts_stay_beside_their_greedy_answers(tmp_path, tiny_pair, data_dir):
    target, tok, _ = tiny_pair
    kept = {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4, "regenerate": False}
    again = {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4, "regenerate": True}
    kw = dict(target=target, tokenizer=tok, max_new_tokens=10, batch_size=4, regenerate_with="same_forward")
    greedy_only = build_conversations([kept, again], work_dir=tmp_path / "g", **kw)
    sampled = build_conversations(
        [kept, again], work_dir=tmp_path / "s", answer_sampling=[{"temperature": 1.0, "top_p": 0.9}], **kw
    )
    assert len(greedy_only) == 4  # one answer per prompt, as before
    assert len(sampled) == 8  # the kept answers and the sampled ones


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"temperature": -1}, r"data.answer_sampling\[0\].temperature must be a non-negative number \(default 0.0\), got -1"),
        ({"temperature": 1, "top_p": 0}, r"data.answer_sampling\[0\].top_p must be a number in \(0, 1\] \(default 1.0\), got 0"),
        ({"temperature": "hot"}, "temperature must be a non-negative number"),
        ({"temperature": float("inf")}, "temperature must be a non-negative number .*got Infinity"),
        ({"share": float("nan")}, "share must be a positive number .*got NaN"),
        (
            {"temp": 1},
            r"data.answer_sampling\[0\] has no key `temp` \(did you mean `temperature`\?\): its keys are "
            "temperature, top_p, share",
        ),
    ],
)
def test_bad_answer_sampling_is_named(bad, says):
    from eagle3_hub.training.generation import answer_settings
    from eagle3_hub.training.sources import DataError

    with pytest.raises(DataError, match=says):
        answer_settings([bad])


def test_several_sampled_answers_per_prompt_and_no_held_out_prompt_in_training(tmp_path, tiny_pair, data_dir):
    """data.answers_per_prompt: each prompt answered k times (sampled, seeded, a cache of its own); the prompt column
    groups a prompt's answers, and the held-out split leaves a held-out prompt's other answers out of training."""
    from datasets import Dataset

    from eagle3_hub.training.splits import held_out_split

    target, tok, _ = tiny_pair
    src = {"path": str(data_dir / "ultrachat.parquet"), "max_samples": 4}
    kw = dict(target=target, tokenizer=tok, max_new_tokens=10, batch_size=4, regenerate_with="same_forward", temperature=1.0)
    one = build_conversations([src], work_dir=tmp_path / "w", **kw)
    three = build_conversations([src], work_dir=tmp_path / "w", answers_per_prompt=3, **kw)
    assert len(list((tmp_path / "w").glob("regen-*.jsonl"))) == 2  # one answer's cache is not another count's
    assert len(one) == 4 and 8 < len(three) <= 12  # answers that came out the same are one sample
    assert sorted(set(three["prompt"])) == sorted(set(one["prompt"]))
    for key in set(three["prompt"]):
        answers = [ex["messages"] for ex in three if ex["prompt"] == key]
        assert len({json.dumps(a) for a in answers}) == len(answers)
    again = build_conversations([src], work_dir=tmp_path / "w", answers_per_prompt=3, **kw)  # from its cache
    assert list(again["messages"]) == list(three["messages"])

    rows = Dataset.from_list([{"index": i, "eval_ok": True, "prompt": p} for i, p in enumerate(three["prompt"])])
    split = held_out_split(rows, eval_samples=1, seed=0)
    (held,) = split["test"]["index"]
    assert "prompt" not in split["train"].column_names
    assert all(three["prompt"][i] != three["prompt"][held] for i in split["train"]["index"])
    assert len(split["train"]) == len(rows) - sum(p == three["prompt"][held] for p in three["prompt"])


def test_several_answers_of_synthesised_prompts_whose_dataset_answers_are_kept(tmp_path, tiny_pair, data_dir):
    """The defect: with `data.regenerate: false`, the answers of synthesised prompts went through the dedupe by
    prompt of the kept sources, which left one answer a prompt whatever answers_per_prompt said."""
    target, tok, _ = tiny_pair
    kw = dict(target=target, tokenizer=tok, synthesize=3, max_new_tokens=8, batch_size=4, temperature=1.0)
    ds = build_conversations([], work_dir=tmp_path, regenerate_responses=False, answers_per_prompt=2, **kw)
    assert len(set(ds["prompt"])) <= 3 < len(ds)


@pytest.mark.parametrize(
    "kw, says",
    [
        ({}, r"data: answers_per_prompt: 2 asks for several answers .* set data.temperature above 0"),
        (
            {"answer_sampling": [{"temperature": 0}, {"temperature": 1.0}]},
            "leave only entries with temperature > 0 in data.answer_sampling",
        ),
        ({"temperature": 1.0, "regenerate_responses": False}, "the target answers no prompt here"),
    ],
)
def test_several_answers_per_prompt_need_sampled_answers_of_the_target(tmp_path, tiny_pair, data_dir, kw, says):
    from eagle3_hub.training.sources import DataError

    target, tok, _ = tiny_pair
    with pytest.raises(DataError, match=says):
        build_conversations(
            [str(data_dir / "prompts.json")], target=target, tokenizer=tok, work_dir=tmp_path, answers_per_prompt=2, **kw
        )


def test_the_recipe_refuses_greedy_answers_several_times():
    with pytest.raises(ValueError, match=r"data: answers_per_prompt: 3 asks for several answers .* above 0"):
        load_recipe(overrides=parse_overrides(["--data.answers_per_prompt", "3"]))
    sampled = load_recipe(overrides=parse_overrides(["--data.answers_per_prompt", "3", "--data.temperature", "0.7"]))
    assert sampled["data"]["answers_per_prompt"] == 3
