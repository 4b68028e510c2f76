"""Reduced precision: the dtype ``auto`` picks, and the benchmark's greedy check by float32 scores (near_ties)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_bench import _suite, make_tokenizer
from tiny_models import make_tiny_target

from eagle3_hub import devices
from eagle3_hub.benchmark import bench, near_ties, report
from eagle3_hub.benchmark.bench import TurnRecord, run_benchmark


def test_default_dtype_follows_the_cpus_bf16_units(monkeypatch):
    assert isinstance(devices.cpu_has_bf16_units(), bool)
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = None
    if flags is not None:  # torch's view of the CPU and the kernel's agree
        assert devices.cpu_has_bf16_units() == bool(flags & {"avx512_bf16", "amx_bf16"})
    monkeypatch.setattr(devices, "cpu_has_bf16_units", lambda: True)
    assert devices.default_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(devices, "cpu_has_bf16_units", lambda: False)
    assert devices.default_dtype("cpu") == torch.float32
    assert devices.default_dtype("cuda:0") == torch.bfloat16
    assert devices.default_dtype("mps") == torch.float32
    monkeypatch.setattr(devices, "cpu_has_bf16_units", lambda: True)
    assert devices.resolve_device_dtype("cpu", "auto") == (torch.device("cpu"), torch.bfloat16)
    assert devices.resolve_device_dtype("cpu", "float32")[1] == torch.float32


def test_step_at_is_the_spacing_of_the_dtype():
    for value in (0.3, 1.0, 13.0, 24.5, -20.0):
        step = near_ties.step_at(value, torch.bfloat16)
        x = torch.tensor(value, dtype=torch.bfloat16)
        nxt = torch.nextafter(x.abs(), torch.tensor(float("inf"), dtype=torch.bfloat16))
        assert step == pytest.approx(float(nxt - x.abs()))
    assert near_ties.step_at(24.5, torch.float16) == 2.0 ** (4 - 10)
    assert near_ties.reduced_precision(torch.bfloat16) and not near_ties.reduced_precision(torch.float32)


def _greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, eos_token_id=[])
    return out[0, ids.shape[1] :].tolist()


def _record(method, prompt, output):
    return TurnRecord(
        "s", 1, "c", 1, "greedy", method, len(prompt), len(output), 0.1, 0.0, 0.1, len(output), [len(output)], 1.0, output, prompt
    )


def test_float32_greedy_scores_as_its_own_argmax():
    target = make_tiny_target("llama")
    prompt = [5, 17, 33, 9, 41]
    out = _greedy(target, torch.tensor([prompt]), 24)
    gaps, best = near_ties.argmax_gaps(near_ties.float32_reference(target), prompt, out)
    assert gaps.shape == best.shape == (24,)
    assert float(gaps.max()) <= 1e-5  # incremental and teacher-forced float32 agree on every argmax


def test_a_wrong_token_is_caught_and_bf16_greedy_is_not():
    """bf16 plain greedy emits near-argmax tokens only; one token swapped for an unlikely one is flagged."""
    target = make_tiny_target("llama").to(torch.bfloat16)
    prompt = [5, 17, 33, 9, 41]
    out = _greedy(target, torch.tensor([prompt]), 32)
    reference = near_ties.float32_reference(target)
    gaps, _ = near_ties.argmax_gaps(reference, prompt, out)
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + out[:10]])).logits[0, -1]
    wrong = out[:10] + [int(logits.argmin())] + out[11:]

    check = near_ties.near_tie_check([_record("plain", prompt, out), _record("tree", prompt, wrong)], target, torch.bfloat16)
    assert check["plain"]["tokens"] == 32 and check["plain"]["within_tolerance"]
    assert check["plain"]["max_gap"] == pytest.approx(float(gaps.max()))
    tree = check["tree"]
    assert not tree["within_tolerance"] and tree["over_tolerance"] >= 1
    assert tree["worst"]["token"] == 10 and tree["worst"]["gap"] > 10 * tree["worst"]["tolerance"]
    # the bf16 target itself, on the same text, ranks the swapped token far below its best too
    assert tree["worst"]["own_gap"] > 10 * tree["worst"]["own_tolerance"]
    assert tree["float32_over_tolerance"] >= tree["over_tolerance"] and tree["own_max_gap"] >= tree["worst"]["own_gap"]
    # the report says where the flagged tokens are: first the swapped one (tokens after it read a changed context)
    assert len(tree["flagged"]) == tree["over_tolerance"] and check["plain"]["flagged"] == []
    assert tree["flagged"][0]["token"] == 10 and tree["flagged"][0]["gap"] == tree["worst"]["gap"]

    lossless = bench.lossless_check(
        [_record("plain", prompt, out), _record("tree", prompt, wrong)], make_tokenizer(), near_ties=check
    )
    assert not lossless["tree"]["lossless"]
    assert lossless["tree"]["near_ties"] is check["tree"] and lossless["tree"]["plain_near_ties"] is check["plain"]
    assert report.lossless_text(lossless["tree"]) == "NO (1 of 1 turns differ)"


def test_plain_steps_recompute_plain_bf16_decodings_own_choice():
    """``plain_step_gaps`` is plain bf16 greedy's own step on the exact prefix: every token plain bf16 decoding emitted
    is its choice there (gap exactly 0), and a token it did not emit is not."""
    target = make_tiny_target("llama", seed=1).to(torch.bfloat16)
    for seed in range(2):
        prompt = torch.randint(3, 256, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        out = _greedy(target, torch.tensor([prompt]), 24)
        gaps, best = near_ties.plain_step_gaps(target, prompt, out)
        assert gaps.shape == best.shape == (24,) and gaps.tolist() == [0.0] * 24
        other = out[:7] + [(out[7] + 1) % 256]
        assert float(near_ties.plain_step_gaps(target, prompt, other)[0][7]) > 0


def test_a_token_is_flagged_only_when_neither_precision_calls_it_a_near_tie():
    """A near-tie as SmolLM2-135M in bf16 with a growing tree can emit one: float32 puts the emitted token 0.80
    below its best (tolerance 0.5 at 29.57), plain bf16 decoding's step 0.375 (tolerance 0.5): a bf16 near-tie, not
    flagged. A token far below the best in both is; one over the bf16 tolerance alone is not."""
    gaps, best = torch.tensor([0.7964, 6.0, 0.1]), torch.tensor([29.5692, 29.5692, 29.5692])
    own_gaps, own_best = torch.tensor([0.375, 6.125, 0.75]), torch.tensor([29.5, 29.5, 29.5])
    tol, own_tol, over32, flagged = near_ties.near_tie_flags(gaps, best, own_gaps, own_best, torch.bfloat16)
    assert tol.tolist() == own_tol.tolist() == [0.5, 0.5, 0.5]  # 4 steps of 0.125 between 16 and 32
    assert over32.tolist() == [True, True, False]
    assert flagged.tolist() == [False, True, False]
    assert near_ties.near_tie_flags(gaps, best, own_gaps, own_best, torch.bfloat16, steps=2.0)[3].tolist() == [
        True,
        True,
        False,
    ]  # at 2 steps (0.25) the first is over both


def test_a_near_tie_divergence_is_lossless_and_says_so(capsys):
    entry = {
        "turns": 4,
        "identical": 1,
        "lossless": True,
        "mismatches": [{}],
        "by_suite": {"s": {"turns": 4, "identical": 1}},
        "near_ties": {"max_gap": 0.17, "within_tolerance": True},
        "plain_near_ties": {"max_gap": 0.21},
    }
    text = report.lossless_text(entry, "s")
    assert text.startswith("yes, up to near-ties (3 of 4 turns part at one") and "0.17" in text and "0.21" in text
    assert report.lossless_text({**entry, "identical": 4}) == "yes"


def test_bfloat16_bench_scores_every_greedy_output(tmp_path):
    """A bf16 run: every method (plain included) is scored in float32, and tree decoding's tokens pass."""
    from eagle3_hub import Eagle3DraftModel

    target = make_tiny_target("llama").to(torch.bfloat16)
    draft = Eagle3DraftModel.from_target(target).eval().to(torch.bfloat16)
    draft.bind(target)
    res = run_benchmark(
        target,
        make_tokenizer(),
        _suite(tmp_path, n=2, turns=1),
        methods=["tree"],
        draft=draft,
        max_new_tokens=16,
        progress=False,
        warmup=0,
    )
    assert res["machine"]["dtype"] == "bfloat16" and "cpu_bf16_units" in res["machine"]
    entry = res["lossless"]["tree"]
    assert entry["near_ties"]["turns"] == 2 and entry["near_ties"]["tokens"] == 32
    assert entry["plain_near_ties"]["tokens"] == 32
    assert entry["near_ties"]["within_tolerance"] and entry["lossless"]
    assert entry["near_ties"]["by_suite"]["mt_bench"]["tokens"] == 32
    assert res["float32_check_skipped"] is None
    assert "prompt_ids" not in res["records"][0]  # records stay small: no prompts in bench.json

    off = run_benchmark(
        target,
        make_tokenizer(),
        _suite(tmp_path, n=1, turns=1),
        methods=["tree"],
        draft=draft,
        max_new_tokens=8,
        progress=False,
        warmup=0,
        float32_check=False,
    )
    assert "near_ties" not in off["lossless"]["tree"] and "turned off" in off["float32_check_skipped"]
