"""A base model (a tokenizer without a chat template) trains through the recipe's `target.chat_template`."""

from __future__ import annotations

import json
import shutil

import pytest
from training_helpers import recipe_for, write_jsonl

from eagle3_hub.training.sources import DataError
from eagle3_hub.training.train import train

PLAIN = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'user' %}\n\n{% endif %}{% endfor %}"


@pytest.fixture(scope="module")
def base_target_dir(tmp_path_factory, tiny_target_dir):
    """The tiny target with its tokenizer's chat template removed, as a base model ships it."""
    folder = tmp_path_factory.mktemp("base-target")
    shutil.copytree(tiny_target_dir, folder, dirs_exist_ok=True)
    for name in ("tokenizer_config.json",):
        config = json.loads((folder / name).read_text())
        config.pop("chat_template", None)
        (folder / name).write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def prompts(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"The number {i} is followed by"} for i in range(24)])


def test_a_base_model_without_chat_template_is_refused_with_the_key_to_set(tmp_path, base_target_dir):
    with pytest.raises(DataError, match="target.chat_template"):
        train(recipe_for(tmp_path, base_target_dir, [prompts(tmp_path)]))


def test_recipe_chat_template_trains_a_base_model(tmp_path, base_target_dir):
    recipe = recipe_for(tmp_path, base_target_dir, [prompts(tmp_path)], target={"chat_template": PLAIN})
    out = train(recipe)
    metrics = json.loads((out / "training_metrics.json").read_text())
    assert metrics["data"]["kept"] == 24
    assert metrics["steps"] == recipe["train"]["max_steps"]
    assert metrics["acceptance"]["masked_share"] < 0.5  # the target's own continuations: the draft vocabulary holds them


# ------------------------------------------------------------------------------ natural text as a source
HEADER = (
    "Copyright the authors. Licensed under the Apache License, Version 2.0; you may not use this file except "
    "in compliance with the License. You may obtain a copy of the License from the Apache web site.\n\n"
)


def documents(folder):
    """Two .txt files that open alike (a licence header), a long one among them, and a jsonl of `text` records."""
    folder.mkdir()
    story = "\n".join(f"Day {i}: the ship sailed on past island number {i}, and the crew counted the gulls." for i in range(60))
    (folder / "story.txt").write_text(HEADER + story)
    (folder / "notes.md").write_text(HEADER + "These notes describe the harbour and its lighthouses at some length.")
    (folder / "ignored.csv").write_text("a,b\n1,2\n")
    records = write_jsonl(
        folder.parent / "web.jsonl", [{"text": f"Page {i}. " + "Words about the weather. " * 20, "url": i} for i in range(3)]
    )
    return folder, records, [HEADER + story, HEADER + "These notes describe the harbour and its lighthouses at some length."]


def test_documents_become_openings_and_their_continuations(tmp_path):
    from eagle3_hub.training.sources import TEXT_MAX_CHARS, TEXT_OPENING_CHARS, load_source, text_samples

    folder, records, docs = documents(tmp_path / "docs")
    samples = text_samples(docs)
    for s in samples:
        (user, opening), (assistant, rest) = [(m["role"], m["content"]) for m in s["messages"]]
        assert (user, assistant) == ("user", "assistant")
        assert len(opening) <= TEXT_OPENING_CHARS and len(opening) + 1 + len(rest) <= TEXT_MAX_CHARS
    # nothing is lost: the pieces, opening then continuation, are the documents' words in order
    assert " ".join(m["content"] for s in samples for m in s["messages"]).split() == " ".join(docs).split()
    assert len(samples) >= 4  # the long story is cut into pieces
    # a folder (.txt, .md) and records with a `text` field; other files and fields are not read
    ds = load_source({"path": str(folder), "kind": "text"})
    assert sorted(map(json.dumps, ds["messages"])) == sorted(json.dumps(s["messages"]) for s in samples)
    web = load_source({"path": str(records), "kind": "text", "opening_chars": 40, "max_chars": 600})
    assert len(web) == 3 and all(len(ex["messages"][0]["content"]) <= 40 for ex in web)
    assert web[0]["messages"][0]["content"].startswith("Page 0.")


def test_a_text_source_reads_code_files_when_it_names_their_endings(tmp_path):
    from eagle3_hub.training.sources import load_source, text_samples

    folder, _, docs = documents(tmp_path / "docs")
    code = 'def area(r):\n    """The area of a circle of radius r."""\n    return 3.14159 * r * r\n' * 4
    (folder / "lib").mkdir()
    (folder / "lib" / "geometry.py").write_text(code)
    (folder / "lib" / "geometry.pyc").write_bytes(b"\x00\x01")  # another ending: never read
    read = {json.dumps(m) for m in load_source({"path": str(folder), "kind": "text"})["messages"]}
    assert read == {json.dumps(s["messages"]) for s in text_samples(docs)}  # by default .txt and .md only
    py = load_source({"path": str(folder), "kind": "text", "suffixes": [".py"]})
    assert {json.dumps(m) for m in py["messages"]} == {json.dumps(s["messages"]) for s in text_samples([code])}
    both = load_source({"path": str(folder), "kind": "text", "suffixes": [".py", ".txt", ".md"]})
    assert len(both) == len(py) + len(read)


