"""The peers' own code on our folders, and ours on the folders their code writes: speculators 0.9.0 runs in its side
environment (``bash tests/peers/setup_venv.sh``; .ci/run builds it), driven as a subprocess by
tests/peers/speculators_side.py. Agreement is the argmax of one draft step's logits over the draft vocabulary, both
sides fed the same features and tokens, in float32.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_target

from eagle3_hub import Eagle3Config, Eagle3DraftModel, formats

ROOT = Path(__file__).resolve().parent.parent
SIDE = ROOT / "tests" / "peers" / "speculators_side.py"
PEERS_PYTHON = Path(os.environ.get("EAGLE3_PEERS_VENV", ROOT / ".venv-peers")) / "bin" / "python"
if os.environ.get("CI") and not PEERS_PYTHON.exists():  # CI builds it (.ci/run): its absence there is an error
    raise RuntimeError(f"CI: the peers' side environment {PEERS_PYTHON} is missing; .ci/run builds it first")
pytestmark = pytest.mark.skipif(
    not PEERS_PYTHON.exists(),
    reason=f"the peers' side environment is absent ({PEERS_PYTHON}): build it with `bash tests/peers/setup_venv.sh` "
    "(.ci/run does)",
)

AUX = [0, 1, 2]  # our convention (layer outputs); speculators' ids are these + 1
SEQ = 40
MIN_AGREEMENT = 0.999


def side(job: dict, tmp_path: Path) -> dict:
    """Run one job of speculators_side.py in the side environment; its JSON answer."""
    path = tmp_path / f"job-{job['do']}-{len(list(tmp_path.glob('job-*')))}.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [str(PEERS_PYTHON), str(SIDE), str(path)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, f"speculators_side.py {job['do']} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("peers") / "tiny-llama"
    make_tiny_target("llama").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def features(target_dir):
    """One sequence of random target features (scaled like real ones) and tokens, as a file both sides read."""
    g = torch.Generator().manual_seed(1)
    feats = {
        "hidden_states": torch.randn(1, SEQ, 3 * 64, generator=g) * 2.0,
        "input_ids": torch.randint(3, 256, (1, SEQ), generator=g),
    }
    path = target_dir.parent / "features.safetensors"
    save_file(feats, str(path))
    return path, feats


def their_forward(draft: Path, features_file: Path, tmp_path: Path, save: Path | None = None) -> tuple[dict, dict]:
    out = tmp_path / f"theirs-{draft.name}.safetensors"
    job = {"do": "forward", "draft": str(draft), "features": str(features_file), "out": str(out)}
    if save is not None:
        job["save"] = str(save)
    info = side(job, tmp_path)
    return info, load_file(str(out))


def trained_and_forward(job: dict, features_file: Path, tmp_path: Path) -> tuple[dict, dict]:
    """The trainer's draft saved, then its forward on the features, in one side call."""
    out = tmp_path / "theirs-trained.safetensors"
    info = side({**job, "features": str(features_file), "logits_out": str(out)}, tmp_path)
    return info, load_file(str(out))


def our_logits(draft: Eagle3DraftModel, feats: dict) -> torch.Tensor:
    with torch.no_grad():
        return draft(input_ids=feats["input_ids"], target_hidden_states=feats["hidden_states"]).logits[0]


def agreement(ours: torch.Tensor, theirs: dict) -> float:
    return (ours.argmax(-1) == theirs["argmax"][0]).float().mean().item()


