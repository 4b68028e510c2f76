"""Runs in the peers' side environment (tests/peers/setup_venv.sh): speculators 0.9.0's own code, driven by
tests/test_peers.py as a subprocess. One job per call: ``python speculators_side.py JOB.json``, where the job is

    {"do": "train_default", "verifier": DIR, "out": DIR, "draft_vocab_ids": [...], "options": {...}}
        the draft speculators' trainer builds (``speculators.train.cli.build_draft_model`` with its TrainConfig
        defaults, ``options`` overriding DraftArgs fields), its weights randomised by a seed, saved with its
        ``save_pretrained``; with ``"features": FILE, "logits_out": FILE`` then ``forward`` on the saved folder;
    {"do": "forward", "draft": DIR, "features": FILE, "out": FILE}
        ``SpeculatorModel.from_pretrained(DIR)`` and one step of its forward (``ttt_steps=1``) on the features file's
        ``hidden_states`` (1, s, 3H) and ``input_ids`` (1, s); writes the step's logits and argmax, and with
        ``"save": DIR`` the loaded model again with its ``save_pretrained``;
    {"do": "fixture", ...train_default's keys}
        the committed fixture tests/fixtures/peer_exports/speculators-0.9.0-trainer-default (see ``fixture``).

Prints one JSON line with what it did. Everything runs on the CPU with eager attention (flex attention's CPU path
is not what is under test).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from safetensors.torch import load_file, save_file


def train_default(job: dict) -> dict:
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import build_draft_model
    from speculators.train.config.schema import TrainConfig

    cfg = TrainConfig(
        verifier={"verifier_name_or_path": job["verifier"]},
        draft={"draft_attn_impl": "eager", "mask_token_id": 0, **job.get("options", {})},
    )
    args = argparse.Namespace(**cfg.flatten())
    vocab = job.get("verifier_vocab_size")
    ids = job.get("draft_vocab_ids")
    d2t = t2d = None
    if ids is not None:
        ids = torch.tensor(ids, dtype=torch.long)
        d2t = ids - torch.arange(len(ids))
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
    torch.manual_seed(job.get("seed", 0))
    model = build_draft_model(args, Eagle3DraftModel, t2d, d2t, len(ids) if ids is not None else None)
    with torch.no_grad():  # a trained-looking draft: every trainable tensor random, none left at its init
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * (0.05 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 else 0.0))
    model.save_pretrained(job["out"])
    saved = {"saved": job["out"], "tensors": sorted(model.state_dict())}
    if job.get("features"):  # and its forward in the same process: one import of speculators, not two
        saved.update(forward({"draft": job["out"], "features": job["features"], "out": job["logits_out"]}))
    return saved


def forward(job: dict) -> dict:
    from speculators import SpeculatorModel, SpeculatorModelConfig

    # as speculators' trainer loads --from-pretrained (build_draft_model): the config, its attention, then the weights
    config = SpeculatorModelConfig.from_pretrained(job["draft"])
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    model = SpeculatorModel.from_pretrained(job["draft"], config=config).eval()
    features = load_file(job["features"])
    captured = []
    model.lm_head.register_forward_hook(lambda module, args, out: captured.append(out.detach()))
    s = features["input_ids"].shape[1]
    with torch.no_grad():
        tokens = model(
            hidden_states=features["hidden_states"].to(model.fc.weight.dtype),
            input_ids=features["input_ids"],
            document_ids=torch.zeros(1, s, dtype=torch.long),
            ttt_steps=1,
        )
    save_file({"logits": captured[0].float().contiguous(), "argmax": tokens[0].contiguous()}, job["out"])
    if job.get("save"):
        model.save_pretrained(job["save"])
    return {
        "class": type(model).__name__,
        "sliding_window_layers": list(model.sliding_window_indices),
        "sliding_window": model.sliding_window,
    }


def fixture(job: dict) -> dict:
    """tests/fixtures/peer_exports/speculators-0.9.0-trainer-default (run from that folder's parent, the tests' tiny
    Llama saved there as ``tiny-llama``): the trainer's default draft, and one step of its forward on fixed features
    in ``<folder>.step.safetensors``."""
    out = job["out"]
    saved = train_default({**job, "do": "train_default"})
    g = torch.Generator().manual_seed(1)
    feats = {
        "hidden_states": torch.randn(1, 40, 3 * 64, generator=g) * 2.0,
        "input_ids": torch.randint(3, 256, (1, 40), generator=g),
    }
    save_file(feats, out + ".features.safetensors")
    forward({"draft": out, "features": out + ".features.safetensors", "out": out + ".theirs.safetensors"})
    step = {**feats, **{k: v for k, v in load_file(out + ".theirs.safetensors").items() if k == "logits"}}
    save_file(step, out + ".step.safetensors")
    return saved


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    result = {"train_default": train_default, "forward": forward, "fixture": fixture}[job["do"]](job)
    print(json.dumps(result))
