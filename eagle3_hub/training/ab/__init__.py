"""A/B comparison of draft-training choices: same data, same init, same steps, several seeds per arm.

    python -m eagle3_hub.training.ab --recipe recipes/smollm2-135m-instruct.yaml --arm kl --arm lk_log \\
        --seeds 0,1 --steps 2000 --out runs/ab-loss

Each arm is a set of recipe changes (a loss name is short for ``{train: {loss: NAME}}``). Every run starts from the
same draft (by default the output of the recipe's last stage, i.e. the shipped draft, continued with its own
vocabulary) and trains on the same data with the same held-out split (``data.seed`` fixed; ``train.seed`` is the
run's seed: the order of the batches), the data and the offline features prepared once for all runs. Each run has its
own work_dir, so an interrupted comparison resumes where it stopped.

Measured (a): the teacher-forced acceptance on the held-out split at the last step (what training evaluates): per
draft position the greedy accuracy and the sampling acceptance ``sum_v min(p, q)``, and the expected acceptance
length of a chain, greedy and at T=1. Written to ``ab.json`` and ``ab.md``: per arm the mean over seeds and the
run-to-run spread, and each arm's difference to the first arm. (b) and (c), tree decoding on benchmark suites
greedy and sampled, are ``eagle3-hub bench`` commands on each trained draft (``bench_commands``).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ...atomic import atomic_write_json, atomic_write_text
from ..losses import LOSSES
from ..recipe import load_recipe, load_stages, merge_changes

METRICS = {  # summary key -> (eval metric, label)
    "greedy_length": ("expected_acceptance_length", "acceptance length, greedy"),
    "sampled_length": ("expected_acceptance_length_sampled", "acceptance length, T=1"),
}
PER_POSITION = {"greedy_accuracy": "step_accuracy", "sampled_acceptance": "step_expected_acceptance"}


@dataclass
class Arm:
    name: str
    changes: dict = field(default_factory=dict)


def parse_arm(spec: str) -> Arm:
    """``lk_log`` (a loss name) or ``NAME=YAML`` recipe changes, e.g. ``mix={train: {loss: {kl: 0.5, lk_log: 0.5}}}``."""
    if "=" not in spec:
        if spec not in LOSSES:
            raise ValueError(
                f"--arm {spec!r}: give a loss name ({', '.join(LOSSES)}) or NAME=YAML recipe changes, "
                "e.g. mix='{train: {loss: {kl: 0.5, lk_log: 0.5}}}'"
            )
        return Arm(spec, {"train": {"loss": spec}})
    name, text = spec.split("=", 1)
    try:
        changes = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--arm {name}: the changes are not valid YAML ({' '.join(str(e).split())})") from None
    if not name or not isinstance(changes, dict):
        raise ValueError(
            f"--arm {spec!r}: expected NAME=YAML mapping of recipe changes, e.g. fcnorm='{{draft: {{fc_norm: true}}}}'"
        )
    return Arm(name, changes)


def base_recipe(recipe_path: str, stage: int | None = None, overrides: dict | None = None) -> dict:
    """The recipe of stage ``stage`` (1-based; default the last) of ``recipe_path``."""
    chain = load_stages(load_recipe(recipe_path, overrides), overrides)
    if stage is not None and not 1 <= stage <= len(chain):
        raise ValueError(f"--stage {stage}: {recipe_path} has stages 1..{len(chain)}")
    return chain[(stage or len(chain)) - 1]


def plan_runs(
    base: dict,
    arms: list[Arm],
    seeds: list[int],
    steps: int,
    out: str | Path,
    init: str | None = None,
    max_samples: int | None = None,
    eval_every: int | None = None,
) -> list[dict]:
    """One recipe per (arm, seed): ``base`` continued from ``init`` (default: its output_dir; ``scratch``: a new draft)
    for ``steps`` steps, with the data seed of ``base``, ``train.seed`` = seed, in ``out/runs/<arm>-seed<seed>``."""
    if len({a.name for a in arms}) != len(arms) or not arms:
        raise ValueError(f"give each --arm its own name, got {[a.name for a in arms]}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--steps must be a positive integer, got {steps!r}")
    out = Path(out)
    common = copy.deepcopy(base)
    init = base["output_dir"] if init is None else init
    common["draft"]["init_from"] = None if init == "scratch" else init
    common["draft"]["reselect_vocab"] = False  # the init draft's vocabulary: the same output space for every arm
    common["data"]["seed"] = base["data"]["seed"] if base["data"]["seed"] is not None else base["train"]["seed"]
    if max_samples:
        common["data"]["sources"] = [
            {**({"path": s} if isinstance(s, str) else s), "max_samples": max_samples} for s in common["data"]["sources"]
        ]
        common["data"]["synthesize"] = min(common["data"]["synthesize"], max_samples)
    t = common["train"]
    t.update(
        max_steps=steps,
        epochs=1,
        save_every=min(t["save_every"], steps),
        eval_every=eval_every or steps,
        log_every=min(t["log_every"], steps),
    )
    common.update(stages=[], push_to_hub=None)
    if common["features"]["mode"] == "offline":
        common["features"]["cache_dir"] = str(out / "shared" / "features")
    runs = []
    for arm in arms:
        for seed in seeds:
            recipe = merge_changes(copy.deepcopy(common), copy.deepcopy(arm.changes))
            recipe["train"]["seed"] = seed
            recipe["work_dir"] = str(out / "runs" / f"{arm.name}-seed{seed}")
            recipe["output_dir"] = str(Path(recipe["work_dir"]) / "draft")
            shares_data = not any(k in arm.changes for k in ("data", "target"))
            if not shares_data or "aux_layer_ids" in arm.changes.get("draft", {}):
                recipe["features"]["cache_dir"] = None  # its own features
            runs.append({"arm": arm.name, "seed": seed, "recipe": recipe, "shares_data": shares_data})
    return runs


def _link_shared_data(run: dict, out: Path) -> None:
    """The runs that do not change the data read one tokenised copy (and so one feature cache)."""
    work = Path(run["recipe"]["work_dir"])
    shared = out / "shared" / "data"
    shared.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "data").exists():
        os.symlink(os.path.relpath(shared, work), work / "data")


def run_all(runs: list[dict], out: str | Path, train_fn=None, log=print) -> list[dict]:
    """Train every run (each resumes its own checkpoints; a finished one is read back) and collect its held-out
    metrics at step 0 (the init draft) and at the last step."""
    from ..checkpoints import finished_run
    from ..train import train

    train_fn = train_fn or train
    out = Path(out)
    results = []
    for i, run in enumerate(runs, start=1):
        recipe = run["recipe"]
        if run["shares_data"]:
            _link_shared_data(run, out)
        if finished_run(recipe) and (Path(recipe["output_dir"]) / "training_metrics.json").exists():
            log(f"[ab] {i}/{len(runs)} {run['arm']} seed {run['seed']}: finished earlier ({recipe['work_dir']})")
        else:
            log(f"[ab] {i}/{len(runs)} {run['arm']} seed {run['seed']}: training in {recipe['work_dir']}")
            train_fn(recipe, resume=True)
        metrics = json.loads((Path(recipe["output_dir"]) / "training_metrics.json").read_text())
        history = metrics["eval_history"]
        results.append(
            {
                "arm": run["arm"],
                "seed": run["seed"],
                "draft": recipe["output_dir"],
                "init": history[0] if history and history[0]["step"] == 0 else None,
                "final": history[-1],
                "wall_time_s": metrics.get("wall_time_s"),
            }
        )
    return results


def _stats(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    return {"mean": mean, "spread": (max(values) - min(values)) / 2, "values": values}


def summarize(results: list[dict]) -> dict:
    """Per arm: mean and run-to-run spread (half the range over seeds) of each metric, per draft position too, and
    the difference of each arm's mean to the first arm's."""
    arms: dict[str, dict] = {}
    for r in results:
        arms.setdefault(r["arm"], []).append(r)
    summary = {"arms": {}, "init": None}
    for name, rs in arms.items():
        entry = {"seeds": [r["seed"] for r in rs], "drafts": [r["draft"] for r in rs]}
        for key, (metric, _) in METRICS.items():
            entry[key] = _stats([r["final"][metric] for r in rs])
        for key, metric in PER_POSITION.items():
            per_seed = [r["final"][metric] for r in rs]
            entry[key] = [_stats(list(vals)) for vals in zip(*per_seed)]
        summary["arms"][name] = entry
    first = next(iter(summary["arms"].values()))
    for entry in summary["arms"].values():
        entry["delta"] = {
            k: {"mean": entry[k]["mean"] - first[k]["mean"], "noise": max(entry[k]["spread"], first[k]["spread"])}
            for k in METRICS
        }
    init = next((r["init"] for r in results if r["init"] is not None), None)
    if init is not None:
        summary["init"] = {k: init[m] for k, (m, _) in METRICS.items()}
        summary["init"].update({k: init[m] for k, m in PER_POSITION.items()})
    return summary


def markdown(summary: dict, title: str = "A/B: teacher-forced acceptance on the held-out split") -> str:
    arms = summary["arms"]
    base = next(iter(arms))
    lines = [
        f"# {title}",
        "",
        "Mean over seeds ± run-to-run spread (half the range). Acceptance length: 1 + the expected number of "
        "drafted tokens accepted in a chain, greedy (the target's argmax) and sampling at T=1 (sum_v min(p, q)).",
        "",
        f"| arm | seeds | {METRICS['greedy_length'][1]} | {METRICS['sampled_length'][1]} | "
        f"Δ greedy vs {base} | Δ T=1 vs {base} |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda s: f"{s['mean']:.3f} ± {s['spread']:.3f}"  # noqa: E731
    if summary.get("init"):
        i = summary["init"]
        lines.append(f"| (init, step 0) | | {i['greedy_length']:.3f} | {i['sampled_length']:.3f} | | |")
    for name, e in arms.items():
        d = e["delta"]
        lines.append(
            f"| {name} | {','.join(map(str, e['seeds']))} | {fmt(e['greedy_length'])} | {fmt(e['sampled_length'])} | "
            f"{d['greedy_length']['mean']:+.3f} (noise {d['greedy_length']['noise']:.3f}) | "
            f"{d['sampled_length']['mean']:+.3f} (noise {d['sampled_length']['noise']:.3f}) |"
        )
    k = len(next(iter(arms.values()))["sampled_acceptance"])
    lines += [
        "",
        "Per draft position k: sampling acceptance at T=1 / greedy accuracy.",
        "",
        "| arm | " + " | ".join(f"k={j}" for j in range(k)) + " |",
        "|---|" + "---|" * k,
    ]
    for name, e in arms.items():
        cells = [
            f"{a['mean']:.3f}±{a['spread']:.3f} / {g['mean']:.3f}" for a, g in zip(e["sampled_acceptance"], e["greedy_accuracy"])
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bench_commands(results: list[dict], out: str | Path, questions: int | None = None) -> list[str]:
    """``eagle3-hub bench`` for each trained draft: (b) tree decoding greedy in float32 (the same text for every arm)
    on MT-bench, HumanEval and GSM8K first turns, (c) sampling at T=0.7 and T=1 (seeded) on MT-bench first turns."""
    n = f" --num-questions {questions}" if questions else ""
    cmds = []
    for r in results:
        where = Path(out) / "bench" / f"{r['arm']}-seed{r['seed']}"
        common = f"eagle3-hub bench --draft {r['draft']} --max-turns 1 --max-new-tokens 256{n}"
        cmds.append(
            f"{common} --suite mt_bench,humaneval,gsm8k --methods plain,tree --dtype float32 --temperature 0 --out {where}/greedy"
        )
        cmds.append(f"{common} --suite mt_bench --methods tree --temperature 0.7,1 --seed 0 --out {where}/sampled")
    return cmds


def write_report(summary: dict, results: list[dict], out: str | Path, commands: list[str]) -> tuple[Path, Path]:
    out = Path(out)
    atomic_write_json(out / "ab.json", {"summary": summary, "runs": results, "bench_commands": commands})
    md = markdown(summary) + "\nTree decoding on benchmark suites, per trained draft:\n\n```\n" + "\n".join(commands) + "\n```\n"
    atomic_write_text(out / "ab.md", md)
    return out / "ab.json", out / "ab.md"


__all__ = ["Arm", "base_recipe", "bench_commands", "markdown", "parse_arm", "plan_runs", "run_all", "summarize", "write_report"]
