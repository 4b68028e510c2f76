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
