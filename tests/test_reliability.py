"""Nothing a user owns is deleted, bad values are refused in one line, a draft serves several threads.

Each test names the defect it guards against; each fails on the code before its fix."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from eagle3_hub.training import checkpoints
from eagle3_hub.training.checkpoints import STATE_FILE, claim_work_dir, move_aside, run_id

# ---------------------------------------------------------------------------------------------- train --overwrite


def _old_run(work: Path, rid: str) -> None:
    """A finished older run in ``work``: a whole checkpoint, its identity, its finished marker and its draft."""
    ckpt = work / "checkpoints" / "step-3"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_text(json.dumps({"step": 3, "run_id": rid}))
    (work / checkpoints.RUN_FILE).write_text(json.dumps({"run_id": rid, "identity": {}}))
    (work / checkpoints.FINISHED).write_text(json.dumps({"run_id": rid, "output_dir": str(work / "draft")}))
    (work / "draft").mkdir()
    (work / "draft" / "config.json").write_text('{"old": true}')
    (work / "data").mkdir()
    (work / "data" / "cache.json").write_text("{}")


def test_overwrite_moves_the_old_runs_draft_aside_with_its_checkpoints(tmp_path):
    """The defect: `train --overwrite` left the old run's draft/ in work_dir; a new run killed before writing its
    own left the old weights where `eagle3-hub push <work_dir>/draft` publishes them."""
    work = tmp_path / "work"
    _old_run(work, "old")
    identity = {"draft": {"init_from": None}, "train": {"lr": 1.0}}
    dest = claim_work_dir(work, identity, resume=False, overwrite=True)
    move_aside(work, dest)
    assert not (work / "draft").exists() and not (work / "checkpoints").exists()
    assert json.loads((Path(dest) / "draft" / "config.json").read_text()) == {"old": True}
    assert (Path(dest) / "checkpoints" / "step-3" / STATE_FILE).is_file()
    assert (work / "data" / "cache.json").is_file()  # the caches stay: they are keyed and checked on reuse


def test_overwrite_refuses_to_move_the_draft_the_recipe_continues(tmp_path):
    work = tmp_path / "work"
    _old_run(work, "old")
    identity = {"draft": {"init_from": str(work / "draft")}}
    assert run_id(identity) != "old"
    with pytest.raises(ValueError, match=r"continues that draft \(draft.init_from"):
        claim_work_dir(work, identity, resume=False, overwrite=True)
    assert (work / "draft" / "config.json").is_file()


# ---------------------------------------------------------------------------------------------- recipe values


def _train_cli(tmp_path, capsys, recipe_text: str, *args: str) -> tuple[int, str]:
    """``eagle3-hub train --config r.yaml ARGS`` in this process: exit code and the one error line (stderr)."""
    from eagle3_hub import cli

    config = tmp_path / "r.yaml"
    config.write_text(f"target:\n  name: nowhere/target\ndata:\n  sources: [a.jsonl]\nwork_dir: {tmp_path / 'w'}\n" + recipe_text)
    capsys.readouterr()
    code = cli.main(["train", "--config", str(config), *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    assert not (tmp_path / "w").exists()  # refused before anything is written
    return code, err.strip()


def test_a_recipe_flag_without_a_value_is_refused(tmp_path, capsys):
    """The defect: `--train.lr` with no value set `lr: true`, trained at lr 1.0 and exited 0."""
    code, err = _train_cli(tmp_path, capsys, "", "--train.lr")
    assert code == 2 and "--train.lr needs a value, as in `--train.lr VALUE`" in err
    code, err = _train_cli(tmp_path, capsys, "", "--train.lr", "--data.max_turns", "2")
    assert code == 2 and "--train.lr needs a value" in err
    from eagle3_hub.training.recipe import parse_overrides

    assert parse_overrides(["--lora.enabled", "--data.regenerate"]) == {
        "lora": {"enabled": True},
        "data": {"regenerate": True},
    }  # switches


@pytest.mark.parametrize(
    "text, says",
    [
        ("train:\n  lr: true\n", "r.yaml: train.lr must be a positive number (default 0.0005), got true"),
        ("train:\n  lr: -0.1\n", "train.lr must be a positive number"),
        ("train:\n  lr: .nan\n", "train.lr must be a positive number"),
        ("train:\n  betas: [0.9]\n", "train.betas must be a list of two numbers in [0, 1)"),
        ("train:\n  batch_size: 2.5\n", "train.batch_size must be a positive integer (default 4), got 2.5"),
        ('train:\n  group_by_length: "yes"\n', 'train.group_by_length must be true or false (default true), got "yes"'),
        ("data:\n  max_new_tokens: many\n", 'data.max_new_tokens must be a positive integer (default 384), got "many"'),
        ("data:\n  temperature: -1\n", "data.temperature must be a non-negative number"),
        (
            "data:\n  regenerate_with: 3\n",
            'data.regenerate_with must be one of auto, tree, generate, same_forward (default "auto"), got 3',
        ),
        ("lora:\n  dropout: 1.5\n", "lora.dropout must be a number in [0, 1)"),
        ("stages:\n  - train:\n      lr: true\n", "stage 2: train.lr must be a positive number"),
    ],
)
def test_recipe_values_are_checked_against_their_type_and_range(tmp_path, capsys, text, says):
    """The defect: recipe values were not type-checked; `lr: true` trained at 1.0."""
    code, err = _train_cli(tmp_path, capsys, text)
    assert code == 2 and says in err, err


def test_a_bad_flag_value_names_the_flag(tmp_path, capsys):
    code, err = _train_cli(tmp_path, capsys, "", "--train.warmup_steps", "-5")
    assert code == 2 and "train.warmup_steps must be an integer >= 0 (default 50), got --train.warmup_steps=-5" in err


def test_the_shipped_recipes_pass_the_value_checks():
    from eagle3_hub.training.recipe import load_recipe, load_stages

    recipes = sorted(Path(__file__).resolve().parent.parent.glob("recipes/*.yaml"))
    assert recipes
    for path in recipes:
        load_stages(load_recipe(path))


@pytest.mark.parametrize(
    "args", [("--from-stage", "0"), ("--from-stage", "-1"), ("--data-only", "--from-stage", "5"), ("--from-stage", "3")]
)
def test_from_stage_outside_the_recipe_is_refused(tmp_path, capsys, args):
    """The defect: `--from-stage 0` silently started at stage 1; `--data-only --from-stage 5` on a two-stage recipe
    exited 0 having done nothing."""
    code, err = _train_cli(tmp_path, capsys, "stages:\n  - train:\n      lr: 1.0e-4\n", *args)
    n = args[-1]
    assert code == 2 and f"--from-stage {n}: the recipe has stages 1 to 2" in err, err


# ---------------------------------------------------------------------------------------------- demo --export-space


def fake_wheel(folder: Path, version: str = "0.0.1") -> Path:
    """A wheel of the right name with the METADATA the export reads (building the real one takes a minute)."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"eagle3_hub-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            f"eagle3_hub-{version}.dist-info/METADATA",
            f"Name: eagle3-hub\nVersion: {version}\nRequires-Dist: torch>=2.4\nRequires-Dist: gradio>=5\n",
        )
    return path


