"""Which device and precision a run uses when it is not told: ground floor, imports nothing from lmlm.

``default_device()`` is ``cuda`` where a GPU is visible, else ``cpu``; ``native_bf16()`` says whether
this CPU computes in bfloat16 natively, which decides ``"auto"`` precision for training
(``lmlm train``) and the encoder's ``"auto"`` dtype (``lmlm kb build``).
"""

from __future__ import annotations

__all__ = ["default_device", "native_bf16"]


def default_device(device: str | None = None) -> str:
    """``device`` as given, or (``None`` or ``"auto"``) ``"cuda"`` where torch sees a GPU, else ``"cpu"``."""
    if device and device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX), so bf16 matmuls pay off;
    asked of torch's own CPU feature detection (the one its kernels dispatch on). Kernels held below
    AVX-512 (``ATEN_CPU_CAPABILITY=avx2``) count as no bf16, whatever the chip has."""
    import torch

    if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AMX"):
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
