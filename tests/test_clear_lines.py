"""Small inputs that were taken silently or failed without naming their cause: each now gets one clear line (or a
warning), and what a kill leaves behind is cleaned or redone on the next run."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os

import pytest
import torch
from test_reliability import _cli
from tiny_models import make_tiny_target


# ---------------------------------------------------------------------------------------------- bench flags
@pytest.mark.parametrize(
    "argv, says",
    [
        (("--methods", ""), "--methods: give at least one method"),
        (("--methods", " , "), "--methods: give at least one method"),
        (("--assistant-tokens", "0"), "--assistant-tokens must be at least 1, got 0"),
        (("--lookup-tokens", "-1"), "--lookup-tokens must be at least 1, got -1"),
        (("--sweep", "--depth", "0,3"), "--depth 0,3: depth must be a positive integer, got 0"),
        (("--tree-lookup-tokens", "-1"), "--tree-lookup-tokens -1: lookup_tokens must be a non-negative integer"),
        (("--min-node-prob", "1.5"), "--min-node-prob 1.5: min_node_prob must be a probability in [0, 1)"),
        (("--trees", "depth=0"), "depth must be a positive integer, got 0"),
    ],
)
def test_bench_refuses_flags_it_would_drop_or_ignore(capsys, tmp_path, argv, says):
    """The defects: `--methods ''` ran plain only, `--assistant-tokens 0` was taken, `--sweep --depth 0,3` dropped
    the 0 silently, `--lookup-tokens -1` failed in transformers without naming the flag. (A short run, should a
    flag be taken again.)"""
    code, err = _cli(
        capsys,
        "bench",
        "--max-new-tokens",
        "2",
        "--num-questions",
        "1",
        "--max-turns",
        "1",
        "--warmup",
        "0",
        "--quiet",
        "--no-chart",
        "--out",
        str(tmp_path / "out"),
        *argv,
    )
    assert code == 2 and says in err, err


# ---------------------------------------------------------------------------------------------- text sources
def test_a_binary_text_source_is_refused_naming_the_file(tmp_path, caplog):
    from eagle3_hub.training.sources import DataError, load_source

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("An opening sentence that goes on. " * 40)
    (docs / "b.txt").write_bytes(bytes(range(256)) * 64)  # a binary file named .txt
    with pytest.raises(DataError, match=r"b\.txt is not UTF-8 text \(it holds NUL bytes"):
        load_source({"path": str(docs), "kind": "text"})
    (docs / "b.txt").write_bytes(os.urandom(4096).replace(b"\0", b"\1"))
    with pytest.raises(DataError, match=r"b\.txt is not UTF-8 text \(\d+ of its characters do not decode"):
        load_source({"path": str(docs), "kind": "text"})
    # a few stray bytes in text: read, said in a warning naming the file
    (docs / "b.txt").write_bytes(("Another document, long enough to split. " * 40).encode() + b"caf\xe9 " + b"end. " * 10)
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.training.sources"):
        ds = load_source({"path": str(docs), "kind": "text"})
    assert len(ds) >= 2 and "b.txt: 1 bytes are not UTF-8" in caplog.text


# ---------------------------------------------------------------------------------------------- killed writers
def _killed_inside(out, replace_calls_before_kill=None):
    """In a forked child: start atomic_dir(out) and die (os._exit: no handler runs) inside the block, or at the
    given os.replace of the swap."""
    from eagle3_hub import atomic

    def child():
        if replace_calls_before_kill is not None:
            real, calls = os.replace, []

            def replace(a, b):
                if len(calls) == replace_calls_before_kill:
                    os._exit(9)
                calls.append(1)
                real(a, b)

            atomic.os.replace = replace
            with atomic.atomic_dir(out) as tmp:
                (tmp / "new.txt").write_text("new")
        with atomic.atomic_dir(out) as tmp:
            (tmp / "big.bin").write_bytes(b"\0" * 1_000_000)
            os._exit(9)

    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join()
    assert p.exitcode == 9


def test_a_killed_convert_leaves_no_temporary_folder_after_the_next_run(tmp_path):
    """The defect: a killed `convert` left its hidden temporary folder (21 MB for the reference draft) for good."""
    from test_card_hub import make_draft_folder

    from eagle3_hub.formats import convert

    src = make_draft_folder(tmp_path / "src")
    out = tmp_path / "out"
    _killed_inside(out)
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert len(left) == 1 and str(os.getpid()) not in left[0]  # named by the killed writer's process id
    convert(str(src), str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
    assert (out / "config.json").is_file()


def test_a_kill_between_the_renames_is_put_right_by_the_next_write(tmp_path):
    from eagle3_hub.atomic import atomic_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    _killed_inside(out, replace_calls_before_kill=1)  # the old folder moved aside, the new one not yet in place
    assert not out.exists() and len(list(tmp_path.glob(".out.old-*/out/old.txt"))) == 1
    with pytest.raises(RuntimeError), atomic_dir(out):
        raise RuntimeError("this write fails: the old folder must be back")
    assert (out / "old.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_running_writers_temporary_folder_is_left_alone(tmp_path):
    from eagle3_hub.atomic import atomic_dir

    out = tmp_path / "out"
    mine = tmp_path / f".out.tmp-{os.getpid()}-abcd"  # this process: still running
    mine.mkdir()
    foreign = tmp_path / ".out.tmp-notapid"  # not named by this module's writers
    foreign.mkdir()
    with atomic_dir(out) as tmp:
        (tmp / "x").write_text("x")
    assert mine.is_dir() and foreign.is_dir() and (out / "x").is_file()


def test_a_regeneration_line_cut_by_a_kill_is_redone(tmp_path, tiny_target_dir, capsys):
    """The defect: the next record was appended to the cut line, which stayed unreadable for good."""
    from datasets import Dataset

    from eagle3_hub.targets import load_target
    from eagle3_hub.training.generation import regenerate

    target, tok = load_target(str(tiny_target_dir), dtype=torch.float32)
    ds = Dataset.from_list([{"messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(3)])
    cache = tmp_path / "regen.jsonl"
    whole = regenerate(ds, target, tok, cache, max_new_tokens=6, batch_size=1)
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # the third line cut by a kill
    capsys.readouterr()
    again = regenerate(ds, target, tok, cache, max_new_tokens=6, batch_size=1)
    assert "its last line was cut" in capsys.readouterr().out
    assert list(again["messages"]) == list(whole["messages"])
    records = [json.loads(line) for line in cache.read_text().splitlines()]  # every line readable again
    assert sorted(r["i"] for r in records) == [0, 1, 2]
    capsys.readouterr()
    regenerate(ds, target, tok, cache, max_new_tokens=6, batch_size=1)  # nothing left to redo, nothing said
    assert "cut" not in capsys.readouterr().out and len(cache.read_text().splitlines()) == 3


# ---------------------------------------------------------------------------------------------- weights
def test_bench_names_weights_made_non_finite_after_loading(tmp_path):
    """The defect: a target whose weights turned NaN after loading still got a lossless report, of NaN gaps."""
    from test_bench import _suite, make_tokenizer

    from eagle3_hub import Eagle3DraftModel
    from eagle3_hub.benchmark.bench import run_benchmark

    target = make_tiny_target("llama")
    draft = Eagle3DraftModel.from_target(target).eval()
    suite = _suite(tmp_path, n=1, turns=1)
    with torch.no_grad():
        draft.fc.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"The draft's weights are not finite \(NaN or Inf in fc\.weight\)"):
        run_benchmark(
            target, make_tokenizer(), [suite], methods=["plain", "tree"], draft=draft, max_new_tokens=4, warmup=0, progress=False
        )
    with torch.no_grad():
        target.model.layers[0].mlp.up_proj.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"The target's weights are not finite .*model\.layers\.0\.mlp\.up_proj\.weight"):
        run_benchmark(target, make_tokenizer(), [suite], methods=["plain"], max_new_tokens=4, warmup=0, progress=False)