def export(dest, wheel, capsys=None) -> tuple[int, str]:
    from eagle3_hub import cli

    if capsys is not None:
        capsys.readouterr()
    code = cli.main(["demo", "--export-space", str(dest), "--wheel", str(wheel)])
    err = capsys.readouterr().err if capsys is not None else ""
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    return code, err.strip()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


SPACE_FILES = {"app.py", "README.md", "pairs.yaml", "requirements.txt", "space-export.json"}
pytest_space = pytest.mark.skipif(
    not (Path(__file__).resolve().parent.parent / "spaces" / "app.py").is_file(), reason="needs the source tree (spaces/)"
)


@pytest_space
def test_export_space_keeps_everything_it_did_not_write(tmp_path, capsys):
    """The defect: `demo --export-space s` replaced s whole, deleting s/.git and s/notes without a word."""
    dest = tmp_path / "s"
    (dest / ".git").mkdir(parents=True)
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dest / "notes").mkdir()
    (dest / "notes" / "t.txt").write_text("x")
    mine = snapshot(dest)
    assert export(dest, fake_wheel(tmp_path / "w"), capsys)[0] == 0
    assert {k: v for k, v in snapshot(dest).items() if k in mine} == mine
    assert {p.name for p in dest.iterdir()} == {".git", "notes", *SPACE_FILES, "eagle3_hub-0.0.1-py3-none-any.whl"}
    lines = (dest / "requirements.txt").read_text().splitlines()
    assert [x for x in lines if not x.startswith("#")] == ["torch>=2.4"]


