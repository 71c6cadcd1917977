"""The wait a blocking collective adds when the CPU is oversubscribed (ranks × threads > cores).

A gloo collective between two ranks needs both processes on a core at once. When every core is
shared by two computing processes, a rank reaching a collective waits, on top of the
collective's own latency, for the scheduler to run its peer, and its peer for it: measured on the
README's first sweep at 4 ranks on 2 cores, each blocking TP collective took about 1.7 ms more
than the two-process calibration's latency (estimated: the TP phases' excess over the prediction
divided by their number of collectives; docs/results.md § Predicted against measured). This
module measures that wait the way a trial meets it: ``2 × cores`` single-threaded processes in
pairs, each looping over a compute chunk followed by a small all-reduce with its pair, against
the same loop without the all-reduce. The difference per iteration, less the collective's own
latency (the two-process calibration's), is ``compute.sched_wait_s`` in the hardware file; the
simulator adds it to every collective of a trial whose ranks oversubscribe the CPU
(`canzona.hardware.Hardware.oversubscribed`).

The chunk is about a layer's work between two of a tp=2 trial's TP collectives at 4 ranks on
2 cores (2.5 ms): the wait grows with the work the pair did apart (on the 2-core VM, three
curves of 0.3 to 6 ms chunks read 1.1-1.6 ms per collective after 0.3-0.6 ms of work, 1.5-1.7
after 2.5 ms, 1.7-2.6 after 6 ms, latency included; docs/results.md), and a 0.3 ms chunk read
0.5-1.7 ms from one calibration to the next while the trials' TP collectives waited 1.0-1.6.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from canzona.calibrate.workers import spawn_for_result

MAX_PROCESSES = 8  # larger machines are not oversubscribed by the local sweeps; not measured there
CHUNK_MATMULS = 64  # 96x96 fp32 matmuls between two collectives (the module's docstring)


def _loop(chunk: Any, reps: int, pair: Any | None, buf: Any) -> float:
    """Mean seconds of one iteration: the compute chunk, then (with ``pair``) a blocking all-reduce."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    for _ in range(reps):
        chunk()
        if pair is not None:
            dist.all_reduce(buf, group=pair)
    return (time.perf_counter() - t0) / reps


def paired_rounds(chunk: Any, reps: int, rounds: int, pair: Any, buf: Any) -> list[float]:
    """[seconds per iteration alone, with the all-reduce]: each the median of ``rounds`` loops of
    ``reps``, the two interleaved (after a barrier of every process) so that a drift of the
    machine hits both alike."""
    import torch.distributed as dist

    alone, both = [], []
    for _ in range(rounds):
        dist.barrier()
        alone.append(_loop(chunk, reps, None, buf))
        dist.barrier()
        both.append(_loop(chunk, reps, pair, buf))
    return [statistics.median(alone), statistics.median(both)]


def _worker(rank: int, world: int, port: int, reps: int, rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pairs = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world // 2)]
        pair = pairs[rank // 2]
        a = torch.randn(96, 96) / 96**0.5
        buf = torch.zeros(64)

        def chunk() -> None:  # about 2.5 ms of work per rank under contention: a layer between two TP collectives
            for _ in range(CHUNK_MATMULS):
                a @ a

        _loop(chunk, 5, pair, buf)  # warm-up: gloo pairs, allocator
        t = torch.tensor(paired_rounds(chunk, reps, rounds, pair, buf))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        if rank == 0:
            Path(out).write_text(json.dumps({"compute_s": float(t[0]) / world, "with_all_reduce_s": float(t[1]) / world}))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def measure_sched_wait(cores: int, latency_s: float, quick: bool = False) -> dict[str, Any] | None:
    """Run ``2 × cores`` processes in pairs as the module's docstring describes and return
    ``{"processes", "cores", "compute_s", "with_all_reduce_s", "latency_s", "sched_wait_s"}``, or
    None when ``2 × cores`` exceeds `MAX_PROCESSES`. ``latency_s``: the two-process
    calibration's all-reduce latency, taken out of the difference."""
    world = 2 * cores
    if cores < 1 or world > MAX_PROCESSES:
        return None
    reps, rounds = (10, 5) if quick else (20, 7)
    res = spawn_for_result(_worker, world, reps, rounds)
    wait = max(0.0, res["with_all_reduce_s"] - res["compute_s"] - latency_s)
    return {"processes": world, "cores": cores, **res, "latency_s": latency_s, "sched_wait_s": wait}
