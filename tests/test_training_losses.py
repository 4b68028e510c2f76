"""Training objectives (`train.loss`): the LK acceptance losses against hand-computed values and a naive position-by-
position reference, gradients, selection from the recipe, and the draft architecture keys of a recipe (`fc_norm`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_training import ttt_case
from training_helpers import recipe_for, run_cli, write_recipe

from eagle3_hub.training.losses import LOSSES, acceptance, parse_loss, position_loss
from eagle3_hub.training.recipe import load_recipe
from eagle3_hub.training.train import train
from eagle3_hub.training.ttt import acceptance_metrics, ttt_loss


def test_acceptance_and_each_loss_on_a_hand_computed_example():
    """The target puts 0.5 and 0.3 on the draft's two tokens (0.2 outside its vocabulary); the draft 0.6 and 0.4.
    Speculative sampling accepts min(.5, .6) + min(.3, .4) = 0.8: the mass outside the draft vocabulary never is."""
    p = torch.tensor([[0.5, 0.3]])
    q = torch.tensor([[0.6, 0.4]])
    p_draft = p / p.sum(-1, keepdim=True)  # 0.625, 0.375: what `kl` compares with
    assert acceptance(p, q).item() == pytest.approx(0.8)
    logq = q.log()
    expect = {
        "kl": -(0.625 * math.log(0.6) + 0.375 * math.log(0.4)),
        "lk": 0.2,
        "lk_log": -math.log(0.8),
    }
    kl = 0.625 * math.log(0.625 / 0.6) + 0.375 * math.log(0.375 / 0.4)
    lam = math.exp(-3 * 0.8)
    expect["lk_hybrid"] = lam * kl + (1 - lam) * 0.2
    for name in LOSSES:
        loss, alpha = position_loss({name: 1.0}, logq, p_draft, p, lk_eta=3.0)
        assert loss.item() == pytest.approx(expect[name], rel=1e-5), name
        assert alpha.item() == pytest.approx(0.8)
    mixed, _ = position_loss({"kl": 0.5, "lk_log": 0.25}, logq, p_draft, p)
    assert mixed.item() == pytest.approx(0.5 * expect["kl"] + 0.25 * expect["lk_log"], rel=1e-5)
    # the extremes of lk_hybrid: eta 0 is KL alone, a large eta the acceptance alone
    assert position_loss({"lk_hybrid": 1}, logq, p_draft, p, lk_eta=0.0)[0].item() == pytest.approx(kl, rel=1e-4)
    assert position_loss({"lk_hybrid": 1}, logq, p_draft, p, lk_eta=1e3)[0].item() == pytest.approx(0.2, rel=1e-5)


def naive_lk(draft, step_logits, target_logits, loss_mask, attention_mask, K, name, eta=3.0, temperature=1.0):
    """Step losses and acceptance sums written out position by position: p over the full target vocabulary, read at
    the draft's tokens (not renormalised), for the positions the loss trains on (scored, target argmax in vocab)."""
    b, s, _ = target_logits.shape
    draft_ids = draft.draft_to_target_ids(torch.arange(draft.config.draft_vocab_size))
    per_step = [[] for _ in range(K)]
    alpha_sum, chain_sum = [0.0] * K, [0.0] * K
    for i in range(b):
        for t in range(s):
            chain = 1.0
            for k in range(K):
                token = t + 2 + k
                if token >= s or not (loss_mask[i, token] and attention_mask[i, token]):
                    chain = 0.0
                    continue
                if not draft.t2d[target_logits[i, token - 1].argmax()]:
                    chain = 0.0
                    continue
                p_full = target_logits[i, token - 1].softmax(-1)[draft_ids]
                q = step_logits[i, t, k].softmax(-1)
                if temperature != 1.0:  # both sampled at T; the mass outside the draft vocabulary as at T=1
                    p_full = (target_logits[i, token - 1][draft_ids] / temperature).softmax(-1) * p_full.sum()
                    q = (step_logits[i, t, k] / temperature).softmax(-1)
                a = torch.minimum(p_full, q).sum().item()
                p_r = p_full / p_full.sum()
                kl = (p_r * (p_r.log() - q.log())).sum().item()
                per_step[k].append((a, kl))
                alpha_sum[k] += a
                chain *= a
                chain_sum[k] += chain
    losses = []
    for k in range(K):
        a = torch.tensor([x[0] for x in per_step[k]])
        kl = torch.tensor([x[1] for x in per_step[k]])
        if name == "lk":
            losses.append((1 - a).mean().item())
        elif name == "lk_log":
            losses.append((-a.log()).mean().item())
        else:
            lam = math.exp(-eta * a.mean().item())
            losses.append(lam * kl.mean().item() + (1 - lam) * (1 - a).mean().item())
    return losses, alpha_sum, chain_sum