@pytest.mark.parametrize(
    "source, says",
    [
        ({"kind": "txt"}, r"data source '.*': kind must be one of chat, text \(default \"chat\"\), got \"txt\""),
        ({"opening_chars": 100}, "opening_chars belong to documents: add `kind: text`"),
        ({"kind": "text", "max_chars": 0}, "max_chars must be a positive integer"),
        ({"kind": "text", "field": "body"}, "reads each record's `body` field, but its fields are text, url"),
        ({"kind": "text", "suffixes": ["py"]}, r"suffixes must list the endings .* each with its dot \(e.g. \[.py, .c\]\)"),
        ({"kind": "text", "suffixes": [".jsonl"]}, "suffixes name text files; .json, .jsonl and .parquet files are read as"),
        ({"suffixes": [".py"]}, "suffixes belong to documents: add `kind: text`"),
    ],
)
def test_a_bad_text_source_is_named(tmp_path, source, says):
    from eagle3_hub.training.sources import load_source

    _, records, _ = documents(tmp_path / "docs")
    with pytest.raises(DataError, match=says):
        load_source({"path": str(records), **source})


def test_a_recipe_with_an_unknown_source_kind_is_refused_when_read(tmp_path):
    from eagle3_hub.training.recipe import load_recipe

    (tmp_path / "r.yaml").write_text("data:\n  sources:\n    - {path: docs, kind: txt}\n")
    with pytest.raises(
        ValueError, match=r'r.yaml: data.sources\[0\].kind must be one of chat, text \(default "chat"\), got "txt"'
    ):
        load_recipe(tmp_path / "r.yaml")
    assert load_recipe(None, {"data": {"sources": ["a.jsonl", {"path": "docs", "kind": "text"}]}})


def test_text_sources_are_kept_as_written_and_pieces_that_open_alike_both_stay(tmp_path, tiny_target_dir):
    import torch

    from eagle3_hub.targets import load_target
    from eagle3_hub.training.data import GENERATION_REPORT, build_conversations
    from eagle3_hub.training.sources import text_samples

    target, tok = load_target(str(tiny_target_dir), dtype=torch.float32)
    folder, records, docs = documents(tmp_path / "docs")
    # regenerate on (the default) answers prompts, but natural text is what it is
    ds = build_conversations([{"path": str(folder), "kind": "text"}], target, tok, tmp_path / "w", regenerate_with="generate")
    want = text_samples(docs)
    assert sorted(map(json.dumps, ds["messages"])) == sorted(map(json.dumps, (s["messages"] for s in want)))
    assert sum(m[0]["content"].startswith("Copyright") for m in ds["messages"]) == 2  # same opening, both kept
    # pieces whose openings are the same text stay two groups: a piece held out keeps its twin in training
    alike = build_conversations([{"path": str(folder), "kind": "text", "opening_chars": 20}], target, tok, tmp_path / "a")
    firsts = [m[0]["content"] for m in alike["messages"]]
    assert any(firsts.count(f) > 1 for f in firsts) and len(set(alike["prompt"])) == len(alike)
    assert not (tmp_path / "w" / GENERATION_REPORT).exists()  # nothing generated
    # `regenerate: true` on a text source: the target continues each opening
    again = build_conversations(
        [{"path": str(records), "kind": "text", "regenerate": True}],
        target,
        tok,
        tmp_path / "r",
        regenerate_with="generate",
        max_new_tokens=8,
    )
    report = json.loads((tmp_path / "r" / GENERATION_REPORT).read_text())
    assert len(again) == 3 and any(name.startswith("regen-") for name in report["calls"])
    assert all(not m[1]["content"].startswith("Words about") for m in again["messages"])


def test_a_base_model_trains_on_natural_text(tmp_path, base_target_dir):
    from eagle3_hub.training.sources import text_samples

    folder, _, docs = documents(tmp_path / "docs")
    # with prompts the target continues: the draft vocabulary then holds the tiny random target's favourite tokens,
    # which it predicts on the documents too (a real target's next tokens on text are the text's common ones)
    recipe = recipe_for(
        tmp_path,
        base_target_dir,
        [prompts(tmp_path), {"path": str(folder), "kind": "text"}],
        target={"chat_template": PLAIN},
        data={"max_length": 128},
    )
    out = train(recipe)
    metrics = json.loads((out / "training_metrics.json").read_text())
    assert metrics["data"]["kept"] == 24 + len(text_samples(docs))
    assert metrics["steps"] == recipe["train"]["max_steps"]
    # the documents' continuations are in the data as written: the target wrote only the prompts' answers
    (regen,) = [c for name, c in metrics["data"]["generation"]["calls"].items() if name.startswith("regen-")]
    assert regen[0]["samples"] == 24
    assert metrics["data"]["generation"]["loops"]["answers"] == metrics["data"]["kept"]  # loops measured, shown
