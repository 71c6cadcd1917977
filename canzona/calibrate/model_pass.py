"""Timing forward and backward of the Qwen3 model (tp=1) at a few sizes, for the pass fit."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from canzona.calibrate.clock import Clock
from canzona.inventory import model_config

# (model, width_div, layers, micro_batch, seq_len): around the local sweep's sizes on a CPU; on a
# GPU around the gpu profile's (full width, 4096 tokens). The fit is linear in flops, so its rate
# is that of the sizes timed: points of 1024 tokens at 0.6B's width fitted 151 TFLOP/s on an H200
# where the 8B-wide trial ran at 416 (2026-12-04, docs/results.md), tripling their forward.
CPU_POINTS = (
    ("qwen3-0.6b", 8, 1, 1, 32), ("qwen3-0.6b", 8, 2, 1, 32), ("qwen3-0.6b", 8, 4, 1, 32),
    ("qwen3-8b", 16, 2, 1, 32), ("qwen3-8b", 16, 4, 1, 32), ("qwen3-0.6b", 16, 2, 2, 64),
)
GPU_POINTS = (
    ("qwen3-0.6b", 1, 2, 1, 4096), ("qwen3-0.6b", 1, 4, 1, 4096), ("qwen3-0.6b", 1, 8, 1, 4096),
    ("qwen3-8b", 1, 1, 1, 4096), ("qwen3-8b", 1, 2, 1, 4096), ("qwen3-0.6b", 1, 4, 2, 2048),
)


def pass_dtype(device_kind: str) -> str:
    """The dtype the model passes are timed in: what a trial's ``train.dtype=auto`` resolves to on
    this device (bf16 on a GPU -- 8 times fp32's matmul rate on an H100/H200 -- and on a CPU with
    native bf16; fp32 otherwise). The simulator rescales by the matmul rates for a trial in the
    other dtype."""
    from canzona.devices import resolve_dtype

    return resolve_dtype("auto", device_kind)[0]


def time_model(rank: int, world: int, clock: Clock) -> list[dict[str, Any]]:
    """Forward / backward seconds at each point in `pass_dtype`, every process at once
    (Megatron's groups must be up, tp=1: `canzona.model.parallel.init_parallel`).

    The processes are lined up before every step, as a data-parallel trial's ranks are by their
    gradient collectives: left to drift, the process that finished its points first would leave
    the other to time its last ones alone on the machine."""
    import torch
    import torch.distributed as dist

    from canzona.model.data import synthetic_batch
    from canzona.model.qwen3 import build_model
    from canzona.sim.model import forward_flops

    points_in = GPU_POINTS if clock.cuda else CPU_POINTS
    dtype = torch.bfloat16 if pass_dtype(clock.device.type) == "bfloat16" else torch.float32
    points = []
    for k, (name, div, layers, mb, seq) in enumerate((points_in[0], *points_in)):
        mcfg = model_config(name, div, layers)
        model = build_model(mcfg, device=clock.device, seed=0, dtype=dtype)
        fwd, bwd = [], []
        for step in range(7):
            tokens, labels = synthetic_batch(mcfg, mb, seq, 0, step, rank, world)
            tokens, labels = tokens.to(clock.device), labels.to(clock.device)
            if world > 1 and dist.is_initialized():
                dist.barrier()
            t_f, loss = clock.call(model, tokens, labels)
            t_b, _ = clock.call(loss.backward)
            model.zero_grad(set_to_none=True)
            if step >= 2:
                fwd.append(t_f)
                bwd.append(t_b)
        del model
        if k == 0:
            continue  # the first model warms up the allocator and kernels
        points.append({"model": name, "width_div": div, "layers": layers, "micro_batch": mb, "seq_len": seq,
                       "flops": forward_flops(mcfg, 1, mb, seq), "forward_s": statistics.median(fwd),
                       "backward_s": statistics.median(bwd)})
    return points


def backward_work(rank: int, world: int, clock: Clock) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(prepare, run): a forward of the model at the local sweep's size, then its backward: the
    compute that a trial's gradient reductions overlap (`canzona.calibrate.comm.time_overlap`)."""
    import torch

    from canzona.model.data import synthetic_batch
    from canzona.model.qwen3 import build_model

    name, div, layers, mb, seq = (GPU_POINTS if clock.cuda else CPU_POINTS)[2]
    mcfg = model_config(name, div, layers)
    dtype = torch.bfloat16 if pass_dtype(clock.device.type) == "bfloat16" else torch.float32
    model = build_model(mcfg, device=clock.device, seed=0, dtype=dtype)
    tokens, labels = (t.to(clock.device) for t in synthetic_batch(mcfg, mb, seq, 0, 0, rank, world))
    graph: dict[str, Any] = {}

    def prepare() -> None:
        graph["loss"] = model(tokens, labels)

    def run() -> None:
        graph.pop("loss").backward()
        model.zero_grad(set_to_none=True)

    return prepare, run
