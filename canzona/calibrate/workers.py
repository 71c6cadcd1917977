"""The calibration's worker processes: compute timed by every process at once (as a trial's
ranks share the machine), then the collectives between them and the model passes.

``world`` processes on this host, each with the calibration's device: on CPU two processes over
gloo; on CUDA one process per GPU (``cuda:<rank>``) over ``cpu:gloo,cuda:nccl`` -- two when two
GPUs are visible, else one, which measures compute and the model but no collective.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from canzona.calibrate.clock import Clock
from canzona.calibrate.comm import CALL_CPU, idle_threads_cpu, time_call_cpu, time_collectives, time_overlap
from canzona.calibrate.compute import measure_compute
from canzona.calibrate.grad_overlap import time_grad_reduce_overlap
from canzona.calibrate.model_pass import backward_work, time_model
from canzona.calibrate.probe import per_core, throughput_probe
from canzona.calibrate.settings import Options
from canzona.host_memory import retain_freed_memory
from canzona.net import free_port

TIMEOUT_S = 600.0


def worker(rank: int, world: int, port: int, opts: Options, device_kind: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from canzona.model.parallel import destroy_parallel, init_parallel

    torch.set_num_threads(opts.threads)
    if device_kind == "cpu":  # as a trial's CPU rank runs (`canzona.host_memory`)
        retain_freed_memory()
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    ctx = init_parallel(1, device_kind, TIMEOUT_S)
    try:
        def loaded_probe() -> float:
            """A core's speed with every worker busy (`canzona.calibrate.probe.per_core`)."""
            dist.barrier()
            rates: list[Any] = [None] * world
            dist.all_gather_object(rates, throughput_probe())
            return per_core(rates, os.cpu_count() or 1)

        probes = [loaded_probe()] if device_kind == "cpu" else []

        def agree(go: bool) -> bool:
            """Every process takes the same go / skip decision (the most cautious one)."""
            flag = torch.tensor([1 if go else 0], device=ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            return bool(flag.item())

        result: dict[str, Any] = {"compute": measure_compute(opts, ctx.device, agree)}
        dist.barrier()
        clock = Clock(ctx.device)
        if opts.collectives and world > 1:
            result["collectives"] = time_collectives(world, opts.quick, clock)
            if not clock.cuda:
                result["collectives"][CALL_CPU] = time_call_cpu(world, opts.quick)
                result["idle_threads_cpu_per_s"] = idle_threads_cpu(0.5 if opts.quick else 1.0)
            # against the model's backward where the model is timed (what the gradient
            # reductions overlap in a trial), else against matmuls
            work = backward_work(rank, world, clock) if opts.model else None
            result["overlap"] = time_overlap(opts.quick, clock, work)
            del work
            if opts.model:  # the gradient buckets' reductions beside the backward, as a trial runs them
                result["grad_reduce_overlap"] = time_grad_reduce_overlap(rank, world, clock, ctx, opts.threads,
                                                                         opts.quick)
        if opts.model:
            result["model"] = time_model(rank, world, clock)
        if probes:  # at the start and at the end of the workers' measurements, the mean
            probes.append(loaded_probe())
            result["speed_probe_all_cores"] = sum(probes) / len(probes)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        destroy_parallel()


def run_workers(opts: Options, device_kind: str, world: int) -> dict[str, Any]:
    """Start ``world`` workers and return rank 0's results (raises if a worker fails)."""
    return spawn_for_result(worker, world, opts, device_kind)


def spawn_for_result(target: Callable[..., None], world: int, *args: Any) -> dict[str, Any]:
    """Spawn ``target(rank, world, port, *args, out)`` in ``world`` processes and return the JSON
    its rank 0 wrote to ``out`` (raises if a process fails)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        mp.start_processes(target, args=(world, free_port(), *args, out), nprocs=world, join=True,
                           start_method="spawn")
        return json.loads(Path(out).read_text())
