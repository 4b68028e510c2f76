"""The Hub ``custom_generate`` entry (``custom_generate/generate.py`` of a draft repo): the draft named with ``draft=``
or found in the repo the call came from, and no code of a repo run without the caller's ``trust_remote_code=True``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_tree_decoding import plain_greedy, prompt, random_draft
from tiny_models import copy_draft, make_tiny_target

from eagle3_hub.generation.tree.hub_caller import CustomGenerateCall, custom_generate_call


class _Mixin:
    """The shape of transformers' ``GenerationMixin.generate`` that ``hub_caller`` reads."""

    def generate(self, inputs=None, custom_generate=None, **kwargs):
        trust_remote_code = kwargs.pop("trust_remote_code", None)  # noqa: F841  (read from this frame)
        return _inner()


def _inner():
    return custom_generate_call()


def test_the_call_is_read_from_the_nearest_generate_frame_and_is_empty_elsewhere():
    got = _Mixin().generate(custom_generate="user/draft", trust_remote_code=True, revision="v1")
    assert got == CustomGenerateCall("user/draft", True)
    assert _Mixin().generate(custom_generate="user/draft") == CustomGenerateCall("user/draft", None)
    assert custom_generate_call() == CustomGenerateCall(None, None)  # not inside a custom_generate call
    assert _Mixin().generate(custom_generate=None) == CustomGenerateCall(None, None)  # a callable, not a repo


def test_a_draft_named_by_draft_is_loaded_from_its_folder(tmp_path):
    """``draft="folder"`` on the Hub path: that draft, not the repo's own (a random draft accepts less)."""
    target = make_tiny_target("llama")
    copy_draft(target).save_pretrained(tmp_path / "repo")
    random_draft(target).save_pretrained(tmp_path / "other")
    ids = prompt(seed=8)
    ref = plain_greedy(target, ids, 30)
    runs = {}
    for name, extra in (("own", {}), ("named", {"draft": str(tmp_path / "other")})):
        seen = []
        out = target.generate(
            ids,
            custom_generate=str(tmp_path / "repo"),
            trust_remote_code=True,
            max_new_tokens=30,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            lookup_tokens=0,
            adaptive=False,  # a fixed tree: the adaptive one may draft nothing on a busy machine
            on_step=lambda t, d, seen=seen: seen.append(d[0]),
            **extra,
        )
        assert torch.equal(out, ref)
        runs[name] = sum(seen)
    assert runs["named"] < runs["own"]


_NO_PACKAGE = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "eagle3_hub" or name.startswith("eagle3_hub."):
            raise ImportError("eagle3_hub is not installed here")
sys.meta_path.insert(0, Block())
import torch, transformers.generation.utils as generation_utils
from transformers import AutoModelForCausalLM
if sys.argv[3] == "ungated":  # a transformers that ran a local folder's custom_generate without asking (< 5.2x)
    generation_utils.resolve_trust_remote_code = lambda *args, **kwargs: True
target = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
try:
    target.generate(torch.tensor([[5, 6, 7, 8]]), custom_generate=sys.argv[2], max_new_tokens=4, pad_token_id=0)
    result = "ran"
except ValueError as e:
    result = str(e)
loaded = [m for m in sys.modules if m.startswith("transformers_modules") and "modeling_eagle3" in m]
print("RESULT " + json.dumps({"result": result, "modeling_code_loaded": loaded}))
"""


@pytest.mark.parametrize("gate", ["transformers", "ungated"])
def test_without_the_package_no_code_of_the_repo_runs_without_trust_remote_code(tmp_path, gate):
    """Without ``trust_remote_code=True`` transformers refuses the repo's generate.py; and where a transformers
    release let a local folder's run anyway, the entry still loads no modeling code from the repo."""
    target = make_tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    copy_draft(target).save_pretrained(tmp_path / "draft")
    res = subprocess.run(
        [sys.executable, "-c", _NO_PACKAGE, str(tmp_path / "target"), str(tmp_path / "draft"), gate],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdin=subprocess.DEVNULL,
    )  # transformers' consent prompt reads nothing: a refusal
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.rpartition("RESULT ")[2])
    assert got["result"] != "ran" and "trust_remote_code=True" in got["result"]
    assert got["modeling_code_loaded"] == []
    if gate == "ungated":  # our refusal, not transformers'
        assert "needs remote code" in got["result"]


_FROM_THE_HUB = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "eagle3_hub" or name.startswith("eagle3_hub."):
            raise ImportError("eagle3_hub is not installed here")
sys.meta_path.insert(0, Block())
import torch, transformers
from transformers import AutoModelForCausalLM
target_dir, repo, revision = sys.argv[1:4]
target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
seen = []
out = target.generate(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]]), custom_generate=repo, trust_remote_code=True,
                      max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0, lookup_tokens=0,
                      adaptive=False, on_step=lambda tokens, drafted: seen.append(drafted[0]),
                      **({"revision": revision} if revision else {}))
print("RESULT " + json.dumps({"tokens": out[0].tolist(), "from_draft": sum(seen), "transformers": transformers.__version__}))
"""


def test_a_hub_repo_runs_at_the_revision_asked_for(tmp_path, monkeypatch):
    """``custom_generate="user/repo"`` with and without ``revision=``, from a (local fake) Hub whose first commit holds
    a draft that copies the target and whose second a random one: the call runs the draft of the revision asked
    for, and gives plain greedy's tokens either way. The package is not importable where it runs."""
    import huggingface_hub
    from hub_server import FakeHub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    target = make_tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    expected = plain_greedy(target, ids, 24)[0].tolist()
    copy_draft(target).save_pretrained(tmp_path / "good")
    random_draft(target).save_pretrained(tmp_path / "random")
    with FakeHub({"hf_alice": "alice"}) as hub:
        api = huggingface_hub.HfApi(endpoint=hub.url, token="hf_alice")
        api.create_repo("alice/draft")
        first = api.upload_folder(repo_id="alice/draft", folder_path=tmp_path / "good").oid
        api.upload_folder(repo_id="alice/draft", folder_path=tmp_path / "random")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_XET="1", OMP_NUM_THREADS="1")
        runs = {}
        for name, revision in (("main", ""), ("first", first)):
            res = subprocess.run(
                [sys.executable, "-c", _FROM_THE_HUB, str(tmp_path / "target"), "alice/draft", revision],
                capture_output=True,
                text=True,
                timeout=300,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            assert res.returncode == 0, res.stderr[-3000:]
            runs[name] = json.loads(res.stdout.rpartition("RESULT ")[2])
        first_files = {p for m, p in hub.state.requests if f"/resolve/{first}/" in p}
    assert runs["main"]["tokens"] == runs["first"]["tokens"] == expected
    assert runs["first"]["from_draft"] > runs["main"]["from_draft"]  # the copy draft: its revision's, not main's
    assert {"/alice/draft/resolve/" + first + "/" + f for f in ("config.json", "model.safetensors")} <= first_files
