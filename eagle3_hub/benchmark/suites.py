"""Question suites in the EAGLE / Spec-Bench ``question.jsonl`` format.

One JSON object per line::

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second user turn"]}

``turns`` holds the user turns of one conversation (MT-bench has two; the second continues the first). Extra
keys (``reference``, ...) are kept but unused.

Where a suite comes from, in order (:func:`load_suites`):

1. a path: a ``.jsonl`` file, or a folder holding ``question.jsonl`` (one suite), ``<suite>/question.jsonl``
   (the EAGLE ``data/`` layout) or ``*.jsonl`` files (one suite each);
2. a name (``mt_bench``, ``humaneval``, ``gsm8k``, ``alpaca``, ``sum``, ``qa``, or ``all``) looked up in
   ``bench_dir`` (``--bench-dir`` or ``$EAGLE3_HUB_BENCH_DIR``) as ``<name>.jsonl`` or ``<name>/question.jsonl``,
   then among the suites shipped with the package (MT-bench, so that the bare command needs no download),
   then in the local cache of earlier downloads;
3. the Hub: ``mt_bench`` is the FastChat file ``raw/question.jsonl`` of ``HuggingFaceH4/mt_bench_prompts``;
   the other names are built from their source datasets (first 80 rows, as EAGLE and Spec-Bench do) and
   cached as ``question.jsonl`` files;
4. any Hub dataset repository that holds question-format files: ``owner/name`` (every ``.jsonl`` in it) or
   ``owner/name:path/in/repo.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import atomic_write_text
from ..extras import missing_extra

QUESTIONS_PER_SUITE = 80  # EAGLE and Spec-Bench use 80 questions per category


@dataclass
class Question:
    question_id: int | str
    category: str
    turns: list[str]
    extra: dict = field(default_factory=dict)


@dataclass
class Suite:
    name: str
    questions: list[Question]
    source: str  # file path or Hub id the questions were read from

    def __len__(self) -> int:
        return len(self.questions)


class SuiteNotFoundError(FileNotFoundError):
    pass


# ----------------------------------------------------------------------------------------- parsing
def parse_question(obj: dict, where: str) -> Question:
    turns = obj.get("turns")
    if turns is None and "prompt" in obj:  # HuggingFaceH4/mt_bench_prompts' parquet renames `turns`
        turns = obj["prompt"]
    if isinstance(turns, str):
        turns = [turns]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(
            f"{where}: expected a question with a non-empty list of strings under `turns` "
            f"(EAGLE / Spec-Bench question.jsonl format), got keys {sorted(obj)}"
        )
    qid = obj.get("question_id", obj.get("prompt_id"))
    extra = {k: v for k, v in obj.items() if k not in ("question_id", "category", "turns", "prompt")}
    return Question(question_id=qid, category=str(obj.get("category", "")), turns=list(turns), extra=extra)


def read_question_file(path: str | Path, name: str | None = None) -> Suite:
    """A ``question.jsonl`` file; the suite is named after the file, or its folder for ``question.jsonl``."""
    path = Path(path)
    questions = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            q = parse_question(obj, f"{path}:{lineno}")
            if q.question_id is None:
                q.question_id = len(questions)
            questions.append(q)
    if not questions:
        raise ValueError(f"{path} holds no questions")
    if name is None:
        name = path.parent.name if path.stem == "question" else path.stem
    return Suite(name=name, questions=questions, source=str(path))


def write_question_file(questions: list[Question], path: str | Path):
    lines = [
        json.dumps({"question_id": q.question_id, "category": q.category, "turns": q.turns, **q.extra}, ensure_ascii=False)
        for q in questions
    ]
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_question_folder(folder: str | Path) -> list[Suite]:
    """``question.jsonl`` in the folder (one suite), else ``*/question.jsonl`` (EAGLE layout), else ``*.jsonl``."""
    folder = Path(folder)
    if (folder / "question.jsonl").is_file():
        return [read_question_file(folder / "question.jsonl")]
    files = sorted(folder.glob("*/question.jsonl")) or sorted(folder.glob("*.jsonl"))
    if not files:
        raise SuiteNotFoundError(f"{folder} has no question.jsonl, */question.jsonl or *.jsonl files")
    return [read_question_file(p) for p in files]


# ----------------------------------------------------------------------------------------- Hub sources
def _humaneval(row: dict) -> Question:
    return Question(row["task_id"], "coding", ["Complete the following Python code.\n\n" + row["prompt"]])


def _gsm8k(row: dict) -> Question:
    return Question(None, "math", [row["question"]], {"reference": [row["answer"]]})


def _alpaca(row: dict) -> Question:
    text = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    return Question(None, "instruction", [text])


def _cnn_dm(row: dict) -> Question:
    prompt = "Summarize the following news article in a few sentences.\n\n" + row["article"]
    return Question(row.get("id"), "summarization", [prompt], {"reference": [row["highlights"]]})


def _nq_open(row: dict) -> Question:
    q = row["question"].strip()
    q = q[0].upper() + q[1:] + ("" if q.endswith("?") else "?")
    return Question(None, "qa", [q], {"reference": row.get("answer")})


@dataclass(frozen=True)
class HubSource:
    """Where a standard suite lives on the Hub. ``file``: a question-format file in a dataset repo;
    otherwise ``convert`` turns rows of ``repo``/``config``/``split`` (via ``datasets``) into questions."""

    repo: str
    file: str | None = None
    config: str | None = None
    split: str | None = None
    convert: Callable[[dict], Question] | None = None


HUB_SOURCES: dict[str, HubSource] = {
    "mt_bench": HubSource("HuggingFaceH4/mt_bench_prompts", file="raw/question.jsonl"),
    "humaneval": HubSource("openai/openai_humaneval", split="test", convert=_humaneval),
    "gsm8k": HubSource("openai/gsm8k", config="main", split="test", convert=_gsm8k),
    "alpaca": HubSource("tatsu-lab/alpaca", split="train", convert=_alpaca),
    "sum": HubSource("abisee/cnn_dailymail", config="3.0.0", split="test", convert=_cnn_dm),
    "qa": HubSource("google-research-datasets/nq_open", split="validation", convert=_nq_open),
}
# suites that ship with the package only (no Hub source): read from the package's data folder
PACKAGED_SUITES = ("continuation",)
STANDARD_SUITES = list(HUB_SOURCES) + list(PACKAGED_SUITES)
ALIASES = {
    "mt-bench": "mt_bench",
    "mtbench": "mt_bench",
    "human_eval": "humaneval",
    "human-eval": "humaneval",
    "cnn_dm": "sum",
    "cnndm": "sum",
    "cnn_dailymail": "sum",
    "summarization": "sum",
    "nq": "qa",
    "natural_questions": "qa",
}


def canonical_name(name: str) -> str:
    key = name.lower()
    return ALIASES.get(key, key)


def suite_cache_dir() -> Path:
    from ..targets import cache_dir

    return cache_dir() / "benchmarks"


def _download_standard(name: str, endpoint: str | None, cache_dir: str | None) -> Suite:
    from huggingface_hub import hf_hub_download

    src = HUB_SOURCES[name]
    if src.file is not None:
        path = hf_hub_download(src.repo, src.file, repo_type="dataset", endpoint=endpoint, cache_dir=cache_dir)
        suite = read_question_file(path, name=name)
        suite.source = f"hf://datasets/{src.repo}/{src.file}"
        return suite
    try:
        from datasets import load_dataset
    except ModuleNotFoundError as e:
        raise missing_extra("bench", e) from None

    rows = load_dataset(src.repo, src.config, split=f"{src.split}[:{QUESTIONS_PER_SUITE}]", cache_dir=cache_dir)
    questions = []
    for i, row in enumerate(rows):
        q = src.convert(row)
        q.question_id = i if q.question_id is None else q.question_id
        questions.append(q)
    return Suite(name=name, questions=questions, source=f"hf://datasets/{src.repo}")


def _load_hub_repo(spec: str, endpoint: str | None, cache_dir: str | None) -> list[Suite]:
    """``owner/name`` (every .jsonl file) or ``owner/name:path.jsonl`` from a Hub dataset repository."""
    from huggingface_hub import HfApi, hf_hub_download

    repo, _, file = spec.partition(":")
    if file:
        files = [file]
    else:
        files = [f for f in HfApi(endpoint=endpoint).list_repo_files(repo, repo_type="dataset") if f.endswith(".jsonl")]
        if not files:
            raise SuiteNotFoundError(f"The Hub dataset {repo} holds no .jsonl question files")
    suites = []
    for f in sorted(files):
        path = hf_hub_download(repo, f, repo_type="dataset", endpoint=endpoint, cache_dir=cache_dir)
        name = Path(f).parent.name if Path(f).stem == "question" and Path(f).parent.name else Path(f).stem
        suite = read_question_file(path, name=name or repo.split("/")[-1])
        suite.source = f"hf://datasets/{repo}/{f}"
        suites.append(suite)
    return suites


PACKAGED_DIR = Path(__file__).resolve().parent / "data"  # suites shipped with the package (see data/README.md)


def _find_local(name: str, bench_dir: str | Path | None) -> Path | None:
    names = [name] + [alias for alias, canon in ALIASES.items() if canon == name]
    folders = [Path(bench_dir)] if bench_dir else []
    folders += [PACKAGED_DIR, suite_cache_dir()]
    for folder in folders:
        for n in names:
            for candidate in (folder / f"{n}.jsonl", folder / n / "question.jsonl"):
                if candidate.is_file():
                    return candidate
    return None


def load_suite(
    spec: str,
    bench_dir: str | Path | None = None,
    endpoint: str | None = None,
    cache_dir: str | None = None,
) -> list[Suite]:
    """The suite(s) named by ``spec``: a path, a standard name, ``all``, or a Hub dataset id (module docstring)."""
    bench_dir = bench_dir or os.environ.get("EAGLE3_HUB_BENCH_DIR")
    path = Path(spec).expanduser()
    if path.is_file():
        return [read_question_file(path)]
    if path.is_dir():
        return read_question_folder(path)
    if spec == "all":
        return [s for name in HUB_SOURCES for s in load_suite(name, bench_dir, endpoint, cache_dir)]

    name = canonical_name(spec)
    if name in PACKAGED_SUITES:
        return [read_question_file(PACKAGED_DIR / f"{name}.jsonl", name=name)]
    if name in HUB_SOURCES:
        local = _find_local(name, bench_dir)
        if local is not None:
            return [read_question_file(local, name=name)]
        try:
            suite = _download_standard(name, endpoint, cache_dir)
        except Exception as e:  # offline, no such dataset, not authorised, ...
            where = f"{bench_dir}/{name}.jsonl or {bench_dir}/{name}/question.jsonl, " if bench_dir else ""
            raise SuiteNotFoundError(
                f"Cannot load the suite '{spec}': it is not a local file or folder, not found in {where}"
                f"{suite_cache_dir()}, and fetching it from the Hub dataset {HUB_SOURCES[name].repo} failed "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]}). Pass a question.jsonl file or folder "
                "(`--suite path/to/question.jsonl`), point `--bench-dir` at a folder of them, or connect to the "
                "Hub once (set HF_HUB_OFFLINE=1 to skip Hub look-ups)."
            ) from e
        write_question_file(suite.questions, suite_cache_dir() / f"{name}.jsonl")
        return [suite]

    if "/" in spec and not spec.startswith((".", "/", "~")):
        try:
            return _load_hub_repo(spec, endpoint, cache_dir)
        except SuiteNotFoundError:
            raise
        except Exception as e:
            raise SuiteNotFoundError(
                f"Cannot load the suite '{spec}': no such local path, and reading it as a Hub dataset failed "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]})."
            ) from e
    raise SuiteNotFoundError(
        f"Unknown suite '{spec}': not a file or folder, not a standard suite ({', '.join(STANDARD_SUITES)}, all) "
        "and not a Hub dataset id (owner/name)."
    )


def load_suites(
    specs: str | list[str],
    bench_dir: str | Path | None = None,
    num_questions: int | None = None,
    endpoint: str | None = None,
    cache_dir: str | None = None,
) -> list[Suite]:
    """Comma-separated or listed suite specs -> suites, each cut to ``num_questions``."""
    if isinstance(specs, str):
        specs = [s.strip() for s in specs.split(",") if s.strip()]
    suites: list[Suite] = []
    for spec in specs:
        suites.extend(load_suite(spec, bench_dir=bench_dir, endpoint=endpoint, cache_dir=cache_dir))
    seen: dict[str, int] = {}
    for s in suites:  # two files named question.jsonl in different places: keep the names apart
        seen[s.name] = seen.get(s.name, 0) + 1
        if seen[s.name] > 1:
            s.name = f"{s.name}_{seen[s.name]}"
        if num_questions is not None:
            s.questions = s.questions[:num_questions]
    return suites