def _trained_looking(draft: Eagle3DraftModel, seed: int = 0) -> Eagle3DraftModel:
    """Random weights of a trained draft's scale (norm weights near 1), embedding left as the target's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name != "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (0.05 if p.dim() > 1 else 0.1) + (p.dim() == 1))
    draft.set_vocab_mapping(torch.randperm(256, generator=g)[:200].sort().values)
    return draft


VARIANTS = {
    "reference": {},
    "norms_on": dict(norm_before_fc=True, norm_before_residual=True, norm_output=True),  # speculators 0.9's default
    "eagle31": dict(fc_norm=True, norm_output=True),
    # speculators 0.9's default architecture with a window shorter than the sequence (8 of 40 positions)
    "norms_on_window8": dict(
        norm_before_fc=True, norm_before_residual=True, norm_output=True, layer_types=["sliding_attention"], sliding_window=8
    ),
}


# ---------------------------------------------------------------------------------------------- (a) ours in theirs
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculators_runs_our_vllm_export(variant, target_dir, features, tmp_path):
    """`convert --to vllm --target` carries the target's embedding: speculators' `SpeculatorModel.from_pretrained`
    loads every tensor (without it, transformers 5.19 leaves the embedding uninitialised memory, which speculators
    refills from the verifier only where it happens to hold a NaN) and its forward agrees with ours; re-saved by speculators, the folder loads back here to the
    same logits (ours -> speculators 0.9 -> ours)."""
    features_file, feats = features
    target = make_tiny_target("llama")
    draft = _trained_looking(Eagle3DraftModel.from_target(target, aux_layer_ids=AUX, draft_vocab_size=200, **VARIANTS[variant]))
    draft.save_pretrained(tmp_path / "ours", save_embeddings=False)  # as published: the target's embedding
    out = formats.convert(tmp_path / "ours", tmp_path / "vllm", to="vllm", target=str(target_dir), verifier=str(target_dir))
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert config["speculators_version"] == formats.SPECULATORS_VERSION
    assert "embed_tokens.weight" in formats.tensor_shapes(out)

    info, theirs = their_forward(out, features_file, tmp_path, save=tmp_path / "resaved")
    assert info["class"] == "Eagle3DraftModel"
    windowed = "sliding_attention" in draft.config.layer_types
    assert (info["sliding_window_layers"], info["sliding_window"]) == (([0], 8) if windowed else ([], None))
    ours = our_logits(Eagle3DraftModel.from_pretrained(tmp_path / "ours", target=target), feats)
    assert agreement(ours, theirs) >= MIN_AGREEMENT
    torch.testing.assert_close(ours, theirs["logits"][0], atol=1e-4, rtol=1e-4)

    back = Eagle3DraftModel.from_pretrained(tmp_path / "resaved")  # speculators' own save_pretrained output
    assert agreement(our_logits(back, feats), theirs) >= MIN_AGREEMENT
    for flag in (*formats.VARIANT_FLAGS, "layer_types", "sliding_window"):
        assert getattr(back.config, flag) == getattr(draft.config, flag)
    assert back.config.aux_layer_ids == AUX


# ---------------------------------------------------------------------------------------------- (b) theirs in ours
TRAINER_OPTIONS = {
    "trainer_default": {},  # speculators 0.9's trainer: norm_before_fc, norm_before_residual, norm_output, window 2048
    "trainer_plain": dict(norm_before_residual=False, norm_before_fc=False, norm_output=False),
}


@pytest.mark.parametrize("name", list(TRAINER_OPTIONS))
def test_ours_runs_the_draft_speculators_trainer_builds(name, target_dir, features, tmp_path):
    """The draft speculators 0.9's trainer builds (`build_draft_model` with its TrainConfig defaults), saved by its
    `save_pretrained`: our loader reads every field (layer_types, sliding_window, the norms) and our forward agrees
    with its forward."""
    features_file, feats = features
    job = {
        "do": "train_default",
        "verifier": str(target_dir),
        "out": str(tmp_path / "theirs"),
        "verifier_vocab_size": 256,
        "draft_vocab_ids": list(range(3, 256, 2))[:120],
        "options": {"target_layer_ids": [a + 1 for a in AUX], **TRAINER_OPTIONS[name]},
    }
    info, theirs = trained_and_forward(job, features_file, tmp_path)
    config = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert config["auto_map"] == {"": "config.Eagle3SpeculatorConfig"} and "model_type" not in config
    assert info["sliding_window_layers"] == [0] and info["sliding_window"] == 2048

    ours = Eagle3DraftModel.from_pretrained(tmp_path / "theirs")
    layer = config["transformer_layer_config"]
    assert ours.config.layer_types == layer["layer_types"] == ["sliding_attention"]
    assert ours.config.sliding_window == 2048
    for flag in ("norm_before_fc", "norm_before_residual", "norm_output"):
        assert getattr(ours.config, flag) == config[flag]
    assert ours.config.aux_layer_ids == AUX
    assert agreement(our_logits(ours, feats), theirs) >= MIN_AGREEMENT
    torch.testing.assert_close(our_logits(ours, feats), theirs["logits"][0], atol=1e-4, rtol=1e-4)


def _models_sliding_windows() -> bool:
    """Whether Eagle3DraftModel runs sliding-window layers (the model side of issue 61)."""
    return hasattr(Eagle3Config(), "layer_types")


@pytest.mark.skipif(not _models_sliding_windows(), reason="Eagle3DraftModel does not model sliding windows yet")
def test_ours_runs_a_windowed_speculators_draft(target_dir, features, tmp_path):
    """A window shorter than the sequence (8 of 40 positions): the window changes the logits, and ours follow."""
    features_file, feats = features
    job = {
        "do": "train_default",
        "verifier": str(target_dir),
        "out": str(tmp_path / "theirs"),
        "verifier_vocab_size": 256,
        "draft_vocab_ids": list(range(3, 256, 2))[:120],
        "options": {"target_layer_ids": [a + 1 for a in AUX], "sliding_window": 8},
    }
    info, theirs = trained_and_forward(job, features_file, tmp_path)
    assert info["sliding_window"] == 8
    ours = Eagle3DraftModel.from_pretrained(tmp_path / "theirs")
    assert ours.config.sliding_window == 8
    torch.testing.assert_close(our_logits(ours, feats), theirs["logits"][0], atol=1e-4, rtol=1e-4)
    assert agreement(our_logits(ours, feats), theirs) >= MIN_AGREEMENT
