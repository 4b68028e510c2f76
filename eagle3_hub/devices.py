"""Device and dtype resolution: the one place where ``"auto"`` is given a meaning."""

from __future__ import annotations

import torch


def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX-BF16). Without them (AVX2)
    a bf16 matmul of several rows costs about as many one-row products, so tree verification needs float32."""
    capability = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    if capability is not None:
        flags = capability()
        return bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))
    try:  # older torch: the kernel's view of the CPU
        with open("/proc/cpuinfo") as f:
            words = set(f.read().split())
    except OSError:
        return False
    return bool(words & {"avx512_bf16", "amx_bf16"})


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` / ``None``: CUDA, else Apple MPS, else CPU. Anything else is passed to ``torch.device``."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device: use auto, cpu, cuda, cuda:N or mps") from e
    check_available(dev)
    return dev


def check_available(device: torch.device) -> None:
    """Refuse, in one line, a CUDA or MPS device this torch cannot use (before a model is moved there)."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(
                f"device {str(device)!r} is not available: {why} (torch {torch.__version__}); use --device cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} is not available: {torch.cuda.device_count()} CUDA GPU(s) are visible, numbered from 0"
            )
    elif device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(
                f"device 'mps' is not available: this torch or machine has no Apple MPS backend "
                f"(torch {torch.__version__}); use --device cpu or auto"
            )


def default_dtype(device: str | torch.device) -> torch.dtype:
    """What ``dtype="auto"`` picks: bfloat16 on CUDA and on CPUs with bf16 units, float32 elsewhere (MPS included).

    Greedy tree decoding is token for token plain greedy in float32; in bf16 the two can part at a near-tie
    (``eagle3_hub.benchmark.near_ties``)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_bf16_units() else torch.float32
    return torch.bfloat16 if device.type == "cuda" else torch.float32


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """``"auto"`` / ``None``: ``default_dtype(device)``; a name (``bfloat16``, ``bf16``, ...) or a ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported: use auto, float32, bfloat16 or float16")
    return _DTYPES[dtype]


def resolve_device_dtype(device="auto", dtype="auto") -> tuple[torch.device, torch.dtype]:
    dev = resolve_device(device)
    return dev, resolve_dtype(dtype, dev)
