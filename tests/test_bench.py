"""`eagle3-hub bench`: question suites, measuring hooks, the interleaved run, reports (tiny random models)."""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_target

from eagle3_hub.benchmark import bench, machine, report, suites
from eagle3_hub.benchmark.bench import Mode, TurnRecord, run_benchmark
from eagle3_hub.commands import bench as bench_command
from eagle3_hub.targets import default_dtype, reference_draft

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer():
    """A word-level tokenizer over the tiny targets' 256 ids: specials + words w0..w249 (round-trips text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(256 - len(SPECIALS))]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_questions(path: Path, n: int = 3, turns: int = 2, category: str = "writing") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            t = [" ".join(f"w{(7 * i + j) % 200}" for j in range(6 + i)) for _ in range(turns)]
            t = [f"{x} w{k + 1}" for k, x in enumerate(t)]
            f.write(json.dumps({"question_id": 100 + i, "category": category, "turns": t}) + "\n")
    return path


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """Hub look-ups fail at once instead of retrying; downloads land in a temporary cache."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "eagle3_hub_cache"))
    monkeypatch.delenv("EAGLE3_HUB_BENCH_DIR", raising=False)


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_target("llama"), make_tokenizer()


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """A tiny target and a tiny classic assistant saved as folders (the CLI loads them like any model)."""
    root = tmp_path_factory.mktemp("models")
    tok = make_tokenizer()
    for name, seed in (("target", 0), ("assistant", 1)):
        model = make_tiny_target("llama", seed=seed, num_hidden_layers=4 if name == "target" else 1)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


# ----------------------------------------------------------------------------------------- suites
def test_suite_file_folder_and_name_lookup(tmp_path):
    f = write_questions(tmp_path / "a.jsonl", n=4)
    (s,) = suites.load_suite(str(f))
    assert s.name == "a" and len(s) == 4 and s.questions[0].turns[1].endswith("w2")

    # EAGLE layout: data/<suite>/question.jsonl
    write_questions(tmp_path / "data" / "mt_bench" / "question.jsonl", n=2)
    write_questions(tmp_path / "data" / "gsm8k" / "question.jsonl", n=3, turns=1, category="math")
    found = {s.name: len(s) for s in suites.load_suite(str(tmp_path / "data"))}
    assert found == {"gsm8k": 3, "mt_bench": 2}

    # names resolve against bench_dir, aliases included (cnn_dm -> sum)
    got = suites.load_suites("mt-bench,gsm8k", bench_dir=tmp_path / "data", num_questions=2)
    assert [(s.name, len(s)) for s in got] == [("mt_bench", 2), ("gsm8k", 2)]
    write_questions(tmp_path / "bench" / "sum.jsonl", n=5, turns=1)
    got = suites.load_suites(["cnn_dm"], bench_dir=tmp_path / "bench")
    assert [(s.name, len(s)) for s in got] == [("sum", 5)]


