"""Timing the collectives the executors use, and how much async communication hides behind
compute, between the calibration's processes (gloo on CPU, NCCL between two GPUs)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from canzona.calibrate.clock import Clock
from canzona.hardware import COLLECTIVES


def single_tensor_collectives() -> tuple[Any, Any]:
    """(reduce_scatter, all_gather) on one flat tensor each: ``reduce_scatter_single`` /
    ``all_gather_single`` where torch has them (2.13 on), else ``reduce_scatter_tensor`` /
    ``all_gather_into_tensor`` (same arguments)."""
    import torch.distributed as dist

    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor,
            getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)


def collective_ops(n: int, world: int, device: Any) -> dict[str, tuple[Any, float]]:
    """kind -> (call, N bytes as `canzona.hardware.volume` expects) for an n-element buffer."""
    import torch
    import torch.distributed as dist

    reduce_scatter, all_gather = single_tensor_collectives()
    x = torch.randn(n, device=device)
    shard, full = torch.empty(n // world, device=device), torch.empty(n, device=device)
    return {
        "all_reduce": (partial(dist.all_reduce, x), n * 4),
        "reduce_scatter": (partial(reduce_scatter, shard, x), n * 4),
        "all_gather": (partial(all_gather, full, shard), n * 4),
        "all_to_all": (partial(dist.all_to_all_single, full, x), n * 4 * (world - 1) / world),
        "broadcast": (partial(dist.broadcast, x, src=0), n * 4),
        "reduce": (partial(dist.reduce, x, dst=0), n * 4),
    }


def sizes(quick: bool, gpu: bool) -> list[int]:
    """Buffer sizes (elements): small ones fix the latency, large ones the bandwidth; NVLink
    needs far larger buffers than gloo before bandwidth dominates."""
    if gpu:
        return [256, 1 << 16, 1 << 20, 1 << 24] if quick else [256, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26]
    return [256, 1 << 16, 1 << 20] if quick else [256, 1 << 14, 1 << 17, 1 << 20, 1 << 22]


ONE_ELEMENT = "all_reduce_one_element"  # the samples' key of the one-element all-reduce
CALL_CPU = "call_cpu"  # the samples' key of the CPU a call costs its process (`time_call_cpu`)
SMALL = 1 << 17  # elements: buffers whose time is mostly latency (`time_collectives`)
SMALL_REPS_FACTOR = 4


def time_collectives(world: int, quick: bool, clock: Clock) -> dict[str, list[list[float]]]:
    """kind -> [[N bytes, seconds], ...]: the mean over repeats (each after a barrier) on the
    slowest rank, after a warm-up round of every kind (gloo sets pairs up lazily, NCCL its
    channels). The mean, not the median: a step issues many collectives, so their expected time
    is what adds up, and small messages on a shared machine have a long tail. Also, under
    `ONE_ELEMENT`, an all-reduce of one fp32 element (the step barrier's and the gradient norm's):
    gloo sends it far faster than the smallest buffer above (2-process VM: 0.26 ms against 1.0 ms
    for 256 elements, the larger message's mean held up by waits of a scheduler tick), so the
    link's line would overprice it. Buffers up to `SMALL` elements take `SMALL_REPS_FACTOR` times
    the repeats: their mean is a few long waits among many short calls (2-process VM: 0.6 ms
    calls, 4-10 ms waits), which 12 repeats sampled so unevenly that two calibrations an hour
    apart fitted an all-reduce intercept of 0.64 and 1.32 ms."""
    import torch
    import torch.distributed as dist

    reps = 8 if quick else 12
    for fn, _ in collective_ops(1 << 12, world, clock.device).values():
        for _ in range(3):
            fn()
    samples: dict[str, list[list[float]]] = {k: [] for k in COLLECTIVES}
    for n in sizes(quick, clock.cuda):
        n -= n % world
        for kind, (fn, nbytes) in collective_ops(n, world, clock.device).items():
            fn()
            samples[kind].append([float(nbytes), _slowest_mean(fn, reps * (SMALL_REPS_FACTOR if n <= SMALL else 1), clock)])
    one = torch.ones(1, device=clock.device)
    samples[ONE_ELEMENT] = [[4.0, _slowest_mean(partial(dist.all_reduce, one), SMALL_REPS_FACTOR * reps, clock)]]
    return samples


def _slowest_mean(fn: Callable[[], Any], reps: int, clock: Clock) -> float:
    """Seconds of ``fn``: the mean over ``reps`` calls, each after a barrier, on the slowest rank."""
    import torch
    import torch.distributed as dist

    times = []
    for _ in range(reps):
        dist.barrier()
        times.append(clock.time(fn))
    t = torch.tensor([statistics.fmean(times)], device=clock.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def idle_threads_cpu(seconds: float) -> float:
    """CPU seconds per second this process's threads other than the caller's use while it sleeps
    ``seconds``, the mean over ranks: gloo's transport loops, one per process group the rank is
    in, waking with nothing to do (on the project's 2-core VM about 27 ms a second with
    Megatron's groups, at two ranks as at four). A trial whose ranks oversubscribe the cores
    loses that share of them (`canzona.sim.simulate.oversubscription`). CPU only."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    before, t0 = other_threads_cpu(), time.perf_counter()
    time.sleep(seconds)
    rate = torch.tensor([(other_threads_cpu() - before) / (time.perf_counter() - t0)])
    dist.all_reduce(rate)
    return float(rate) / dist.get_world_size()


def other_threads_cpu() -> float:
    """CPU seconds this process's threads other than the calling one have used so far."""
    return time.process_time() - time.thread_time()


WORK_APART_MATMULS = 64  # 96x96 fp32 matmuls before each call `time_call_cpu` times (about 2 ms on 2 cores)


def time_call_cpu(world: int, quick: bool) -> dict[str, list[list[float]]]:
    """kind -> [[N bytes, CPU seconds], ...] (and `ONE_ELEMENT`): the CPU one call costs its
    process, all threads together -- the caller's dispatch and wake-up, gloo's worker and
    transport threads -- the mean over calls and ranks, each call after a barrier and a few
    milliseconds of compute, as a trial's optimizer step issues its collectives between
    matrices' updates. Back to back the threads are still awake: on the project's 2-core VM a
    pair's all-gather read about 0.25 ms less CPU there than after work (docs/results.md). A
    trial whose ranks oversubscribe the cores pays this CPU in wall time
    (`canzona.hardware.Hardware.call_cpu`). CPU only (gloo)."""
    import torch
    import torch.distributed as dist

    reps = 6 if quick else 12
    a = torch.randn(96, 96) / 96**0.5

    def per_call(fn: Callable[[], Any]) -> float:
        spent = 0.0
        for _ in range(reps):
            dist.barrier()
            for _ in range(WORK_APART_MATMULS):
                a @ a
            before = time.process_time()
            fn()
            spent += time.process_time() - before
        cpu = torch.tensor([spent / reps])
        dist.all_reduce(cpu)
        return float(cpu) / world

    out: dict[str, list[list[float]]] = {k: [] for k in COLLECTIVES}
    for n in sizes(quick, False):
        n -= n % world
        for kind, (fn, nbytes) in collective_ops(n, world, "cpu").items():
            fn()
            out[kind].append([float(nbytes), per_call(fn)])
    one = torch.ones(1)
    out[ONE_ELEMENT] = [[4.0, per_call(partial(dist.all_reduce, one))]]
    return out


def time_overlap(quick: bool, clock: Clock,
                 work: tuple[Callable[[], Any], Callable[[], Any]] | None = None) -> dict[str, Any]:
    """Compute alone, an all-reduce alone, and both (async comm issued first): the fraction of
    the shorter one that the overlap hides, each the median of its runs, the slowest rank's.

    ``work`` = (prepare, compute): what to overlap, ``prepare`` untimed before each run -- a
    model's forward before its backward (`canzona.calibrate.model_pass.backward_work`), what a
    trial's gradient reductions run beside; without it, fp32 matmuls. On this project's 2-core
    VM the two differ: 0.46 beside the matmuls, 0 to 0.25 beside the backward (a 16 MB all-reduce
    in gloo, whose copies need the cores the backward keeps busy), as trials measured (an
    overlapped gradient reduction hid nothing there, docs/results.md)."""
    import torch
    import torch.distributed as dist

    n, elems = (2048, 1 << 26) if clock.cuda else (256, (1 << 22) if work else (1 << 20))
    a = torch.randn(n, n, device=clock.device) / n**0.5
    reps = 20 if quick else 60
    buf = torch.randn(elems, device=clock.device)

    def matmuls() -> None:
        for _ in range(reps):
            a @ a

    prepare, compute = work if work is not None else ((lambda: None), matmuls)

    def comm() -> None:
        dist.all_reduce(buf)

    def both() -> None:
        w = dist.all_reduce(buf, async_op=True)
        compute()
        w.wait()

    res = {}
    for name, fn in (("compute", compute), ("comm", comm), ("both", both)):
        prepare()
        fn()
        ts = []
        for _ in range(3 if quick else 5):
            prepare()
            dist.barrier()
            ts.append(clock.time(fn))
        t = torch.tensor([statistics.median(ts)], device=clock.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        res[name] = float(t)
    hidden = res["compute"] + res["comm"] - res["both"]
    res["overlap"] = float(min(1.0, max(0.0, hidden / max(1e-12, min(res["compute"], res["comm"])))))
    res["against"] = "backward" if work is not None else "matmul"
    return res
