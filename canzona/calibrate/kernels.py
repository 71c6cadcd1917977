"""Timing the work the planner's measured costs stand for, as the executor runs it.

- A matrix optimizer's update of one kernel shape (`canzona.optim.spec.OptimizerDef.kernels`:
  the matrix, or one block of a blocked preconditioner): one call of the rule on one matrix,
  as `canzona.optim.owner.MatrixUpdates` calls it -- the rule runs matrix by matrix, so one
  matrix's time, Python and dispatch overhead included, is what each matrix adds to a step
  (small matrices are not free). Steps without and with a preconditioner refresh are timed
  apart, so any refresh interval can be amortised afterwards.
- Elementwise AdamW through `canzona.optim.owner.ElementwiseUpdates` (the fused,
  slice-invariant step the executor runs on whole tensors and ZeRO-1 shard ranges), per element
  (one large tensor) and per tensor (many small ones, some with unaligned tails).

Shapes are timed in rounds (every shape once per round, the median over rounds kept), so a
burst of load from elsewhere on a shared machine hits all shapes alike instead of one. A shape
whose one update would take longer than `cap_s` is not timed: a copy scaled down by a whole
factor k on both sides (same aspect ratio) is, and the time is scaled up by the flops ratio
(large updates are compute-bound, so that ratio is the time ratio). The entry names its probe.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from canzona.calibrate.clock import Clock
from canzona.optim import registry
from canzona.optim.rule import Settings, Shape

# The longest single update timed directly, per device kind (seconds).
CAP_S = {"cpu": 0.05, "cuda": 0.05}
ROUNDS = 7  # timing rounds over all shapes; the median is kept
ROUND_BUDGET_S = 1.0  # rounds stop early once this much time went into them (at least 3 run)
# Before anything is timed, an eigendecomposition / QR is assumed to run at this fraction of the
# fp32 matmul rate (measured: about 1x on one CPU core; far lower on GPUs) when choosing probes.
REFRESH_RATE_GUESS = 0.3


@dataclass(frozen=True)
class Job:
    """One kernel shape of one optimizer setting to time."""

    key: str  # the setting's key in the cache (`canzona.calibrate.cache.settings_key`)
    optimizer: str
    settings: Settings
    shape: Shape


def matmul_rates(clock: Clock) -> dict[str, float]:
    """fp32 and bf16 matmul flops per second (to predict which shapes need a probe, and the
    rates a roofline on this device uses)."""
    import torch

    n = 2048 if clock.cuda else 384
    out = {}
    for dtype in ("float32", "bfloat16"):
        a = torch.randn(n, n, device=clock.device, dtype=getattr(torch, dtype))
        product = partial(torch.matmul, a, a.T.contiguous())
        clock.time(product)
        out[dtype] = 2 * n**3 / clock.median(product, 5, 0.5)
    return out


def time_elementwise(clock: Clock, settings: Settings) -> dict[str, float]:
    """AdamW seconds per element (a tensor larger than the caches) and per tensor (64 small
    tensors, half of them with a tail the fused step packs into its scratch tensor)."""
    import torch

    from canzona.optim.owner import ElementwiseUpdates

    dev = clock.device
    updates = ElementwiseUpdates(settings)
    big = (1 << 24) if clock.cuda else (1 << 21)
    p, g = torch.randn(big, device=dev), torch.randn(big, device=dev)
    small = [64 * (1 + k % 3) + (k % 2) * 37 for k in range(64)]
    ps = [torch.randn(n, device=dev) for n in small]
    gs = [torch.randn(n, device=dev) for n in small]
    step = [0]

    def run(keys: list[Any], params: list, grads: list) -> Callable[[], None]:
        def go() -> None:
            step[0] += 1
            updates.step(keys, params, grads, step[0])
        return go

    large_call = run(["big"], [p], [g])
    small_call = run(list(range(len(small))), ps, gs)
    large_call()
    small_call()
    t_large = _rounds(clock, [large_call], 0.5)[0]
    t_small = _rounds(clock, [small_call], 0.3)[0]
    per_element = t_large / big
    return {"seconds_per_element": per_element,
            "tensor_overhead_s": max(0.0, (t_small - sum(small) * per_element) / len(small))}


def probe_shape(flops: Callable[[Shape], float], shape: Shape, seconds_per_flop: float, cap_s: float) -> Shape:
    """``shape``, or the smallest whole down-scaling of it whose ``flops`` are predicted to run
    within ``cap_s``."""
    m, n = shape
    k = 1
    while flops((math.ceil(m / k), math.ceil(n / k))) * seconds_per_flop > cap_s and min(m, n) // (k + 1) >= 1:
        k += 1
    return (math.ceil(m / k), math.ceil(n / k))


def time_kernel_updates(clock: Clock, jobs: list[Job], rates: dict[str, float],
                        cap_s: float) -> dict[str, dict[str, dict]]:
    """``{settings key: {"MxN": entry}}`` with entry ``{step_s, refresh_s?, probe?,
    refresh_probe?}``: seconds of one update on a step without a refresh, the extra seconds of
    a refresh step (optimizers with refreshes), and the shapes actually timed when they were
    scaled down. The calibration cache's table (what ``planner.cost=measured`` plans with);
    a hardware file's tables are timed by `canzona.calibrate.compute.time_update_tables`."""
    steady: list[tuple[Job, Shape, Callable[[], Any]]] = []
    refresh: list[tuple[Job, Shape, Callable[[], Any], Callable[[], Any]]] = []
    for job in jobs:
        d = registry.get(job.optimizer)
        per_flop = 1.0 / rates.get(d.matmul_dtype(job.settings), rates["float32"])
        probe = probe_shape(_flops_of(job, refresh=False), job.shape, per_flop, cap_s)
        steady.append((job, probe, _update_call(clock, job, probe, 2)))
        every = d.refresh_every(job.settings) if d.refresh_every is not None else None
        if every:
            rprobe = probe_shape(_flops_of(job, refresh=True), job.shape,
                                 1.0 / (REFRESH_RATE_GUESS * rates["float32"]), cap_s)
            refresh.append((job, rprobe, _update_call(clock, job, rprobe, 2), _update_call(clock, job, rprobe, 1 + every)))
    steady_s = _rounds(clock, [call for _, _, call in steady], ROUND_BUDGET_S)
    pairs = _rounds(clock, [c for _, _, a, b in refresh for c in (a, b)], ROUND_BUDGET_S, rounds=3)
    out: dict[str, dict[str, dict]] = {}
    for (job, probe, _), t in zip(steady, steady_s):
        entry: dict[str, Any] = {"step_s": t * _ratio(_flops_of(job, refresh=False), job.shape, probe)}
        if probe != tuple(job.shape):
            entry["probe"] = f"{probe[0]}x{probe[1]}"
        out.setdefault(job.key, {})[f"{job.shape[0]}x{job.shape[1]}"] = entry
    for k, (job, rprobe, _, _) in enumerate(refresh):
        extra = max(0.0, pairs[2 * k + 1] - pairs[2 * k])
        entry = out[job.key][f"{job.shape[0]}x{job.shape[1]}"]
        entry["refresh_s"] = extra * _ratio(_flops_of(job, refresh=True), job.shape, rprobe)
        if rprobe != tuple(job.shape):
            entry["refresh_probe"] = f"{rprobe[0]}x{rprobe[1]}"
    return out


