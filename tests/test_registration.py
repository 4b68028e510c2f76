"""``import eagle3_hub`` alone makes transformers know the draft, whatever was imported before or after it: each
entry point in a fresh interpreter, where nothing imported earlier can help it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from test_formats import randomized_draft, write_foreign
from tiny_models import make_tiny_target

import eagle3_hub


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Our folder and a speculators one of the same random draft, and the logits both must give."""
    root = tmp_path_factory.mktemp("registration")
    draft = randomized_draft(make_tiny_target("llama"))
    draft.save_pretrained(root / "native")
    write_foreign(draft, root / "speculators", "speculators")
    return root


def fresh(code: str, *args) -> dict:
    """Runs ``code`` in a fresh interpreter (offline, one thread); returns the JSON it prints last."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


AUTO_LOAD = """
    import json, sys
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel

    folder = sys.argv[1]
    config = AutoConfig.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32)
    saved = load_file(folder + "/model.safetensors")
    same = all(torch.equal(p, saved[k]) for k, p in model.state_dict().items())
    print(json.dumps({"config": type(config).__module__ + "." + type(config).__name__,
                      "model": type(model).__module__ + "." + type(model).__name__, "same_weights": same}))
"""


@pytest.mark.parametrize(
    "before, after",
    [
        ("", ""),  # the README's order
        ("from transformers import AutoModel", ""),
        ("", "from transformers import LlamaForCausalLM"),  # transformers' model files import AutoModel themselves
        ("import transformers.models.llama.modeling_llama", ""),
    ],
)
def test_bare_import_loads_a_draft_with_automodel_and_autoconfig(folders, before, after):
    got = fresh(f"{before}\nimport eagle3_hub\n{after}\n" + textwrap.dedent(AUTO_LOAD), folders / "native")
    assert got == {
        "config": "eagle3_hub.configuration_eagle3.Eagle3Config",
        "model": "eagle3_hub.modeling_eagle3.Eagle3DraftModel",
        "same_weights": True,
    }


@pytest.mark.parametrize("name", eagle3_hub.__all__)
def test_each_public_name_imports_alone_and_the_auto_classes_know_the_draft(folders, name):
    got = fresh(
        f"""
        import json, sys
        from eagle3_hub import {name}
        from transformers import AutoConfig, AutoModel

        config = AutoConfig.from_pretrained(sys.argv[1])
        model_class = AutoModel._model_mapping[type(config)]
        print(json.dumps({{"config": type(config).__name__, "model": model_class.from_pretrained.__qualname__}}))
        """,
        folders / "native",
    )
    assert got == {"config": "Eagle3Config", "model": "Eagle3DraftModel.from_pretrained"}


def test_foreign_layout_reads_and_saves_with_the_model_module_alone(folders, tmp_path):
    """The model module imported without ``eagle3_hub.formats``: it still reads a speculators folder and writes the
    engine keys (the layout hooks import formats on first use)."""
    got = fresh(
        """
        import json, sys
        import torch
        from eagle3_hub.modeling_eagle3 import Eagle3DraftModel

        before = "eagle3_hub.formats" in sys.modules
        draft = Eagle3DraftModel.from_pretrained(sys.argv[1], dtype=torch.float32)
        draft.save_pretrained(sys.argv[2])
        print(json.dumps({"formats_before": before, "aux_ids": draft.config.aux_layer_ids}))
        """,
        folders / "speculators",
        tmp_path / "saved",
    )
    assert got == {"formats_before": False, "aux_ids": [0, 1, 2]}  # speculators' input ids 1..3, read as outputs
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["aux_layer_convention"] == "output" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (tmp_path / "saved" / "modeling_eagle3.py").is_file()  # the remote-code files, written by formats' hook
    native, saved = load_file(folders / "native" / "model.safetensors"), load_file(tmp_path / "saved" / "model.safetensors")
    assert all(torch.equal(saved[k], native[k]) for k in saved)


def test_bare_import_imports_no_torch_and_the_watcher_leaves_once_done():
    got = fresh(
        """
        import json, sys
        import eagle3_hub
        from eagle3_hub import registration

        light = not {"torch", "transformers"} & {m.split(".")[0] for m in sys.modules}
        watching = registration._WATCHER in sys.meta_path
        from transformers import AutoModel  # configuration_auto and modeling_auto
        import eagle3_hub.modeling_eagle3
        print(json.dumps({"light": light, "watching": watching, "after": registration._WATCHER in sys.meta_path,
                          "model": AutoModel._model_mapping[eagle3_hub.Eagle3Config] is eagle3_hub.Eagle3DraftModel}))
        """
    )
    assert got == {"light": True, "watching": True, "after": False, "model": True}