@pytest_space
def test_export_space_refuses_to_replace_a_file_it_did_not_write(tmp_path, capsys):
    dest = tmp_path / "s"
    dest.mkdir()
    (dest / "README.md").write_text("my Space, created on the Hub\n")
    before = snapshot(dest)
    code, err = export(dest, fake_wheel(tmp_path / "w"), capsys)
    assert code == 2 and "holds README.md, which an earlier export did not write" in err, err
    assert snapshot(dest) == before and [p.name for p in dest.iterdir()] == ["README.md"]  # no temporary leftovers
    from eagle3_hub import cli

    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "replaced only when an earlier export wrote it" in " ".join(capsys.readouterr().out.split())  # the rule


@pytest_space
def test_export_space_replaces_its_own_earlier_export_but_not_an_edited_file(tmp_path, capsys):
    """What users rely on: exporting again over the folder an export wrote replaces its files (an older wheel
    included); a file changed since is the user's, and stops the export."""
    dest = tmp_path / "s"
    assert export(dest, fake_wheel(tmp_path / "w1", "0.0.1"), capsys)[0] == 0
    (dest / "notes.txt").write_text("mine")
    assert export(dest, fake_wheel(tmp_path / "w2", "0.0.2"), capsys)[0] == 0
    assert {p.name for p in dest.iterdir()} == {*SPACE_FILES, "notes.txt", "eagle3_hub-0.0.2-py3-none-any.whl"}
    (dest / "app.py").write_text("# my changes\n")
    before = snapshot(dest)
    code, err = export(dest, fake_wheel(tmp_path / "w3", "0.0.3"), capsys)
    assert code == 2 and "holds app.py, which an earlier export did not write (or which changed since)" in err, err
    assert snapshot(dest) == before


@pytest_space
def test_export_space_replaces_a_folder_an_older_release_exported(tmp_path, capsys):
    """An export from before the manifest (recognised by its requirements.txt) is still replaced."""
    dest = tmp_path / "s"
    dest.mkdir()
    for name in ("app.py", "README.md", "pairs.yaml"):
        (dest / name).write_text("old\n")
    (dest / "requirements.txt").write_text("# Written by `eagle3-hub demo --export-space`: the dependencies\ntorch\n")
    fake_wheel(dest, "0.0.0")
    assert export(dest, fake_wheel(tmp_path / "w", "0.0.1"), capsys)[0] == 0
    assert {p.name for p in dest.iterdir()} == {*SPACE_FILES, "eagle3_hub-0.0.1-py3-none-any.whl"}


@pytest_space
def test_export_space_to_the_current_folder(tmp_path, capsys, monkeypatch):
    """The defect: `--export-space .` failed and left ..tmp-* / ..old-* folders behind."""
    wheel = fake_wheel(tmp_path / "w")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert export(".", wheel, capsys)[0] == 0
    assert {p.name for p in here.iterdir()} == {*SPACE_FILES, wheel.name}
    assert {p.name for p in tmp_path.iterdir()} == {"w", "here"}
    # a folder that holds other files of the same names (a source checkout, say): refused, nothing left behind
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("a project\n")
    monkeypatch.chdir(repo)
    code, err = export(".", wheel, capsys)
    assert code == 2 and "README.md, which an earlier export did not write" in err
    assert [p.name for p in repo.iterdir()] == ["README.md"] and {p.name for p in tmp_path.iterdir()} == {"w", "here", "repo"}


