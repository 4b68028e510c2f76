"""Packed training batches (train.packing): several samples a row, each trained as if it were alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from datasets import Dataset
from safetensors.torch import load_file
from tiny_models import make_tiny_target
from training_helpers import recipe_for

from eagle3_hub.commands import learning_curve
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub.training.batching import PackedBatches, collate, collate_packed, pack_rows
from eagle3_hub.training.checkpoints import FINISHED
from eagle3_hub.training.features import TrainingFeatures
from eagle3_hub.training.throughput import matmul_peak
from eagle3_hub.training.train import train
from eagle3_hub.training.ttt import objective

T = {"ttt_steps": 4, "step_weight": 0.8, "loss": {"kl": 0.5, "lk_log": 0.5}, "lk_eta": 3.0}


def samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        mask = (torch.rand(n, generator=g) > 0.3).long()
        mask[:2] = 0  # a prompt, then the answer's tokens
        out.append({"input_ids": torch.randint(3, 256, (n,), generator=g).tolist(), "loss_mask": mask.tolist(), "index": i})
    return out


def loss_and_grads(draft, features, batch):
    draft.zero_grad()
    aux, scores = features(batch, draft)
    out = objective(draft, aux, batch, scores, T)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
    return out, grads


# a draft with a window shorter than the samples: the window counts from each sample's own restarting positions
LAYERS = {
    "one-layer": {},
    "two-layers-one-sliding": {
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4,
    },
}


@pytest.mark.parametrize("layers", sorted(LAYERS))
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_a_packed_batch_has_the_losses_metrics_and_gradients_of_its_samples_unpacked(mode, layers, tmp_path):
    """Online, the target runs on the packed rows (attention kept within each sample by their position ids);
    offline, the cached features of each sample are laid out in its row."""
    target = make_tiny_target("llama")
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=192, **LAYERS[layers]).float()
    draft.set_vocab_mapping(torch.randperm(256)[:192].sort().values)
    with torch.no_grad():  # far from init: attention that would notice another sample's keys
        for name, p in draft.named_parameters():
            if name != "embed_tokens.weight" and p.dim() == 2:
                p.normal_(0, 0.3)
    batch = samples([9, 14, 6, 11, 7, 5])
    recipe = {
        "features": {"mode": mode, "cache_dir": str(tmp_path / "features"), "reuse_from": []},
        "work_dir": str(tmp_path),
        "train": {"batch_size": 4},
    }
    features = TrainingFeatures(recipe, target, [0, 1, 3], [Dataset.from_list(batch)], 0, Accelerator(cpu=True))
    packed = collate_packed(batch, pad_id=0, capacity=20)
    assert packed["input_ids"].shape[0] < len(batch) and packed["document_ids"].max() >= 2  # really packed
    want, want_grads = loss_and_grads(draft, features, collate(batch, pad_id=0))
    got, got_grads = loss_and_grads(draft, features, packed)
    for name in ("step_count", "step_trained", "step_correct", "chain_correct", "chain_count"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert want.step_trained[-1] > 0
    for name in ("loss", "step_losses", "step_alpha", "chain_alpha"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6, msg=name)
    assert got_grads.keys() == want_grads.keys()
    for name, g in want_grads.items():  # float32 sums in another order per batch shape: ~1e-5 of the tensor's scale
        torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-4 * float(g.abs().max()), msg=name)


def test_packed_rows_hold_at_most_the_budget_and_every_sample_once():
    lengths = [int(n) for n in torch.randint(4, 60, (300,), generator=torch.Generator().manual_seed(1))]
    rows = pack_rows(lengths, 100)
    assert sorted(i for row in rows for i in row) == list(range(300))
    assert all(sum(lengths[i] for i in row) <= 100 for row in rows)
    assert sum(lengths) / (100 * len(rows)) > 0.95  # first-fit decreasing leaves little room
    g = torch.Generator().manual_seed(3)
    sampler = PackedBatches(lengths, 4, 100, g)
    first = list(sampler)
    assert sorted(i for b in first for i in b) == list(range(300))
    g.manual_seed(3)
    assert list(sampler) == first  # a function of the seed: a resumed run replays the same batches
    assert len(sampler) == len(first)


def test_a_packed_run_trains_and_reports_its_tokens_per_second(tmp_path, tiny_target_dir, data_dir, monkeypatch):
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))  # the peak measured here, not in the user's cache
    recipe = recipe_for(
        tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"packing": True, "pack_tokens": 160, "batch_size": 2}
    )
    out = train(recipe)
    m = json.loads((out / "training_metrics.json").read_text())
    tp = m["throughput"]
    assert tp["tokens"] > 0 and tp["tokens_per_s"] > 0 and 0 < tp["peak_share"] < 1
    assert m["acceptance"]["expected_acceptance_length"] >= 1
    # the learning curve from the evaluations the run wrote: tokens at each, a chain's runs one after another
    work = recipe["work_dir"]
    assert learning_curve.main([work, work, "--out", str(tmp_path / "curve.png")]) == 0
    points = json.loads((tmp_path / "curve.json").read_text())["points"]
    assert [p["step"] for p in points] == [3, 6, 3, 6] and (tmp_path / "curve.png").stat().st_size > 0
    tokens = [p["tokens"] for p in points]
    assert tokens[1] == tp["tokens"] and tokens[2] == tokens[1] + tokens[0] and tokens == sorted(tokens)
    assert all(0 <= p["step1_accuracy"] <= 1 and p["greedy"] >= 1 and p["T=0.7"] >= 1 and p["T=1"] >= 1 for p in points)


def test_a_packed_run_resumed_from_a_checkpoint_ends_where_the_uninterrupted_run_ends(
    tmp_path, tiny_target_dir, data_dir, monkeypatch
):
    """Packed epochs of a few batches: the resumed run rebuilds the epoch's packing from the seed, skips its first
    batches, and crosses into the next epoch as the uninterrupted run did."""
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path / "cache"))
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        train={
            "packing": True,
            "pack_tokens": 400,
            "batch_size": 2,
            "max_steps": 9,
            "save_every": 4,
            "eval_every": 100,
            "keep_checkpoints": 5,
        },
    )
    out = train(recipe)
    ckpts = Path(recipe["work_dir"]) / "checkpoints"
    want = load_file(ckpts / "step-9" / "model.safetensors")
    state = json.loads((ckpts / "step-4" / "trainer_state.json").read_text())
    assert len(list(ckpts.glob("step-*"))) == 3
    first = json.loads((out / "training_metrics.json").read_text())
    for step in ("step-8", "step-9"):  # back to step 4, as after a kill
        shutil.rmtree(ckpts / step)
    shutil.rmtree(out)
    (Path(recipe["work_dir"]) / FINISHED).unlink()
    train(recipe, resume=True)
    got = load_file(ckpts / "step-9" / "model.safetensors")
    assert all(torch.equal(got[k], want[k]) for k in want)
    again = json.loads((out / "training_metrics.json").read_text())
    assert again["eval_history"] == first["eval_history"]
    # step 4 was in the middle of an epoch (the resumed run skipped its first batches) and 9 in a later one
    assert (
        state["batches_in_epoch"] > 0
        and json.loads((ckpts / "step-9" / "trainer_state.json").read_text())["epoch"] > state["epoch"]
    )


def test_the_matmul_peak_is_cached_and_only_ever_raised(tmp_path, monkeypatch):
    """A peak measured while other work slowed the machine is replaced by a later, higher one, never lowered."""
    monkeypatch.setenv("EAGLE3_HUB_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    first = matmul_peak(cpu)
    path = tmp_path / "measurements" / "matmul_peak.json"
    assert first["flops"] > 0 and json.loads(path.read_text()) == [first]
    for cached, want_cached in ((1.0, False), (1e18, True)):
        path.write_text(json.dumps([{**first, "flops": cached}]))
        got = matmul_peak(cpu)
        assert (got["flops"] == cached) == want_cached and len(json.loads(path.read_text())) == 1
