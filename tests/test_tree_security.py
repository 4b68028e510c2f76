"""A draft given as a repo id or folder runs no code from it unless the caller passes trust_remote_code=True."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_tree_decoding import TREE, copy_draft, plain_greedy, prompt
from tiny_models import make_tiny_target

import eagle3_hub

_EVIL = """
open({marker!r}, "w").write("ran")
import torch
from transformers import PretrainedConfig, PreTrainedModel


class EvilConfig(PretrainedConfig):
    model_type = "evil_draft"


class EvilModel(PreTrainedModel):
    config_class = EvilConfig

    def __init__(self, config):
        super().__init__(config)
        self.w = torch.nn.Linear(2, 2)
        self.post_init()

    def forward(self, x):
        return self.w(x)
"""


def _foreign_folder(tmp_path):
    """A folder whose config.json points transformers at its own Python file, which leaves a marker when run."""
    folder, marker = tmp_path / "foreign-draft", tmp_path / "marker"
    folder.mkdir()
    (folder / "evil.py").write_text(_EVIL.format(marker=str(marker)))
    config = {
        "model_type": "evil_draft",
        "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"w.weight": torch.zeros(2, 2), "w.bias": torch.zeros(2)}, str(folder / "model.safetensors"))
    return folder, marker


def _with_remote_code(folder):
    """The folder as it goes to the Hub: our modeling code next to the weights and an auto_map to it."""
    package = Path(eagle3_hub.__file__).parent
    for name in ("configuration_eagle3.py", "modeling_eagle3.py", "eagle3_assistant.py"):
        shutil.copyfile(package / name, folder / name)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_eagle3.Eagle3Config", "AutoModel": "modeling_eagle3.Eagle3DraftModel"}
    (folder / "config.json").write_text(json.dumps(config))


def _dynamic_modules_of(folder) -> list[str]:
    return [m for m in sys.modules if m.startswith("transformers_modules") and folder.name.replace("-", "_") in m]


def test_a_foreign_draft_folder_runs_no_code_without_the_callers_consent(tmp_path):
    target = make_tiny_target("llama")
    folder, marker = _foreign_folder(tmp_path)
    with pytest.raises(ValueError, match=r"needs remote code.*pass trust_remote_code=True"):
        eagle3_hub.generate(target, str(folder), prompt(), max_new_tokens=4)
    assert not marker.exists()
    with pytest.raises(ValueError, match="needs remote code"):  # the transformers entry point, too
        target.generate(prompt(), custom_generate=eagle3_hub.tree_generate, draft=str(folder), max_new_tokens=4)
    assert not marker.exists()
    # the caller's word: the folder's code may run (it is no EAGLE-3 draft, which is then said)
    with pytest.raises(ValueError, match="must be an EAGLE-3 draft"):
        eagle3_hub.generate(target, str(folder), prompt(), max_new_tokens=4, trust_remote_code=True)
    assert marker.read_text() == "ran"


def test_a_draft_folder_of_our_type_loads_through_our_class_without_remote_code(tmp_path):
    target = make_tiny_target("llama")
    folder = tmp_path / "our-draft"
    copy_draft(target).save_pretrained(folder)
    _with_remote_code(folder)
    ids = prompt(seed=3)
    out = eagle3_hub.generate(target, str(folder), ids, max_new_tokens=30, eos_token_id=[], **TREE)
    assert torch.equal(out.sequences, plain_greedy(target, ids, 30))
    assert out.stats.mean_acceptance_length > 1.5  # the saved copy draft, not something else
    assert not _dynamic_modules_of(folder)  # the folder's modeling_eagle3.py was not imported
