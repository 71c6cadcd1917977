"""How long a collective waits for its peers, by the work each did since they last met.

Two ranks that leave a collective together and then compute the same amount do not arrive at
the next one together on a shared machine: interrupts, other tenants and the scheduler slow one
or the other, and the collective starts when the slower arrives. The longer they worked apart,
the further they drift. Measured on this project's 2-core VM (2 processes, one per core, a
64-float all-reduce after every compute chunk): 0.5 ms beyond the back-to-back latency after
0.2 ms of work, 0.9 ms after 1.8 ms, 1.5 ms after 5 ms. A simulator whose ranks do identical
work in lockstep never sees it; on the README's first sweep it is what the DP gradient
reduction (issued after a whole backward) and the parameter sync (after the whole step) wait
beyond their transfer (docs/results.md).

This module measures the curve the way `canzona.calibrate.contended` measures the scheduling
wait, on as many processes as cores (no oversubscription: that wait is measured there and added
apart): pairs of single-threaded processes loop over a compute chunk followed by an all-reduce
with their pair, against the same loop without it, for chunks from a fraction of a millisecond
to several, interleaved rounds. The difference per iteration less the collective's own latency
(the two-process calibration's) is the wait; the hardware file keeps ``[[work_s, wait_s], ...]``
as ``compute.peer_wait`` and the simulator adds `canzona.hardware.Hardware.peer_wait_after` of each member's work since its
previous collective to every collective (`canzona.sim.timeline`).
"""

from __future__ import annotations

from typing import Any

from canzona.calibrate.contended import CHUNKS, pairs_worker, samples, wait_curve
from canzona.calibrate.workers import spawn_for_result

# Compute chunks: `canzona.calibrate.contended.CHUNKS` (96x96 fp32 matmuls; about 0.2, 0.7, 1.8 and
# 5 ms on a 2-core VM without oversubscription), the spans between a trial's collectives (a TP
# pipeline's micro-group, a layer, a backward's bucket)
MAX_PROCESSES = 8


def measure_peer_wait(cores: int, latency_s: float, quick: bool = False) -> dict[str, Any] | None:
    """Run ``cores`` processes (an even number, at least 2) in pairs as the module's docstring
    describes; returns ``{"processes", "points": [[work_s, wait_s], ...], "samples"}`` (the
    waits held non-decreasing in the work; ``samples``: the raw timings) or None
    on a machine with fewer than 2 or more than `MAX_PROCESSES` cores. ``latency_s``: the
    two-process calibration's all-reduce latency, taken out of each difference."""
    if not 2 <= cores <= MAX_PROCESSES:
        return None
    world = cores - cores % 2
    rows = spawn_for_result(pairs_worker, world, CHUNKS, 3 if quick else 7)
    return {"processes": world, "points": wait_curve(rows, latency_s), "latency_s": latency_s,
            "samples": samples(rows)}
