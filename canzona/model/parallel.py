"""Process-group setup for the model: torch.distributed world + Megatron's TP/DP and expert groups.

The same code runs on CPU/gloo and CUDA/NCCL. ``init_parallel`` reads the launch from the
environment (`canzona.launch_env.launch_env`: torchrun's / submitit's variables, or Slurm's own
under a plain ``srun``) when the default process group is not up yet, then lays out Megatron's
groups (TP ranks contiguous: global rank = dp_rank * tp + tp_rank, `canzona.layout.RankLayout`).

Backends map devices: on CUDA the default group is ``cpu:gloo,cuda:nccl``, so CUDA tensors go
over NCCL while the object collectives (``all_gather_object`` of the step records) and any CPU
tensor have a gloo home; an NCCL-only group has none. Megatron's ``initialize_model_parallel``
creates its TP/DP groups with ``backend=None`` (no NCCL communicator options are passed), and
``torch.distributed.new_group`` then takes the default group's backend string, so every
Megatron group has both halves too. (Megatron's own ``*_GLOO`` groups are separate, gloo-only,
and not created unless ``gloo_groups``.)
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from canzona import dist_rules
from canzona.errors import ConfigError
from canzona.launch_env import launch_env, local_device_index
from canzona.layout import ExpertLayout
from canzona.net import free_port

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on import
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state

# The backend string of the default group per device kind (see the module docstring).
BACKENDS = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl"}
# Accepted for ``device``: a device kind, or the name of its collective backend.
_ALIASES = {"cpu": "cpu", "gloo": "cpu", "cuda": "cuda", "nccl": "cuda"}

_device: torch.device | None = None  # this process's device, set by init_parallel


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
    # Megatron's expert grid: global rank = etp_rank + etp * (ep_rank + ep * edp_rank)
    ep: int
    ep_rank: int
    etp: int
    etp_rank: int
    edp: int
    edp_rank: int
    ep_group: dist.ProcessGroup
    etp_group: dist.ProcessGroup
    edp_group: dist.ProcessGroup


def init_parallel(
    tp: int, device: str = "cpu", timeout_s: float = 60.0, *, gloo_groups: bool = False, ep: int = 1,
    etp: int | None = None,
) -> ParallelContext:
    """Initialise the default process group (from the environment, if needed) and Megatron's
    TP/DP groups and expert groups.

    ``device`` is ``"cpu"`` (gloo) or ``"cuda"`` (one CUDA device per process, chosen by
    `canzona.launch_env.local_device_index`; groups ``cpu:gloo,cuda:nccl``); ``"gloo"`` and
    ``"nccl"`` are accepted as their aliases. ``gloo_groups`` asks Megatron for its extra gloo
    DP groups (only its distributed-optimizer checkpointing uses them). The chosen device is
    declared to `canzona.dist_rules`. ``ep`` expert-parallel ranks and ``etp`` expert-TP ranks
    (None: ``tp``, Megatron's default; 1 or ``tp``, `canzona.layout.ExpertLayout.check`) lay out
    the expert groups. Call ``destroy_parallel`` before initialising again with another ``tp``.
    """
    global _device
    kind = _ALIASES.get(device)
    if kind is None:
        raise ConfigError(f"device={device!r}; allowed: cpu, cuda (or their backends gloo, nccl)")
    if not dist.is_initialized():
        launch = launch_env()
        port = launch.master_port
        if port is None:
            if launch.world > 1:
                raise ConfigError("MASTER_PORT is not set for a multi-process run (and no SLURM_JOB_ID to derive it)")
            port = free_port()
        if kind == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError("device=cuda but no CUDA device is visible to this process")
            _device = torch.device("cuda", local_device_index(launch.local_rank, torch.cuda.device_count()))
            torch.cuda.set_device(_device)
        else:
            _device = torch.device("cpu")
        os.environ.update({**launch.exports(), "MASTER_PORT": str(port)})  # env:// rendezvous
        # device_id binds NCCL to this rank's GPU at once (eager communicator init; Megatron-LM
        # passes it too), so Megatron's TP/DP groups are split from the world communicator
        dist.init_process_group(
            BACKENDS[kind], rank=launch.rank, world_size=launch.world, timeout=timedelta(seconds=timeout_s),
            device_id=_device if kind == "cuda" else None,
        )
    elif _device is None or _device.type != kind:  # initialised by someone else (a test, a launcher)
        _device = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")
    dist_rules.declare_device(_device)
    world = dist.get_world_size()
    if not isinstance(tp, int) or tp < 1 or world % tp:
        raise ConfigError(f"parallel.tp={tp!r} must be a positive integer dividing world size {world}")
    experts = ExpertLayout.check(world // tp, tp, ep, tp if etp is None else etp)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=experts.ep,
        expert_tensor_parallel_size=experts.etp,
        distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)),
        create_gloo_process_groups=gloo_groups,
    )
    return current_context()


def current_context() -> ParallelContext:
    """The context of an already initialised process (see ``init_parallel``)."""
    # groups set up without init_parallel: CUDA when the world has an NCCL half
    device = _device if _device is not None else dist_rules.default_group_device()
    return ParallelContext(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        tp=parallel_state.get_tensor_model_parallel_world_size(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        dp=parallel_state.get_data_parallel_world_size(),
        dp_rank=parallel_state.get_data_parallel_rank(),
        backend=dist.get_backend(),  # "gloo" or "cpu:gloo,cuda:nccl"
        device=device,
        tp_group=parallel_state.get_tensor_model_parallel_group(),
        dp_group=parallel_state.get_data_parallel_group(),
        ep=parallel_state.get_expert_model_parallel_world_size(),
        ep_rank=parallel_state.get_expert_model_parallel_rank(),
        etp=parallel_state.get_expert_tensor_parallel_world_size(),
        etp_rank=parallel_state.get_expert_tensor_parallel_rank(),
        edp=parallel_state.get_expert_data_parallel_world_size(),
        edp_rank=parallel_state.get_expert_data_parallel_rank(),
        ep_group=parallel_state.get_expert_model_parallel_group(),
        etp_group=parallel_state.get_expert_tensor_parallel_group(),
        edp_group=parallel_state.get_expert_data_parallel_group(),
    )


def destroy_parallel(*, process_group: bool = True) -> None:
    """Forget Megatron's groups; with ``process_group`` also tear down the default group."""
    global _device
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if process_group and dist.is_initialized():
        dist.destroy_process_group()
        _device = None