@pytest.mark.parametrize("name", ["lk", "lk_log", "lk_hybrid"])
def test_lk_losses_in_ttt_match_a_naive_position_by_position_reference(name):
    draft, aux, ids, target_logits, loss_mask, att, K, step_logits = ttt_case()
    ref, alpha_sum, chain_sum = naive_lk(draft, step_logits, target_logits, loss_mask, att, K, name)
    with torch.no_grad():
        out = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K, step_weight=0.8, loss=name)
    torch.testing.assert_close(out.step_losses, torch.tensor(ref), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.loss, torch.tensor(sum(0.8**k * v for k, v in enumerate(ref))), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.step_alpha, torch.tensor(alpha_sum), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.chain_alpha, torch.tensor(chain_sum), rtol=1e-4, atol=1e-5)
    assert min(alpha_sum) > 0 and chain_sum[-1] < chain_sum[0]
    m = acceptance_metrics(out.step_correct, out.step_count, out.chain_correct, out.chain_count, out.step_alpha, out.chain_alpha)
    n = out.step_count.tolist()
    assert m["step_expected_acceptance"] == pytest.approx([a / c for a, c in zip(alpha_sum, n)], rel=1e-4)
    assert m["expected_acceptance_length_sampled"] == pytest.approx(1 + sum(c / n[0] for c in chain_sum), rel=1e-4)


@pytest.mark.parametrize("loss", ["kl", "lk", "lk_log", "lk_hybrid", {"kl": 0.5, "lk_log": 0.5}])
def test_every_loss_sends_gradients_to_the_draft(loss):
    draft, aux, ids, target_logits, loss_mask, att, K, _ = ttt_case()
    out = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K, loss=loss)
    out.loss.backward()
    for name in ("fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight"):
        grad = dict(draft.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, (loss, name)
    if isinstance(loss, dict):  # a mix is the weighted sum of its parts
        with torch.no_grad():
            parts = [ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K, loss=n).loss for n in loss]
        torch.testing.assert_close(out.loss.detach(), 0.5 * parts[0] + 0.5 * parts[1])


def test_lk_hybrid_weight_is_not_differentiated():
    """lam = exp(-eta * sg[alpha]): the gradient is lam * grad KL + (1 - lam) * grad (1 - alpha), lam a constant."""
    p = torch.tensor([[0.5, 0.3, 0.1]])
    logits = torch.tensor([[0.2, -0.1, 0.4]], requires_grad=True)
    p_draft = p / p.sum()
    loss, alpha = position_loss({"lk_hybrid": 1.0}, logits.log_softmax(-1), p_draft, p)
    (g,) = torch.autograd.grad(loss, logits)
    lam = math.exp(-3 * alpha.item())
    logq = logits.log_softmax(-1)
    kl = (p_draft * (p_draft.log() - logq)).sum()
    tv = 1 - torch.minimum(p, logq.exp()).sum()
    (g_kl,) = torch.autograd.grad(kl, logits, retain_graph=True)
    (g_tv,) = torch.autograd.grad(tv, logits)
    torch.testing.assert_close(g, lam * g_kl + (1 - lam) * g_tv)


