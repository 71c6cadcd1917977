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

Since calibration format 11 the loop runs at several chunks, as `canzona.calibrate.peer_wait`
does without oversubscription (the same pairs, chunks and rounds, ``2 × cores`` processes):
``sched_wait_s`` is still the wait after the layer-sized chunk, and ``compute.sched_wait_curve``
keeps the wait after each chunk. The optimizer step's blocking TP collectives come after a
matrix's update, several milliseconds of work apart: on a 2-core Xeon VM four curves read
0.1-0.2 ms beyond the latency after 0.5 ms of work, 0.0-1.1 after 2.2 ms, 1.1-1.8 after 4-6 ms
and 1.0-2.9 after 13-17 ms, where the 2-process drift curve the simulator added on top of the
layer-sized wait read 0.2-0.4 ms after 3 ms. An oversubscribed trial's collectives wait by this
curve (`canzona.hardware.Hardware.oversubscribed`).
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


CHUNKS = (16, CHUNK_MATMULS, 160, 480)  # about 0.5, 2, 5 and 15 ms of contended work per rank
LOOP_WORK = 1280  # matmuls per timed loop (reps = LOOP_WORK / chunk)
MIN_REPS = 10  # collectives per loop at the longest chunk


def pairs_worker(rank: int, world: int, port: int, chunks: tuple[int, ...], rounds: int, out: str) -> None:
    """``world`` single-threaded processes in pairs, each timing `paired_rounds` at every chunk
    of ``chunks`` (96x96 fp32 matmuls); rank 0 writes the mean over processes, a
    [compute_s, with_all_reduce_s] row per chunk. (`canzona.calibrate.peer_wait` runs it too.)"""
    import torch
    import torch.distributed as dist

    from canzona.host_memory import retain_freed_memory

    torch.set_num_threads(1)
    retain_freed_memory()  # as a trial's CPU rank runs
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pair = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world // 2)][rank // 2]
        a = torch.randn(96, 96) / 96**0.5
        buf = torch.zeros(64)
        rows = []
        for n in chunks:
            def chunk(n: int = n) -> None:
                for _ in range(n):
                    a @ a

            _loop(chunk, 2, pair, buf)  # warm-up: gloo's pair, the allocator
            rows.append(paired_rounds(chunk, max(MIN_REPS, LOOP_WORK // n), rounds, pair, buf))
        t = torch.tensor(rows, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        if rank == 0:
            Path(out).write_text(json.dumps((t / world).tolist()))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def wait_curve(rows: list[list[float]], latency_s: float) -> list[list[float]]:
    """[[work_s, wait_s], ...] from `pairs_worker`'s rows: each chunk's excess over its compute
    less the collective's own latency, held non-decreasing in the work (the wait cannot shrink
    with more work apart: a dip is noise, held level) and non-negative."""
    points, most = [], 0.0
    for work, both in rows:
        most = max(most, both - work - latency_s, 0.0)
        points.append([work, most])
    return points


def samples(rows: list[list[float]]) -> list[dict[str, float]]:
    """`pairs_worker`'s rows as the hardware file records them, one per chunk of `CHUNKS`."""
    return [{"matmuls": n, "compute_s": w, "with_all_reduce_s": b} for n, (w, b) in zip(CHUNKS, rows)]


def measure_sched_wait(cores: int, latency_s: float, quick: bool = False) -> dict[str, Any] | None:
    """Run ``2 × cores`` processes in pairs as the module's docstring describes and return
    ``{"processes", "cores", "compute_s", "with_all_reduce_s", "latency_s", "sched_wait_s", "curve",
    "samples"}`` (the first four and the wait at the layer-sized chunk; ``curve``: `wait_curve`), or
    None when ``2 × cores`` exceeds `MAX_PROCESSES`. ``latency_s``: the two-process
    calibration's all-reduce latency, taken out of the difference."""
    world = 2 * cores
    if cores < 1 or world > MAX_PROCESSES:
        return None
    rows = spawn_for_result(pairs_worker, world, CHUNKS, 5 if quick else 7)
    compute_s, with_s = rows[CHUNKS.index(CHUNK_MATMULS)]
    return {"processes": world, "cores": cores, "compute_s": compute_s, "with_all_reduce_s": with_s,
            "latency_s": latency_s, "sched_wait_s": max(0.0, with_s - compute_s - latency_s),
            "curve": wait_curve(rows, latency_s),
            "samples": samples(rows)}
