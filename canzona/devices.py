"""Which device and dtype a trial runs with (no torch import unless a question needs it).

The one place that resolves a device setting (``dist.device``, a calibration's ``device``: auto |
cpu | cuda) against what this machine has; a trial's own (`trial_device`, `threads_per_rank`)
are read from its config by `canzona.plan.from_config`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


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


def cuda_visible() -> bool:
    """Is a CUDA device visible to this process?"""
    import torch

    return torch.cuda.is_available()


def device_here(kind: str) -> bool:
    """Can this machine run (and time) a ``kind`` device (cpu | cuda)? A CPU always; CUDA when
    a GPU is visible."""
    return kind == "cpu" or (kind == "cuda" and cuda_visible())


def resolve_device(requested: str, *, required: bool = False, key: str = "dist.device") -> str:
    """The device kind (cpu | cuda) that ``requested`` (auto | cpu | cuda, the setting ``key``)
    means here: auto is cuda when a GPU is visible, else cpu.

    ``required``: the device must be on this machine (a trial's ranks, a calibration), so cuda
    without a visible GPU is a `ConfigError`; a plan may be made for a cuda device this machine
    does not have (from a laptop, for a cluster), so planning does not require it.
    """
    if requested == "auto":
        return "cuda" if cuda_visible() else "cpu"
    if required and requested == "cuda" and not cuda_visible():
        from canzona.errors import ConfigError

        raise ConfigError(f"{key}=cuda but no CUDA device is visible; use {key}=cpu or auto")
    return requested


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block at ``n`` torch intra-op threads, restoring the number after: torch's CPU
    reductions split a tensor of more than 32768 elements over the threads, so a timing or a
    last bit depends on their number."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
