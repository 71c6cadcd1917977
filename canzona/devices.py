"""Which device and dtype a trial runs with (no torch import unless a question needs it)."""

from __future__ import annotations

from typing import Any


def cpu_has_bf16() -> bool:
    """Does this CPU compute bf16 dot products natively (AVX512-BF16 or AMX)?"""
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool((probe and probe()) or (amx and amx()))


def resolve_dtype(requested: str, device_kind: str, cpu_bf16: bool | None = None) -> tuple[str, str]:
    """(``"bfloat16"`` or ``"float32"``, why) for ``train.dtype`` on a device of ``device_kind``."""
    if requested == "bf16":
        return "bfloat16", "train.dtype=bf16"
    if requested == "fp32":
        return "float32", "train.dtype=fp32"
    if device_kind == "cuda":
        return "bfloat16", "train.dtype=auto on CUDA: bf16 as Megatron's --bf16"
    if cpu_has_bf16() if cpu_bf16 is None else cpu_bf16:
        return "bfloat16", "train.dtype=auto on a CPU with native bf16 dot products: bf16"
    return "float32", "train.dtype=auto on a CPU without native bf16: fp32 (emulated bf16 would distort the ratios)"



def trial_device(cfg: Any) -> str:
    """The device kind a trial of ``cfg`` runs on here: ``dist.device``, or for auto CUDA when
    a GPU is visible."""
    if cfg.dist.device != "auto":
        return cfg.dist.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
