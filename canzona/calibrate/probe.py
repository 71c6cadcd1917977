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
"""

from __future__ import annotations

import statistics
import time

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
