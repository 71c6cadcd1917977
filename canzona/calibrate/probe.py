"""A CPU's speed right now: one thread's fp32 matmul rate over about 50 ms.

On a shared machine (a VM with neighbours, a laptop changing clock) the cores run faster or
slower from one minute to the next -- by ±15 % within seconds and 35 % between a calibration and
a sweep minutes later on the machine this was written on (docs/results.md § Predicted against
measured). A prediction made from a calibration then misses by that drift whatever the
simulator gets right. The calibration records this probe (``calibration.speed_probe_flops_per_s``)
and every CPU trial records it right after its measured steps (``summary.json``'s
``speed_probe_flops_per_s``, rank 0, while the other ranks wait), so that
`canzona.sim.validate` can say how much of an error is the machine's drift: its
*speed-adjusted* prediction is the prediction × calibration probe ÷ trial probe.

That probe runs on one core while the others idle, and a VM's cores can slow down together
when all of them are busy without one of them alone noticing: two calibrations of the 2-core
VM ten minutes apart read every rate about 30 % apart where the one-thread probe read 67 and 64
GFLOP/s (docs/results.md). `throughput_probe` is the probe of a loaded machine: every process
(a calibration's workers, a trial's ranks) runs it at once after a barrier, for a fixed wall
window, and `per_core` turns their rates into what one core delivered with all of them busy
(``calibration.speed_probe_all_cores_flops_per_s``, and a trial's ``summary.json`` key of the
same name). Validation prefers that pair where both files have it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

N = 256  # 33.5 Mflop a product: long enough to time, short enough to stay in cache
BATCH = 8
BATCHES = 7


def speed_probe() -> float:
    """Flops per second of an N×N fp32 matmul on this thread (median of ``BATCHES`` batches)."""
    import torch

    from canzona.devices import torch_threads

    with torch_threads(1):
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)
        a @ b
        times = []
        for _ in range(BATCHES):
            t0 = time.perf_counter()
            for _ in range(BATCH):
                a @ b
            times.append((time.perf_counter() - t0) / BATCH)
    return 2.0 * N**3 / statistics.median(times)


WINDOW_S = 0.1  # the loaded probe's wall window: a few scheduler slices on an oversubscribed CPU


def throughput_probe(window_s: float = WINDOW_S) -> float:
    """Flops per second of wall time this process gets through N×N fp32 matmuls over
    ``window_s``, the time it spends descheduled included (one thread). Run in every process
    at once (after a barrier); `per_core` of their rates is a core's speed under that load."""
    import torch

    from canzona.devices import torch_threads

    with torch_threads(1):
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)
        a @ b
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < window_s:
            a @ b
            done += 1
    return 2.0 * N**3 * done / elapsed


def per_core(rates: Sequence[float], cores: int) -> float:
    """What one core delivered while ``rates``' processes ran `throughput_probe` together on a
    machine of ``cores`` cores: their sum over the cores they could occupy (more processes than
    cores share them; fewer leave the rest idle)."""
    if not rates or cores < 1:
        raise ValueError(f"per_core needs at least one rate and one core, got {len(rates)} rate(s) and {cores} core(s)")
    return sum(rates) / min(len(rates), cores)