@pytest_space
def test_export_space_never_writes_into_a_vcs_folder(tmp_path, capsys):
    (tmp_path / "s" / ".git").mkdir(parents=True)
    code, err = export(tmp_path / "s" / ".git", fake_wheel(tmp_path / "w"), capsys)
    assert code == 2 and "version-control folder" in err
    assert list((tmp_path / "s" / ".git").iterdir()) == []


# ---------------------------------------------------------------------------------------------- one draft, threads


def _tiny_pair(seed: int = 0):
    from tiny_models import make_tiny_target

    from eagle3_hub import Eagle3DraftModel

    target = make_tiny_target("llama", seed=seed)
    torch.manual_seed(seed + 1)
    return target, Eagle3DraftModel.from_target(target).eval()


def _prompts(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (1, 6 + i % 3), generator=g) for i in range(n)]


def _run_threads(jobs) -> list[str]:
    """Run the callables together (released at once); the errors they raised."""
    errors: list[str] = []
    start = threading.Barrier(len(jobs))

    def run(job):
        try:
            start.wait()
            job()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_one_bound_draft_serves_assisted_and_tree_decoding_from_threads():
    """The defect: two threads running `target.generate(..., assistant_model=draft)` with one draft failed ("did not
    reach the draft's feature hooks", size mismatches), and tree decoding in one thread removed the hooks an
    assisted call in another needed. Now every call gets plain greedy's tokens."""
    from eagle3_hub.generation.tree import generate as tree_generate

    target, draft = _tiny_pair()
    draft.bind(target)
    prompts = _prompts(4)
    new = 24

    def plain(ids):
        return target.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, eos_token_id=None, pad_token_id=0
        )

    expected = [plain(ids) for ids in prompts]
    got: dict = {}

    def assisted(k):
        def job():
            for i, ids in enumerate(prompts):
                out = target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    assistant_model=draft,
                    do_sample=False,
                    max_new_tokens=new,
                    eos_token_id=None,
                    pad_token_id=0,
                )
                got[("assisted", k, i)] = (out, draft.last_assisted_stats)

        return job

    def tree(k):
        def job():
            for i, ids in enumerate(prompts):
                out = tree_generate(
                    target, draft, ids, max_new_tokens=new, eos_token_id=[], depth=3, tree_top_k=2, total_tokens=6
                )
                got[("tree", k, i)] = (out.sequences, None)

        return job

    errors = _run_threads([assisted(0), assisted(1), assisted(2), tree(0), tree(1)])
    assert not errors, errors[:3]
    assert len(got) == 5 * len(prompts)
    for (kind, _, i), (seq, stats) in got.items():
        assert torch.equal(seq, expected[i]), (kind, i)
        if stats is not None:  # each thread's counts are its own call's
            assert stats["prompt_length"] == prompts[i].shape[1]
    assert len(draft._hook_handles) == 3  # still bound, one set of hooks


def test_an_unbound_draft_called_from_threads_binds_once():
    target, draft = _tiny_pair(seed=3)
    prompts = _prompts(2, seed=5)
    expected = [target.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0) for ids in prompts]
    got = []

    def job():
        for i, ids in enumerate(prompts):
            got.append(
                torch.equal(
                    target.generate(
                        ids, assistant_model=draft, do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0
                    ),
                    expected[i],
                )
            )

    assert _run_threads([job, job, job]) == []
    assert got == [True] * 6 and draft.target is target
    assert sum(len(m._forward_hooks) for m in target.modules()) == 3