def test_parse_loss_accepts_names_and_mixes_and_refuses_the_rest():
    assert parse_loss("lk_log") == {"lk_log": 1.0}
    assert parse_loss({"kl": 0.5, "lk_log": 0.5}) == {"kl": 0.5, "lk_log": 0.5}
    for bad, message in [
        ("ce", "unknown loss 'ce'; choose from kl, lk, lk_log, lk_hybrid"),
        ({"kl": -1}, "non-negative numbers"),
        ({"kl": 0}, "not all zero"),
        (3, "must name a loss"),
        ({}, "must name a loss"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_loss(bad)


def test_the_recipe_selects_the_loss_and_refuses_an_unknown_one(tmp_path, tiny_target_dir, data_dir, capsys):
    recipe = recipe_for(tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"max_steps": 3})
    config = write_recipe(tmp_path / "recipe.yaml", recipe)
    assert run_cli(config, "--train.loss", "mse") == 2
    err = capsys.readouterr().err
    assert "eagle3-hub train: error: train.loss: unknown loss 'mse'; choose from kl, lk, lk_log, lk_hybrid" in err
    assert "Traceback" not in err and not Path(recipe["work_dir"]).exists()
    assert run_cli(config, "--train.lk_eta", "-1") == 2
    assert "train.lk_eta must be a non-negative number" in capsys.readouterr().err

    assert run_cli(config, "--train.loss", "{kl: 0.5, lk_log: 0.5}") == 0
    metrics = json.loads((Path(recipe["output_dir"]) / "training_metrics.json").read_text())
    assert metrics["recipe"]["train"]["loss"] == {"kl": 0.5, "lk_log": 0.5}
    acc = metrics["acceptance"]
    assert len(acc["step_expected_acceptance"]) == 3 and 0 < acc["step_expected_acceptance"][0] <= 1
    assert 1.0 <= acc["expected_acceptance_length_sampled"] <= 4.0
    # the objective is part of the run's identity: another loss in the same work_dir is another run
    with pytest.raises(ValueError, match=r"another run \(its recipe differs: train.loss"):
        train(load_recipe(config, {"train": {"loss": "lk"}}), resume=True)


def test_draft_keys_of_the_recipe_reach_the_new_drafts_config(tmp_path, tiny_target_dir, data_dir, capsys):
    """`draft: {fc_norm: true}` (EAGLE 3.1: an RMSNorm over each target feature before fc) and any other
    Eagle3Config key the target does not fix; a continued draft keeps its own architecture."""
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        train={"max_steps": 3, "lr": 0.02},
        draft={"fc_norm": True, "rms_norm_eps": 1e-5},
    )
    out = train(recipe)
    config = json.loads((out / "config.json").read_text())
    assert config["fc_norm"] is True and config["rms_norm_eps"] == 1e-5
    weights = load_file(out / "model.safetensors")
    assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= set(weights)
    assert not torch.equal(weights["fc_norm.0.weight"].float(), torch.ones(weights["fc_norm.0.weight"].shape))  # trained

    with pytest.raises(
        KeyError,
        match=r"Unknown recipe key `draft.fc_nrm` \(did you mean `draft.fc_norm`\?\)\. Known keys: "
        r".*draft.fc_norm",
    ):
        load_recipe(None, {"draft": {"fc_nrm": True}})
    with pytest.raises(KeyError, match=r"Unknown recipe key `draft.hidden_size`"):  # the target's, not the recipe's
        load_recipe(None, {"draft": {"hidden_size": 32}})
    later = recipe_for(
        tmp_path / "later",
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        train={"max_steps": 1},
        draft={"init_from": str(out), "draft_vocab_size": None, "fc_norm": False},
    )
    assert run_cli(write_recipe(tmp_path / "later.yaml", later)) == 2
    assert re.search(
        r"error: draft.fc_norm=False changes the architecture of draft.init_from \(.* has True\)", capsys.readouterr().err
    )


def test_acceptance_at_another_temperature_matches_the_position_by_position_reference():
    """Evaluation at T=0.7 (where chat users sample): target and draft both at T, chained over the steps."""
    draft, aux, ids, target_logits, loss_mask, att, K, step_logits = ttt_case()
    _, _, chain_07 = naive_lk(draft, step_logits, target_logits, loss_mask, att, K, "lk", temperature=0.7)
    _, _, chain_1 = naive_lk(draft, step_logits, target_logits, loss_mask, att, K, "lk")
    with torch.no_grad():
        out = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K, loss="kl", temperatures=(0.7, 1.0))
    torch.testing.assert_close(out.chain_alpha_at[0], torch.tensor(chain_07), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.chain_alpha_at[1], out.chain_alpha, rtol=1e-5, atol=1e-6)
    assert chain_07 != pytest.approx(chain_1)
    m = acceptance_metrics(
        out.step_correct,
        out.step_count,
        out.chain_correct,
        out.chain_count,
        out.step_alpha,
        out.chain_alpha,
        out.chain_alpha_at,
        (0.7, 1.0),
    )
    n0 = out.step_count[0].item()
    assert m["expected_acceptance_length_at"]["0.7"] == pytest.approx(1 + sum(c / n0 for c in chain_07), rel=1e-4)
    assert m["expected_acceptance_length_at"]["1"] == pytest.approx(m["expected_acceptance_length_sampled"], rel=1e-5)
