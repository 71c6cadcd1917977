"""Process-group setup for the model: torch.distributed world + Megatron's TP/DP groups.

The same code runs on CPU/gloo and CUDA/NCCL. ``init_parallel`` reads the usual launcher
environment (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, optionally
``LOCAL_RANK``) when the default process group is not up yet, then lays out Megatron's groups
(TP ranks contiguous: global rank = dp_rank * tp + tp_rank).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.net import free_port

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on import
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state


@dataclass(frozen=True)
class ParallelContext:
    """Where this process sits; groups are live torch ProcessGroups (never hand them upstream)."""

    rank: int
    world: int
    tp: int
    tp_rank: int
    dp: int
    dp_rank: int
    backend: str
    device: torch.device
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup


def init_parallel(
    tp: int, backend: str = "gloo", timeout_s: float = 60.0, *, gloo_groups: bool = False
) -> ParallelContext:
    """Initialise the default process group (from env, if needed) and Megatron's TP/DP groups.

    ``backend`` is ``"gloo"`` (CPU tensors) or ``"nccl"`` (one CUDA device per process, chosen
    from ``LOCAL_RANK``, else ``rank % device_count``). ``gloo_groups`` asks Megatron for its
    extra gloo DP groups (only its distributed-optimizer checkpointing uses them).
    Call ``destroy_parallel`` before initialising again with another ``tp``.
    """
    if backend not in ("gloo", "nccl"):
        raise ConfigError(f"backend={backend!r}; allowed: gloo, nccl")
    if not dist.is_initialized():
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            if world > 1:
                raise ConfigError("MASTER_PORT is not set for a multi-process run")
            os.environ["MASTER_PORT"] = str(free_port())
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
            torch.cuda.set_device(local)
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
    world = dist.get_world_size()
    if not isinstance(tp, int) or tp < 1 or world % tp:
        raise ConfigError(f"parallel.tp={tp!r} must be a positive integer dividing world size {world}")
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)),
        create_gloo_process_groups=gloo_groups,
    )
    return current_context()


def current_context() -> ParallelContext:
    """The context of an already initialised process (see ``init_parallel``)."""
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return ParallelContext(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        tp=parallel_state.get_tensor_model_parallel_world_size(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        dp=parallel_state.get_data_parallel_world_size(),
        dp_rank=parallel_state.get_data_parallel_rank(),
        backend=backend,
        device=device,
        tp_group=parallel_state.get_tensor_model_parallel_group(),
        dp_group=parallel_state.get_data_parallel_group(),
    )


def destroy_parallel(*, process_group: bool = True) -> None:
    """Forget Megatron's groups; with ``process_group`` also tear down the default group."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if process_group and dist.is_initialized():
        dist.destroy_process_group()