def test_the_assisting_caller_is_found_only_in_assisted_decoding():
    """The one frame walk (eagle3_hub.assisting_caller): found from transformers' assisted decoding (the tests above
    and test_assisted.py's unbound drafts), never from a look-alike frame; a bound draft does not walk at all."""
    from eagle3_hub import assisting_caller

    target, draft = _tiny_pair()
    assert assisting_caller.assisting_model(draft) is None

    def _assisted_decoding(self=target, assistant_model=draft):  # same names, another code object
        return assisting_caller.assisting_model(assistant_model)

    assert _assisted_decoding() is None
    draft.bind(target)
    calls = []
    real = assisting_caller.assisting_model
    assisting_caller.assisting_model = lambda d, *a: calls.append(d) or real(d, *a)
    try:
        ids = _prompts(1)[0]
        target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=6, eos_token_id=None, pad_token_id=0)
    finally:
        assisting_caller.assisting_model = real
    assert calls == []  # bound explicitly: the draft never looks at the stack


# ---------------------------------------------------------------------------------------------- one line, exit 2


def _cli(capsys, *argv: str) -> tuple[int, str]:
    from eagle3_hub import cli

    capsys.readouterr()
    code = cli.main(list(argv))
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if line.startswith("eagle3-hub ")]  # not the loading progress bars
    assert "Traceback" not in err and len(errors) == 1, err
    return code, errors[0]


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ("generate", "--prompt", "hi", "--temperature", "-1"),
            "generate: error: --temperature takes numbers >= 0 (0 = greedy), got -1",
        ),
        (("generate", "--prompt", "hi", "--temperature", "nan"), "--temperature takes numbers >= 0"),
        (("bench", "--temperature", "-1"), "bench: error: --temperature takes numbers >= 0 (0 = greedy), got '-1'"),
        (("generate", "--prompt", "hi", "--top-p", "0"), "generate: error: --top-p takes a number in (0, 1]"),
        (("bench", "--top-p", "1.5"), "bench: error: --top-p takes a number in (0, 1]"),
        (("generate", "--prompt", "hi", "--top-k", "-2"), "generate: error: --top-k takes an integer >= 0"),
        (("bench", "--top-k", "-2"), "bench: error: --top-k takes an integer >= 0"),
        (("demo", "--port", "99999"), "demo: error: --port must be a TCP port, 1 to 65535, got 99999"),
    ],
)
def test_numeric_flags_are_refused_alike_in_one_line(capsys, argv, says):
    """The defects: `generate --temperature -1` ran greedy while bench refused it; `demo --port 99999` raised an
    OverflowError."""
    code, err = _cli(capsys, *argv)
    assert code == 2 and says in err, err


def test_convert_refuses_a_negative_number_of_speculative_tokens(tmp_path, capsys):
    """The defect: `convert --num-speculative-tokens -1` was written into the vLLM config."""
    code, err = _cli(
        capsys, "convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--to", "vllm", "--num-speculative-tokens", "-1"
    )
    assert code == 2 and "--num-speculative-tokens must be at least 1, got -1" in err
    assert not (tmp_path / "dst").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is there")
@pytest.mark.parametrize("command", [("generate", "--prompt", "hi"), ("bench", "--methods", "plain")])
def test_a_cuda_device_without_cuda_is_one_line(capsys, command):
    """The defect: `--device cuda` on a CPU-only torch was an AssertionError from `model.to`, exit 1."""
    code, err = _cli(capsys, *command, "--device", "cuda")
    assert code == 2 and "device 'cuda' is not available" in err and "--device cpu" in err


def test_device_checks_in_the_shared_place():
    from eagle3_hub.devices import resolve_device

    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device 'cuda:1' is not available"):
            resolve_device("cuda:1")
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        with pytest.raises(ValueError, match=r"device 'mps' is not available: .*use --device cpu or auto"):
            resolve_device("mps")
    with pytest.raises(ValueError, match="is not a torch device"):
        resolve_device("gpu")


# ---------------------------------------------------------------------------------------------- convert --force


