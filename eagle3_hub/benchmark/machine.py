"""What a benchmark ran on: the machine description stored in every ``bench.json`` and its one-line form."""

from __future__ import annotations

import os
import re

import torch

from ..devices import cpu_has_bf16_units


def machine_info(device: torch.device, dtype: torch.dtype | None = None) -> dict:
    """What the figures were measured on."""
    import platform

    import transformers

    from .. import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
        cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "eagle3_hub": __version__,
        "device": str(device),
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "cpu_bf16_units": cpu_has_bf16_units(),  # AVX512-BF16 / AMX: bf16 matmuls of several rows in hardware
    }
    # thread settings change CPU timings a lot (OMP_WAIT_POLICY=PASSIVE slows every short forward): keep them on record
    threading_env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "MKL_", "GOMP_"))}
    if threading_env:
        info["threading_env"] = dict(sorted(threading_env.items()))
    try:
        info["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    return info


def describe_machine(machine: dict) -> str:
    """One line: 'NVIDIA H100 80GB HBM3, bfloat16' or 'AMD EPYC (2 cores), float32'."""
    if machine.get("gpu"):
        where = machine["gpu"]
    else:
        n = machine.get("torch_threads") or machine.get("cpu_cores")
        where = f"{machine.get('cpu', 'CPU')} ({n} thread{'s' if n != 1 else ''}"
        where += ", bf16 units)" if machine.get("cpu_bf16_units") else ")"
    policy = (machine.get("threading_env") or {}).get("OMP_WAIT_POLICY")
    where += f", OMP_WAIT_POLICY={policy}" if policy and not machine.get("gpu") else ""
    return f"{where}, {machine.get('dtype')}, torch {machine.get('torch')}, transformers {machine.get('transformers')}"
