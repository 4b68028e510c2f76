"""Sharded training: the recipe path under accelerate's FSDP2 (`recipes/accelerate/fsdp.yaml`) on 2 CPU processes.

accelerate offers FSDP on accelerator devices only; `fsdp_on_cpu.py` lifts that one check so that the shipped
config runs here with gloo (see its docstring). Slow: four short training runs of a tiny target.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from training_helpers import recipe_for, write_recipe

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.targets import load_target
from eagle3_hub.training.train import train

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
}
# 36 training samples: batch 2 on each of 2 processes is the single process's batch 2 with grad_accum 2, and the
# held-out 4 split evenly, so both runs see the same samples in every step and evaluation
STEPS = 20
COMMON = {
    "max_steps": STEPS,
    "batch_size": 2,
    "save_every": 5,
    "eval_every": 10,
    "mixed_precision": "no",
    "group_by_length": False,
}


def fsdp_launch(config: Path, *extra: str, **popen) -> subprocess.Popen:
    with socket.socket() as s:  # a free port: another distributed test may hold accelerate's default
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes/accelerate/fsdp.yaml"),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(port),
        str(ROOT / "tests/fsdp_on_cpu.py"),
        "--config",
        str(config),
        *extra,
    ]
    return subprocess.Popen(cmd, env=ENV, **popen)


def run_fsdp(config: Path, log: Path, *extra: str) -> None:
    with open(log, "w") as f:  # a file, not a pipe: progress bars must never block the run
        proc = fsdp_launch(config, *extra, stdout=f, stderr=subprocess.STDOUT)
        assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]


def eval_losses(recipe: dict) -> list[tuple[int, float]]:
    metrics = json.loads((Path(recipe["output_dir"]) / "training_metrics.json").read_text())
    return [(h["step"], h["loss"]) for h in metrics["eval_history"]]


@pytest.mark.slow
def test_fsdp_on_two_processes_matches_one_process_and_resumes_after_a_kill(
    tmp_path, tiny_target_dir, data_dir, own_accelerator_state
):
    sources = [data_dir / "sharegpt.jsonl"]
    one = recipe_for(tmp_path / "one", tiny_target_dir, sources, train={**COMMON, "grad_accum": 2})
    two = recipe_for(tmp_path / "two", tiny_target_dir, sources, train={**COMMON, "grad_accum": 1})
    killed = recipe_for(tmp_path / "killed", tiny_target_dir, sources, train={**COMMON, "grad_accum": 1})

    # the same loss as one process, on the same data and seed
    train(one)
    run_fsdp(write_recipe(tmp_path / "two.yaml", two), tmp_path / "two.log")
    assert "[vocab]" in (tmp_path / "two.log").read_text()
    a, b = eval_losses(one), eval_losses(two)
    assert [s for s, _ in a] == [s for s, _ in b] == [10, STEPS]
    for (_, la), (_, lb) in zip(a, b):
        assert abs(la - lb) <= 1e-4 * abs(la), (a, b)

    # checkpoints are whole: the full (gathered) state dict, the optimizer, each process's RNG state
    last = Path(two["work_dir"]) / "checkpoints" / f"step-{STEPS}"
    assert {"pytorch_model_fsdp.bin", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl", "trainer_state.json"} <= {
        p.name for p in last.iterdir()
    }
    assert not list(last.glob("*rank*")) and not list(last.glob("*.distcp"))

    # killed after a checkpoint, resumed: it ends on the uninterrupted run's weights
    config = write_recipe(tmp_path / "killed.yaml", killed)
    ckpts = Path(killed["work_dir"]) / "checkpoints"
    with open(tmp_path / "killed.log", "w") as f:
        proc = fsdp_launch(config, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while not (ckpts / "step-10").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
        # the launcher and both training processes (torchrun starts them in sessions of their own)
        tree = [proc, *psutil.Process(proc.pid).children(recursive=True)]
        for p in tree:
            p.send_signal(signal.SIGKILL)
        proc.wait()
        psutil.wait_procs(tree[1:], timeout=30)
    assert not (ckpts / f"step-{STEPS}").exists() and not (Path(killed["output_dir"]) / "config.json").exists()
    run_fsdp(config, tmp_path / "resumed.log", "--resume")
    assert "[resume] from" in (tmp_path / "resumed.log").read_text()
    wa = load_file(Path(two["output_dir"]) / "model.safetensors")
    wb = load_file(Path(killed["output_dir"]) / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert eval_losses(two) == eval_losses(killed)

    # the draft written from the sharded model is whole and loads next to its target
    target, _ = load_target(str(tiny_target_dir))
    draft = Eagle3DraftModel.from_pretrained(two["output_dir"], target=target, dtype=torch.float32)
    single = load_file(Path(one["output_dir"]) / "model.safetensors")
    assert single.keys() == wa.keys() and all(single[k].shape == wa[k].shape for k in wa)
    assert draft.fc.weight.shape == single["fc.weight"].shape