@pytest.fixture
def run_with_draft(tmp_path):
    """A training run's folder: its draft (with card and metrics) and its checkpoints."""
    _, draft = _tiny_pair()
    run = tmp_path / "run"
    draft.save_pretrained(run / "draft")
    (run / "draft" / "README.md").write_text("# card\n")
    (run / "draft" / "training_metrics.json").write_text("{}")
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    (run / "checkpoints" / "step-3" / STATE_FILE).write_text("{}")
    return run


@pytest.mark.parametrize("dst", ["run/draft", "run", "."])
def test_convert_force_never_destroys_its_own_source(tmp_path, capsys, monkeypatch, run_with_draft, dst):
    """The defect: `convert run/draft run/draft --force` deleted the draft's card and metrics, and
    `convert run/draft run --force` deleted run/checkpoints and run/draft, exit 0."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, err = _cli(capsys, "convert", "run/draft", dst, "--force")
    assert code == 2 and "the draft being converted" in err and "would delete it" in err, err
    assert snapshot(tmp_path) == before


def test_convert_force_never_replaces_a_vcs_folder(tmp_path, capsys, run_with_draft):
    out = tmp_path / "out"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref\n")
    code, err = _cli(capsys, "convert", str(run_with_draft / "draft"), str(out), "--force")
    assert code == 2 and "version-control folder" in err
    assert (out / ".git" / "HEAD").read_text() == "ref\n"
    from eagle3_hub import cli

    # what --force is for: replacing an earlier output
    assert cli.main(["convert", str(run_with_draft / "draft"), str(tmp_path / "new")]) == 0
    assert cli.main(["convert", str(run_with_draft / "draft"), str(tmp_path / "new"), "--force"]) == 0
    assert (tmp_path / "new" / "config.json").is_file()


# ---------------------------------------------------------------------------------------------- demo start-up


@pytest.mark.parametrize(
    "flags, says",
    [
        (("--target", "MISSING", "--draft", "REFERENCE"), "Could not load the target"),
        (("--device", "cuda"), "device 'cuda' is not available"),
    ],
)
def test_demo_does_not_serve_when_its_pair_does_not_load(tmp_path, capsys, monkeypatch, flags, says):
    """The defect: `demo` with a target that does not load logged an error and served a page anyway."""
    if "cuda" in flags and torch.cuda.is_available():
        pytest.skip("a CUDA device is there")
    import eagle3_hub.demo

    def served(*a, **k):
        raise AssertionError("the demo started serving")

    monkeypatch.setattr(eagle3_hub.demo, "build_app", served)
    from eagle3_hub.targets import reference_draft

    names = {"MISSING": str(tmp_path / "no-such-target"), "REFERENCE": str(reference_draft())}
    flags = tuple(names.get(f, f) for f in flags)
    code, err = _cli(capsys, "demo", *flags)
    assert code == 2 and says in err, err


# ---------------------------------------------------------------------------------------------- bench batch labels


def test_bench_refuses_a_batch_size_larger_than_a_suite(tmp_path):
    """The defect: `bench --num-questions 1 --batch-size 1,2` labelled a batch of one prompt "batch 2"."""
    from test_bench import make_tokenizer, write_questions
    from tiny_models import make_tiny_target

    from eagle3_hub.benchmark import suites
    from eagle3_hub.benchmark.bench import run_benchmark

    target, tok = make_tiny_target("llama"), make_tokenizer()
    one = suites.load_suite(str(write_questions(tmp_path / "mt_bench" / "question.jsonl", n=1, turns=1)))
    with pytest.raises(ValueError, match=r"batch size 2 is larger than suite mt_bench's 1 question\(s\)"):
        run_benchmark(target, tok, one, methods=["plain"], max_new_tokens=4, progress=False, warmup=0, batch_sizes=[1, 2])
    res = run_benchmark(target, tok, one, methods=["plain"], max_new_tokens=4, progress=False, warmup=0, batch_sizes=[1])
    assert {r["batch"] for r in res["records"]} == {1}


# ---------------------------------------------------------------------------------------------- non-finite drafts


def test_a_draft_with_non_finite_weights_is_named_when_loaded(tmp_path, capsys):
    """The defect: a draft whose head held NaN/Inf stopped tree decoding with `atol must be >= 0, got -nan`, never
    naming the draft's weights."""
    from eagle3_hub import Eagle3DraftModel

    _, draft = _tiny_pair()
    with torch.no_grad():
        draft.lm_head.weight[3, 1] = float("nan")
        draft.fc.weight[0, 0] = float("inf")
    draft.save_pretrained(tmp_path / "draft")
    with pytest.raises(
        ValueError,
        match=r"non-finite weights \(NaN or Inf\) in (fc\.weight, lm_head\.weight|"
        r"lm_head\.weight, fc\.weight): it cannot draft",
    ):
        Eagle3DraftModel.from_pretrained(tmp_path / "draft")
    code, err = _cli(capsys, "convert", str(tmp_path / "draft"), str(tmp_path / "out"))
    assert code == 2 and "non-finite weights" in err and not (tmp_path / "out").exists()