def _flops_of(job: Job, refresh: bool) -> Callable[[Shape], float]:
    d = registry.get(job.optimizer)
    flops = d.refresh_flops if refresh else d.steady_flops
    return lambda shape: flops(shape, job.settings)


def _ratio(flops: Callable[[Shape], float], shape: Shape, probe: Shape) -> float:
    return 1.0 if tuple(shape) == tuple(probe) else flops(shape) / max(flops(probe), 1.0)


def _update_call(clock: Clock, job: Job, shape: Shape, step: int) -> Callable[[], Any]:
    """One update of one ``shape`` matrix at ``step`` (after a first step, which also seeds
    SOAP's bases), on fresh state of its own."""
    import torch

    rule = registry.get(job.optimizer).make_rule(job.settings)
    grad = torch.randn(*shape, device=clock.device)
    state = rule.init_state(shape, clock.device, torch.float32)
    rule.directions([grad], [state], 1)
    return lambda: rule.directions([grad], [state], step)


def _rounds(clock: Clock, calls: list[Callable[[], Any]], budget_s: float, rounds: int = ROUNDS) -> list[float]:
    """Median seconds of each call over up to ``rounds`` rounds (each round times every call
    once); stops after 3 rounds once ``budget_s`` is spent."""
    samples: list[list[float]] = [[] for _ in calls]
    spent = 0.0
    for r in range(rounds):
        for k, call in enumerate(calls):
            t = clock.time(call)
            samples[k].append(t)
            spent += t
        if r >= 2 and spent > budget_s:
            break
    return [statistics.median(s) for s in samples]