def test_suite_errors_are_clear(tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "x", "turns": ["ok"]}\n{"question_id": 2, "text": "no turns"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a question with a non-empty list of strings under `turns`"):
        suites.load_suite(str(bad))
    with pytest.raises(suites.SuiteNotFoundError, match="Unknown suite 'nope'"):
        suites.load_suite("nope")

    # a standard suite that is nowhere local, offline: the message says what to pass instead
    with pytest.raises(suites.SuiteNotFoundError) as e:
        suites.load_suite("gsm8k", cache_dir=str(tmp_path / "hf"))
    msg = str(e.value)
    assert "openai/gsm8k" in msg and "--suite path/to/question.jsonl" in msg and "--bench-dir" in msg


def test_mt_bench_ships_with_the_package():
    """The bare `eagle3-hub bench` needs no download: MT-bench's 80 two-turn questions are bundled."""
    (s,) = suites.load_suite("mt_bench")
    assert s.name == "mt_bench" and len(s) == 80 and s.source.endswith("benchmark/data/mt_bench.jsonl")
    assert all(len(q.turns) == 2 for q in s.questions)
    assert len({q.category for q in s.questions}) == 8


def test_hub_source_converters_build_questions():
    rows = {
        "humaneval": {"task_id": "HumanEval/0", "prompt": "def f(x):\n"},
        "gsm8k": {"question": "What is 2+2?", "answer": "#### 4"},
        "alpaca": {"instruction": "Translate", "input": "bonjour", "output": "hello"},
        "sum": {"id": "abc", "article": "Long text.", "highlights": "Short."},
        "qa": {"question": "who wrote hamlet", "answer": ["Shakespeare"]},
    }
    for name, row in rows.items():
        q = suites.HUB_SOURCES[name].convert(row)
        assert q.turns and all(isinstance(t, str) and t for t in q.turns), name
    assert suites.HUB_SOURCES["qa"].convert(rows["qa"]).turns == ["Who wrote hamlet?"]
    assert "bonjour" in suites.HUB_SOURCES["alpaca"].convert(rows["alpaca"]).turns[0]
    assert suites.HUB_SOURCES["mt_bench"].file == "raw/question.jsonl"


def test_suite_from_a_hub_dataset_repo(tmp_path, monkeypatch):
    """`--suite owner/name` reads the .jsonl question files of a Hub dataset (served by the local fake Hub)."""
    import huggingface_hub.constants
    from hub_server import FakeHub
    from huggingface_hub import HfApi

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the fake Hub is local
    f = write_questions(tmp_path / "q.jsonl", n=3)
    with FakeHub({"tok": "alice"}) as hub:
        api = HfApi(endpoint=hub.url, token="tok")
        api.create_repo("alice/bench", repo_type="dataset")
        api.upload_file(
            path_or_fileobj=str(f), path_in_repo="mt_bench/question.jsonl", repo_id="alice/bench", repo_type="dataset"
        )
        api.upload_file(path_or_fileobj=str(f), path_in_repo="code.jsonl", repo_id="alice/bench", repo_type="dataset")
        got = suites.load_suite("alice/bench", endpoint=hub.url, cache_dir=str(tmp_path / "hf"))
        assert sorted((s.name, len(s)) for s in got) == [("code", 3), ("mt_bench", 3)]
        (one,) = suites.load_suite("alice/bench:code.jsonl", endpoint=hub.url, cache_dir=str(tmp_path / "hf"))
        assert one.source == "hf://datasets/alice/bench/code.jsonl"
        with pytest.raises(suites.SuiteNotFoundError, match="alice/missing"):
            suites.load_suite("alice/missing", endpoint=hub.url, cache_dir=str(tmp_path / "hf"))


# ----------------------------------------------------------------------------------------- measuring
def test_forward_starts_give_accepted_tokens_per_step(tiny):
    from eagle3_hub.eagle3_assistant import decoder_layers

    target, _ = tiny
    starts = bench.ForwardStarts(decoder_layers(target)[0])
    try:
        ids = torch.randint(6, 256, (1, 12), generator=torch.Generator().manual_seed(0))
        plain = target.generate(ids, max_new_tokens=20, do_sample=False)
        n = plain.shape[1]
        assert starts.accepted_per_step(12, n) == [0] * 20  # one token per forward

        starts.reset()
        lookup = target.generate(ids, max_new_tokens=20, do_sample=False, prompt_lookup_num_tokens=5)
        accepted = starts.accepted_per_step(12, lookup.shape[1])
        assert torch.equal(lookup, plain)
        assert len(accepted) == len(starts.starts) < 20  # the random model repeats itself: lookup hits
        assert sum(a + 1 for a in accepted) == 20
    finally:
        starts.close()


def _release_free_heap():
    """Give the C heap's free pages back to the OS (glibc): memory an earlier test freed can stay resident and
    serve a new allocation without the resident set growing, which hid the allocation below in one CI run."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def test_peak_memory_sees_a_large_allocation():
    """The resident set is the whole process's: another thread of the test run (a server, a tokenizer pool)
    freeing memory at the same moment can hide one allocation, so one of three tries must see it."""
    mem = bench.PeakMemory(torch.device("cpu"))
    grew = []
    for _ in range(3):
        gc.collect()
        _release_free_heap()
        mem.reset()
        before = mem.peak_mb()
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB
        grew.append(mem.peak_mb() - before)
        del x
        if grew[-1] >= 60 or mem.kind == "process_max_rss":
            break
    assert grew[-1] >= 60 or mem.kind == "process_max_rss", grew


# ----------------------------------------------------------------------------------------- the run
def _suite(tmp_path, n=3, turns=2, name="mt_bench"):
    return suites.load_suite(str(write_questions(tmp_path / name / "question.jsonl", n=n, turns=turns)))


def test_run_benchmark_interleaves_methods_and_reports_figures(tiny, tmp_path):
    target, tok = tiny
    assistant = make_tiny_target("llama", seed=1, num_hidden_layers=1)
    suite = _suite(tmp_path, n=3, turns=2)
    res = run_benchmark(
        target,
        tok,
        suite,
        methods=["lookup", "assistant"],
        assistant=assistant,
        max_new_tokens=24,
        lookup_tokens=4,
        progress=False,
    )
    assert res["settings"]["methods"] == ["plain", "lookup", "assistant"]  # plain is always measured
    recs = res["records"]
    assert len(recs) == 3 * 3 * 2
    # interleaved: the method order rotates from one question to the next
    firsts = [next(r["method"] for r in recs if r["question_id"] == qid) for qid in (100, 101, 102)]
    assert firsts == ["plain", "lookup", "assistant"]
    # the second turn continues the conversation: its prompt holds turn 1, the answer and turn 2
    for r1 in (r for r in recs if r["turn"] == 1):
        r2 = next(r for r in recs if r["turn"] == 2 and r["question_id"] == r1["question_id"] and r["method"] == r1["method"])
        assert r2["prompt_tokens"] >= r1["prompt_tokens"] + r1["new_tokens"]

    rows = {(r["suite"], r["method"]): r for r in res["results"]}
    plain = rows[("mt_bench", "plain")]
    assert plain["speedup"] == pytest.approx(1.0) and plain["mean_acceptance_length"] == pytest.approx(1.0)
    assert plain["time_split"]["draft"] == 0 and plain["acceptance_by_position"] is None
    for m in ("lookup", "assistant"):
        r = rows[("mt_bench", m)]
        assert r["tokens_per_s"] > 0 and r["speedup"] > 0
        assert r["mean_acceptance_length"] >= 1
        pos = r["acceptance_by_position"]
        assert all(1 >= a >= b >= 0 for a, b in zip(pos, pos[1:]))
        split = r["time_split"]
        assert split["draft"] + split["verify"] + split["overhead"] == pytest.approx(1.0, abs=1e-6)
        assert r["peak_memory_mb"] > 0
        assert r["new_tokens"] == plain["new_tokens"]
    assert rows[("mt_bench", "assistant")]["time_split"]["draft"] > 0
    # float32 greedy: both transformers methods give plain greedy's tokens
    assert res["lossless"]["lookup"] == {
        "turns": 6,
        "identical": 6,
        "mismatches": [],
        "lossless": True,
        "by_suite": {"mt_bench": {"turns": 6, "identical": 6}},
    }
    assert res["lossless"]["assistant"]["lossless"]
    assert res["machine"]["torch"] == torch.__version__ and res["machine"]["cpu_cores"]


def test_max_turns_keeps_first_turns_only(tiny, tmp_path):
    target, tok = tiny
    res = run_benchmark(
        target, tok, _suite(tmp_path, n=2, turns=2), methods=["plain"], max_new_tokens=8, progress=False, max_turns=1, warmup=0
    )
    assert {r["turn"] for r in res["records"]} == {1} and len(res["records"]) == 2
    assert res["settings"]["max_turns"] == 1


def test_draft_methods_and_the_tree_sweep(tiny, tmp_path):
    """Our draft through `assistant_model=` and tree decoding (an untrained draft: lossless all the same), and a
    sweep over two tree shapes that ranks them."""
    from eagle3_hub import Eagle3DraftModel

    target, tok = tiny
    draft = Eagle3DraftModel.from_target(target).eval()
    draft.bind(target)
    grid = [{"depth": 2, "tree_top_k": 2, "total_tokens": 4}, {"depth": 3, "tree_top_k": 3, "total_tokens": 8}]
    res = run_benchmark(
        target,
        tok,
        _suite(tmp_path, n=2, turns=2),
        methods=["assisted", "tree"],
        draft=draft,
        tree_grid=grid,
        max_new_tokens=16,
        progress=False,
    )
    names = res["settings"]["methods"]
    assert names == [
        "plain",
        "assisted",
        "tree[depth=2,tree_top_k=2,total_tokens=4]",
        "tree[depth=3,tree_top_k=3,total_tokens=8]",
    ]
    assert all(res["lossless"][m]["lossless"] and res["lossless"][m]["turns"] == 4 for m in names[1:])
    rows = {r["method"]: r for r in res["results"] if r["suite"] == "mt_bench"}
    for m in names[1:]:
        r = rows[m]
        assert r["time_split"]["draft"] > 0 and r["time_split"]["verify"] > 0
        assert r["mean_acceptance_length"] >= 1 and r["acceptance_by_position"] is not None
        # tokens per target forward, from the per-step figures, matches the raw counts
        assert r["mean_acceptance_length"] == pytest.approx(r["new_tokens"] / r["target_forwards"])
    ranking = res["sweep"]["greedy"]["ranking"]
    assert [x["method"] for x in ranking] == sorted(names[2:], key=lambda m: -rows[m]["speedup"])
    assert res["sweep"]["greedy"]["best"]["depth"] == ranking[0]["depth"]


def test_oracle_reports_the_perfect_drafts_acceptance_per_shape_and_the_drafts_share(tiny, tmp_path):
    """`oracle`: the target proposes its own tree, one method per tree shape; its speed is not reported, each tree
    row gets its share of the oracle's acceptance with the same shape, and the report says what the oracle is."""
    from eagle3_hub import Eagle3DraftModel

    target, tok = tiny
    draft = Eagle3DraftModel.from_target(target).eval()
    draft.bind(target)
    grid = [{"depth": 2, "tree_top_k": 2, "total_tokens": 4}, {"depth": 3, "tree_top_k": 1, "total_tokens": 3}]
    res = run_benchmark(
        target,
        tok,
        _suite(tmp_path, n=2, turns=1),
        methods=["tree", "oracle"],
        draft=draft,
        tree_grid=grid,
        max_new_tokens=16,
        progress=False,
    )
    rows = {r["method"]: r for r in res["results"] if r["suite"] == "mt_bench"}
    for shape in ("[depth=2,tree_top_k=2,total_tokens=4]", "[depth=3,tree_top_k=1,total_tokens=3]"):
        tree, oracle = rows["tree" + shape], rows["oracle" + shape]
        assert oracle["speedup"] is None and oracle["speedup_same_forward"] is None
        assert oracle["mean_acceptance_length"] > tree["mean_acceptance_length"]
        assert tree["oracle_share"] == pytest.approx(tree["mean_acceptance_length"] / oracle["mean_acceptance_length"])
        assert res["lossless"]["oracle" + shape]["lossless"]  # whatever proposes, the output is the target's
    # a chain of the target's own argmaxes is accepted whole, but at a row's last step
    assert rows["oracle[depth=3,tree_top_k=1,total_tokens=3]"]["mean_acceptance_length"] > 3
    text = report.markdown_report(res)
    assert "Of perfect draft" in text and "its speed means nothing" in text


def test_lossless_check_reports_a_difference_loudly(tiny, capsys):
    _, tok = tiny

    def rec(method, ids):
        return TurnRecord("s", 1, "c", 1, "greedy", method, 5, len(ids), 0.1, 0.0, 0.1, len(ids), [len(ids)], 1.0, ids)

    records = [rec("plain", [10, 11, 12, 13]), rec("tree", [10, 11, 40, 41]), rec("lookup", [10, 11, 12, 13])]
    check = bench.lossless_check(records, tok)
    assert check["lookup"]["lossless"] and not check["tree"]["lossless"]
    assert check["tree"]["mismatches"][0]["first_difference"] == 2
    results = {
        "results": bench.summarize(records),
        "lossless": check,
        "machine": machine.machine_info(torch.device("cpu")),
        "settings": {"target": "t", "draft": "d", "suites": [{"name": "s", "questions": 1}], "max_new_tokens": 4},
    }
    report.print_report(results)
    out = capsys.readouterr().out
    assert "LOSSLESS CHECK FAILED: greedy 'tree' differs from plain greedy on 1 of 1 turns" in out
    assert "NO (1 of 1 turns differ)" in out


def test_sampling_mode_runs_beside_greedy(tiny, tmp_path):
    target, tok = tiny
    res = run_benchmark(
        target,
        tok,
        _suite(tmp_path, n=2, turns=1),
        methods=["plain", "lookup"],
        modes=[Mode(0.0), Mode(0.8, top_k=20)],
        max_new_tokens=12,
        progress=False,
    )
    modes = {(r["mode"], r["method"]) for r in res["results"] if r["suite"] == "mt_bench"}
    assert modes == {("greedy", "plain"), ("greedy", "lookup"), ("T=0.8", "plain"), ("T=0.8", "lookup")}
    assert res["lossless"]["lookup"]["turns"] == 2  # only greedy turns are compared


# ----------------------------------------------------------------------------------------- CLI + report
def _parse(argv):
    p = argparse.ArgumentParser()
    bench_command.add_arguments(p)
    return p.parse_args(argv)


def test_cli_writes_table_json_and_chart(tiny_folders, tmp_path, capsys):
    qfile = write_questions(tmp_path / "mt_bench.jsonl", n=2, turns=2)
    qfile2 = write_questions(tmp_path / "gsm8k.jsonl", n=2, turns=1, category="math")
    out = tmp_path / "out"
    args = _parse(
        [
            "--target",
            str(tiny_folders / "target"),
            "--suite",
            f"{qfile},{qfile2}",
            "--methods",
            "plain,lookup",
            "--assistant-model",
            str(tiny_folders / "assistant"),
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
            "--quiet",
            "--strict",
        ]
    )
    assert bench_command.run(args) == 0
    printed = capsys.readouterr().out
    assert "| Suite | Mode | Method | Tokens/s | Speed-up |" in printed and "all suites" in printed
    data = json.loads((out / "bench.json").read_text())
    assert {s["name"] for s in data["settings"]["suites"]} == {"mt_bench", "gsm8k"}
    assert data["settings"]["target"] == str(tiny_folders / "target")
    assert {r["method"] for r in data["results"]} == {"plain", "lookup", "assistant"}
    auto = str(default_dtype("cpu")).replace("torch.", "")  # --dtype auto: bfloat16 where the CPU has bf16 units
    assert data["machine"]["device"] == "cpu" and data["machine"]["dtype"] == auto
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (out / "bench.md").read_text().startswith("# eagle3-hub bench")


def test_cli_without_a_draft_says_what_to_pass(tiny_folders, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", n=1, turns=1)
    args = _parse(["--target", str(tiny_folders / "target"), "--suite", str(qfile), "--methods", "plain,tree", "--quiet"])
    with pytest.raises(ValueError, match="needs an EAGLE-3 draft.*--draft PATH_OR_REPO"):
        bench_command.run(args)


def test_tree_grid_and_sweep_summary():
    args = _parse(["--depth", "3,5", "--tree-top-k", "8", "--total-tokens", "16,32"])
    grid = bench_command.tree_grid_from_args(args)
    assert len(grid) == 4 and {"depth": 5, "tree_top_k": 8, "total_tokens": 32} in grid
    methods = [bench.Method(bench.tree_label(g), "tree", None, g) for g in grid]
    rows = [
        {"suite": "_all", "mode": "greedy", "method": m.name, "speedup": s, "tokens_per_s": 10 * s, "mean_acceptance_length": 2.0}
        for m, s in zip(methods, (1.2, 1.9, 1.5, 1.1))
    ]
    best = bench.sweep_summary(rows, methods)["greedy"]
    assert best["best"] == {"depth": 3, "tree_top_k": 8, "total_tokens": 32, "speedup": 1.9}
    assert [r["speedup"] for r in best["ranking"]] == [1.9, 1.5, 1.2, 1.1]
    # the pruning and growth thresholds are lists too; the tree_label names every setting given
    args = _parse(["--depth", "6", "--min-node-prob", "0", "--grow-min-prob", "0,0.3"])
    grid = bench_command.tree_grid_from_args(args)
    assert grid == [
        {"depth": 6, "min_node_prob": 0.0, "grow_min_prob": 0.0},
        {"depth": 6, "min_node_prob": 0.0, "grow_min_prob": 0.3},
    ]
    assert bench.tree_label(grid[1]) == "tree[depth=6,min_node_prob=0.0,grow_min_prob=0.3]"
    # --trees: the settings as listed (no product), checked
    args = _parse(["--trees", "depth=3; depth=8,grow_min_prob=0.3,total_tokens=6 ;", "--depth", "5,7"])
    assert bench_command.tree_grid_from_args(args) == [{"depth": 3}, {"depth": 8, "grow_min_prob": 0.3, "total_tokens": 6}]
    for bad, message in (
        ("depth=3;width=2", "'width=2' is not key=value with a key among depth"),
        ("depth=three", "depth takes an integer, got 'three'"),
        (" ; ", "at least one tree setting"),
        ("depth=1,tree_top_k=2,total_tokens=9", "No tree shape in the sweep is valid"),
    ):
        with pytest.raises(ValueError, match=message):
            bench_command.tree_grid_from_args(_parse(["--trees", bad]))


# ----------------------------------------------------------------------------------------- the real target
@pytest.mark.slow  # the command loads the real target itself
def test_bare_command_needs_only_the_reference_draft(tmp_path):
    """`eagle3-hub bench` with no arguments: embedded target, reference draft, bundled MT-bench."""
    args = _parse(["--num-questions", "1", "--max-new-tokens", "8", "--out", str(tmp_path / "out"), "--quiet", "--strict"])
    if not (reference_draft() / "config.json").exists():
        with pytest.raises(ValueError, match="reference draft for the embedded target is not in this installation.*--draft"):
            bench_command.run(args)
        return
    assert bench_command.run(args) == 0
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["settings"]["methods"] == ["plain", "same_forward", "lookup", "assisted", "tree"]


def test_smollm2_chat_bench_is_lossless(tmp_path, smollm2):
    """The real target through the whole bench path: chat template, second turn built on the first answer,
    every method equal to plain greedy in float32 (an untrained draft: acceptance is low, outputs still equal)."""
    from eagle3_hub import Eagle3DraftModel

    target, tok = smollm2
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=8192).eval()  # the training default
    draft.bind(target)
    (suite,) = suites.load_suites("mt_bench", num_questions=1)
    try:
        res = run_benchmark(
            target,
            tok,
            [suite],
            methods=["plain", "same_forward", "assisted", "tree"],
            draft=draft,
            max_new_tokens=8,
            warmup=0,
            progress=False,
        )
    finally:
        draft.unbind()  # the target is shared with other tests
    assert all(e["lossless"] and e["turns"] == 2 for e in res["lossless"].values()), res["lossless"]
    turn1 = {r["method"]: r for r in res["records"] if r["turn"] == 1}
    turn2 = {r["method"]: r for r in res["records"] if r["turn"] == 2}
    assert len(turn2) == 4
    for m, r in turn2.items():  # system prompt + turn 1 + its answer + turn 2
        assert r["prompt_tokens"] > turn1[m]["prompt_tokens"] + turn1[m]["new_tokens"]


def test_machine_info_records_the_thread_settings_that_change_cpu_timings(monkeypatch):
    for k in [k for k in os.environ if k.startswith(("OMP_", "KMP_", "MKL_", "GOMP_"))]:
        monkeypatch.delenv(k)
    plain = machine.machine_info(torch.device("cpu"), torch.float32)
    assert "threading_env" not in plain and "OMP_WAIT_POLICY" not in machine.describe_machine(plain)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    info = machine.machine_info(torch.device("cpu"), torch.float32)
    assert info["threading_env"] == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    assert "OMP_WAIT_POLICY=PASSIVE, float32" in machine.describe_machine(info)


# ----------------------------------------------------------------------------------------- same forward
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_same_forward_greedy_equals_plain_greedy_in_float32(arch):
    """Plain decoding through tree decoding's own forward and head: token for token ``target.generate``'s greedy
    output, and on a CPU it does take the lean forward and the head that verification takes."""
    from eagle3_hub.generation.tree.same_forward import same_forward_generate

    target = make_tiny_target(arch)
    for seed, (length, new) in enumerate([(5, 24), (17, 40), (40, 9)]):
        ids = torch.randint(8, 250, (1, length), generator=torch.Generator().manual_seed(seed))
        with torch.inference_mode():
            ref = target.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        out, stats = same_forward_generate(target, ids, new)
        assert out.tolist() == ref.tolist()
        assert stats.target_forwards == new and stats.lean_forward
    # an end token stops it as it stops generate
    eos = int(ref[0, length + 3])
    out, stats = same_forward_generate(target, ids, new, eos_token_id=[eos])
    assert out[0, -1].item() == eos and out.shape[1] <= ref.shape[1]
    # sampling runs and draws from the top-k
    torch.manual_seed(0)
    out, _ = same_forward_generate(target, ids, 8, do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    assert out.shape == (1, ids.shape[1] + 8)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_same_forward_batch_equals_batched_generate_in_float32(arch):
    """Left-padded rows of different lengths through the same forward: token for token ``generate``'s batched
    greedy output, a row that meets its end token padded while the others go on."""
    from tiny_models import left_padded

    from eagle3_hub.generation.tree.same_forward import same_forward_generate

    target = make_tiny_target(arch)
    g = torch.Generator().manual_seed(3)
    ids, mask = left_padded([torch.randint(8, 250, (n,), generator=g) for n in (7, 19, 12)])
    with torch.inference_mode():
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    out, stats = same_forward_generate(target, ids, 20, attention_mask=mask)
    assert out.tolist() == ref.tolist() and stats.target_forwards == 20
    eos = int(ref[1, ids.shape[1] + 2])  # row 1 stops early; generate pads it, as must we
    with torch.inference_mode():
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    out, _ = same_forward_generate(target, ids, 20, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    assert out.tolist() == ref.tolist()


def test_bench_reports_speedups_over_both_baselines(tiny, tmp_path):
    target, tok = tiny
    res = run_benchmark(
        target,
        tok,
        _suite(tmp_path, n=2, turns=1),
        methods=["plain", "same_forward", "lookup"],
        max_new_tokens=12,
        warmup=0,
        progress=False,
    )
    assert res["lossless"]["same_forward"]["lossless"] and res["lossless"]["same_forward"]["turns"] == 2
    rows = {r["method"]: r for r in res["results"] if r["suite"] == "mt_bench"}
    sf = rows["same_forward"]
    assert sf["mean_acceptance_length"] == 1.0 and sf["acceptance_by_position"] is None
    assert sf["speedup_same_forward"] == pytest.approx(1.0)
    lookup = rows["lookup"]
    assert lookup["speedup_same_forward"] == pytest.approx(lookup["tokens_per_s"] / sf["tokens_per_s"])
    table = report.markdown_report(res)
    assert "| Speed-up | vs same forward |" in table and "what speculation alone buys" in table


def test_batched_runs_compare_methods_at_the_same_batch_size(tiny, tmp_path):
    """--batch-size 1,2: the batched methods also run left-padded pairs of questions (assisted decoding, which takes
    one prompt, only alone); rows are per batch size, speed-ups against plain at the same size, and greedy batched
    outputs are checked against plain's batched outputs."""
    from eagle3_hub import Eagle3DraftModel

    target, tok = tiny
    draft = Eagle3DraftModel.from_target(target).eval()
    draft.bind(target)
    res = run_benchmark(
        target,
        tok,
        _suite(tmp_path, n=3, turns=2),
        methods=["plain", "same_forward", "assisted", "tree"],
        draft=draft,
        max_new_tokens=10,
        progress=False,
        warmup=1,
        batch_sizes=[1, 2],
    )
    rows = {(r["batch"], r["method"]): r for r in res["results"] if r["suite"] == "mt_bench"}
    assert set(rows) == {
        (1, "plain"),
        (1, "same_forward"),
        (1, "assisted"),
        (1, "tree"),
        (2, "plain"),
        (2, "same_forward"),
        (2, "tree"),
    }
    for method in ("same_forward", "tree"):
        r = rows[(2, method)]
        assert r["turns"] == 6 and r["speedup"] == pytest.approx(r["tokens_per_s"] / rows[(2, "plain")]["tokens_per_s"])
    assert rows[(2, "tree")]["mean_acceptance_length"] >= 1 and rows[(2, "same_forward")]["mean_acceptance_length"] == 1
    assert rows[(1, "tree")]["tree"]["depth"] >= 1 and rows[(2, "plain")]["tree"] is None  # each row's tree shape
    assert res["lossless"]["tree"]["turns"] == 12 and res["lossless"]["tree"]["lossless"]  # 6 alone + 6 in pairs
    assert res["lossless"]["same_forward"]["lossless"] and res["lossless"]["assisted"]["turns"] == 6
    batched = [r for r in res["records"] if r["batch"] == 2 and r["method"] == "plain"]
    assert len(batched) == 6 and {r["question_id"] for r in batched} == {100, 101, 102}
    assert "| Batch |" in report.markdown_table(res)
    # the adaptive default: the shapes it chose, per batch size, counted over the run's steps and printed
    for batch in (1, 2):
        steps = rows[(batch, "tree")]["tree_steps"]
        assert steps and all(n > 0 for n in steps.values()) and rows[(batch, "same_forward")]["tree_steps"] is None
    assert sum(rows[(1, "tree")]["tree_steps"].values()) == sum(
        sum(r["tree_steps"].values()) for r in res["records"] if r["batch"] == 1 and r["method"] == "tree"
    )
    assert "Adaptive tree: steps per shape" in report.markdown_report(res) and "batch 2, tree: " in report.markdown_report(res)
    with pytest.raises(ValueError, match="at least 1"):
        run_benchmark(
            target, tok, _suite(tmp_path, n=1, turns=1), methods=["plain"], max_new_tokens=4, progress=False, batch_sizes=[0]
        )


def test_methods_that_time_themselves_run_on_models_without_hooks(tiny):
    """The measuring hooks are on the models only while a generate-based method runs: a hooked output head turns
    tree decoding's packed head off (it copies only a hook-free nn.Linear), which slowed every tree and same-forward
    figure the bench measured."""
    from types import SimpleNamespace

    target, tok = tiny
    runner = bench.TurnRunner(bench.BenchContext(target, tok), torch.device("cpu"))
    gc = bench.generation_config_for(target, Mode(), 4, tok)
    ids = torch.tensor([[5, 6, 7]])
    seen = {}

    def method(kind):
        def run(input_ids, mask, config):
            head, first_layer = target.get_output_embeddings(), target.model.layers[0]
            seen[kind] = len(head._forward_hooks) + len(head._forward_pre_hooks) + len(first_layer._forward_pre_hooks)
            out = target.generate(input_ids, attention_mask=mask, generation_config=config)
            return out, SimpleNamespace(target_forwards=4, verify_time_s=0.0)

        return bench.Method(kind, kind, run)

    meta = [dict(suite="s", question_id=1, category="c", turn=1, mode="greedy")]
    for kind in ("plain", "same_forward", "plain"):
        runner.run(method(kind), ids, torch.ones_like(ids), gc, meta)
    assert seen["same_forward"] == 0 and seen["plain"] > 0
    head = target.get_output_embeddings()
    assert not head._forward_hooks and not head._forward_pre_hooks  # none left behind


def test_a_base_models_prompts_are_rendered_as_its_recipe_trains_them(smollm2_tokenizer):
    """Without a chat template the bench gives the prompt only, as recipes/gemma-3-270m.yaml's template writes the
    training data (<bos>, the prompt, a newline): a draft is measured on the contexts it was trained on."""
    import copy

    import yaml

    recipe = yaml.safe_load((Path(__file__).parents[1] / "recipes" / "gemma-3-270m.yaml").read_text())
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = None
    ids = bench.build_prompt(tok, ["Write a haiku about rain."], [])
    tok.chat_template = recipe["target"]["chat_template"]
    text = tok.apply_chat_template([{"role": "user", "content": "Write a haiku about rain."}], tokenize=False)
    assert ids[0].tolist() == tok(text, add_special_tokens=False).input_ids
    assert text.endswith("rain.\n") and not text.endswith("\n\n")


def test_drafts_compared_in_one_run_decode_the_same_questions_as_tree_methods(tiny, tmp_path):
    from eagle3_hub import Eagle3DraftModel
    from eagle3_hub.benchmark.models import compare_draft_names

    target, tok = tiny
    drafts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = Eagle3DraftModel.from_target(target).eval()
        d.bind(target)
        drafts.append(d)
    calls = [0, 0]
    for i, d in enumerate(drafts):
        d.fc.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    res = run_benchmark(
        target,
        tok,
        _suite(tmp_path, n=2, turns=1),
        methods=["tree"],
        draft=drafts[0],
        compare_drafts={"other": drafts[1]},
        max_new_tokens=12,
        warmup=0,
        progress=False,
    )
    assert res["settings"]["methods"] == ["plain", "tree", "tree@other"]
    assert all(res["lossless"][m]["lossless"] and res["lossless"][m]["turns"] == 2 for m in ("tree", "tree@other"))
    rows = {r["method"]: r for r in res["results"] if r["suite"] == "mt_bench"}
    assert rows["tree@other"]["mean_acceptance_length"] >= 1 and calls[0] > 0 and calls[1] > 0  # each its own draft
    with pytest.raises(ValueError, match="add tree to --methods"):
        run_benchmark(
            target,
            tok,
            _suite(tmp_path, n=1, turns=1),
            methods=["plain"],
            compare_drafts={"x": drafts[1]},
            max_new_tokens=4,
            progress=False,
        )
    assert compare_draft_names(["runs/a/draft", "runs/b/draft", "user/my-draft"]) == {
        "draft": "runs/a/draft",
        "draft-2": "runs/b/draft",
        "my-draft": "user/my-draft",
    }


def test_ignore_eos_runs_every_row_to_max_new_tokens(tiny, tmp_path):
    """--ignore-eos: a target that often says end-of-sequence still gives every row, in every method, batch size and
    mode, max_new_tokens tokens; without it rows stop early."""
    import copy

    from eagle3_hub import Eagle3DraftModel

    target, tok = tiny
    target = copy.deepcopy(target)
    with torch.no_grad():  # a large end-of-sequence logit wherever the final hidden state sums above zero
        target.get_output_embeddings().weight[tok.eos_token_id] = 50 * target.model.norm.weight
    draft = Eagle3DraftModel.from_target(target).eval()
    draft.bind(target)
    modes = [Mode(), Mode(temperature=0.7, top_p=0.9)]
    kw = dict(
        methods=["plain", "same_forward", "tree"],
        draft=draft,
        max_new_tokens=6,
        progress=False,
        warmup=0,
        batch_sizes=[1, 2],
        modes=modes,
        max_turns=1,
    )
    res = run_benchmark(target, tok, _suite(tmp_path, n=2, turns=1), ignore_eos=True, **kw)
    assert res["settings"]["ignore_eos"] and "every row 6 new tokens" in report.markdown_report(res)
    assert len(res["records"]) == 2 * 2 * 3 * 2 and {r["new_tokens"] for r in res["records"]} == {6}
    stopped = run_benchmark(target, tok, _suite(tmp_path, n=2, turns=1), **kw)
    assert sum(r["new_tokens"] < 6 for r in stopped["records"]) >= len(stopped["records"]) // 2