def test_a_pause_of_the_hooks_leaves_them_to_another_threads_call():
    """Tree decoding pauses the feature hooks (`unbind(keep_target=True)`); from another thread that pause must not
    take them from an assisted call under way, and the next assisted call puts paused hooks back."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    target, draft = _tiny_pair(seed=2)
    ids = _prompts(1, seed=9)[0]
    plain = target.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=0)

    def hooks():
        return sum(len(m._forward_hooks) for m in target.modules())

    seen = []

    class PauseFromAnotherThread(StoppingCriteria):  # runs between two rounds of the assisted call
        def __call__(self, input_ids, scores, **kwargs):
            if not seen:
                other = threading.Thread(target=lambda: draft.unbind(keep_target=True))
                other.start()
                other.join()
                seen.append(hooks())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    draft.bind(target)
    draft.unbind(keep_target=True)  # as `load_draft(..., bind=True)` leaves a draft: bound, no hooks
    assert hooks() == 0 and draft.target is target
    out = target.generate(
        ids,
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=16,
        eos_token_id=None,
        pad_token_id=0,
        stopping_criteria=StoppingCriteriaList([PauseFromAnotherThread()]),
    )
    assert seen == [3]  # the hooks came back for the call, and stayed through the other thread's pause
    assert torch.equal(out, plain)
    draft.unbind(keep_target=True)
    assert hooks() == 0  # no call needs them now
    draft.unbind()
    assert draft.target is None


# ---------------------------------------------------------------------------------------------- train output_dir


@pytest.mark.parametrize(
    "case, says",
    [
        ("work_dir", "holds the work_dir"),
        ("cwd", "holds the work_dir"),
        ("notes", "holds files that are not a saved draft (notes.txt)"),
        ("git", "holds files that are not a saved draft (.git, config.json)"),
    ],
)
def test_training_never_replaces_a_folder_that_is_not_a_draft(tmp_path, capsys, monkeypatch, case, says):
    """The trained draft replaces output_dir whole at the end of a run: `output_dir` equal to the work_dir (or a
    folder holding it) deleted the run's checkpoints and data, and any folder's own files went with it."""
    monkeypatch.chdir(tmp_path)
    out = {"work_dir": "w", "cwd": ".", "notes": "mine", "git": "repo"}[case]
    if case == "notes":
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("x")
    if case == "git":
        (tmp_path / "repo" / ".git").mkdir(parents=True)
        (tmp_path / "repo" / "config.json").write_text("{}")
    before = snapshot(tmp_path)
    code, err = _train_cli(tmp_path, capsys, f"output_dir: {out}\n")
    assert code == 2 and says in err, err
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "r.yaml"} == before


def test_training_may_replace_an_earlier_draft(tmp_path):
    from eagle3_hub.training.recipe import load_recipe

    _, draft = _tiny_pair()
    draft.save_pretrained(tmp_path / "draft")
    load_recipe(None, {"work_dir": str(tmp_path / "w"), "output_dir": str(tmp_path / "draft")})
    load_recipe(None, {"work_dir": str(tmp_path / "w"), "output_dir": str(tmp_path / "new")})
