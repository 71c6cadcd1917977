"""How much of a backward's gradient-bucket reductions overlapping them with it hides, measured
as a trial runs them: the executor's `Runtime` on the calibration's reference model, a
data-parallel (``sync``) plan over the calibration's processes, iterations with the bucket
reductions issued from the backward's hooks (``dist.overlap_grad_reduce=true``) alternated with
iterations that issue them after it (``false``).

Why not the general overlap (`canzona.calibrate.comm.time_overlap`: one large all-reduce issued
before a backward): on this project's 2-core VM it read 0.03 to 0.71 between calibrations minutes
apart, while a trial's bucketed reductions hid nothing (backward + reductions as long with the
overlap as without it; docs/results.md). Each small bucket's all-reduce needs the rank's core for
every ring step, which the backward holds; one large one mostly waits on the peer's copies.

Result (the slowest process's medians, milliseconds): ``backward_ms`` and ``reduce_ms`` apart
(overlap off), ``overlapped_ms`` (backward + reduction wait, overlap on) and ``overlap`` = the
share of the shorter of the two that overlapping hid, in [0, 1] (``raw``: before clipping; below
0 when the overlapped iteration took longer than both apart).
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from canzona.calibrate.clock import Clock
from canzona.calibrate.model_pass import CPU_POINTS, GPU_POINTS

# the local sweep profile's bucket.size on a CPU (several buckets even for the reference model's
# small shapes); on a GPU Megatron's default
CPU_BUCKET_ELEMS = 100_000


def reference_config(world: int, clock: Clock, threads: int, overlap: bool):
    """The trial configuration the measurement runs: the reference model (the point
    `canzona.calibrate.model_pass.backward_work` times), DP over ``world`` processes, AdamW (a
    cheap step: only the backward and its reductions are timed)."""
    from canzona.config import load_config

    name, div, layers, mb, seq = (GPU_POINTS if clock.cuda else CPU_POINTS)[2]
    return load_config([
        f"model.name={name}", f"model.width_div={div}", f"model.num_layers={layers}",
        f"parallel.dp={world}", "parallel.tp=1", "method=sync", "optimizer=adamw",
        "planner.cost=numel",  # sync computes every update everywhere: no cost to measure
        f"dist.device={clock.device.type}", f"dist.threads_per_rank={threads}",
        f"train.micro_batch={mb}", f"train.seq_len={seq}",
        f"dist.overlap_grad_reduce={str(overlap).lower()}",
        *([] if clock.cuda else [f"bucket.size={CPU_BUCKET_ELEMS}"]),
    ])


def time_grad_reduce_overlap(rank: int, world: int, clock: Clock, ctx: Any, threads: int,
                             quick: bool) -> dict[str, Any]:
    """Overlapped and apart, alternated round by round (`module docstring`)."""
    import torch
    import torch.distributed as dist

    from canzona.executor.runtime import Runtime, model_dtype
    from canzona.executor.timing import StepTimer
    from canzona.model.data import synthetic_batch
    from canzona.model.qwen3 import build_model
    from canzona.plan.from_config import make_plan
    from canzona.program.lower import lower

    runtimes = {}
    for overlap in (True, False):
        cfg = reference_config(world, clock, threads, overlap)
        plan = make_plan(cfg, device=clock.device.type)
        mcfg = cfg.model_cfg()
        model = build_model(mcfg, device=ctx.device, seed=cfg.train.seed, dtype=model_dtype(plan))
        runtimes[overlap] = (Runtime(model, plan, lower(plan)[rank], cfg.optimizer, ctx), mcfg, cfg.train)
    timer = StepTimer(ctx.device)

    def iteration(overlap: bool, step: int) -> tuple[float, float]:
        rt, mcfg, train = runtimes[overlap]
        tokens, labels = synthetic_batch(mcfg, train.micro_batch, train.seq_len, 0, step, rank, world)
        dist.barrier()
        timer.reset()
        rt.iteration([(tokens.to(ctx.device), labels.to(ctx.device))], timer)
        timer.finish()
        return timer.ms.get("backward", 0.0), timer.ms.get("grad_reduce", 0.0)

    rounds, per_round = (3, 4) if quick else (5, 6)
    samples: dict[str, list[float]] = {"overlapped_ms": [], "backward_ms": [], "reduce_ms": []}
    steps = itertools.count(1)
    for _ in range(rounds):
        for overlap in (True, False):
            iteration(overlap, next(steps))  # untimed: re-warms that runtime
            runs = [iteration(overlap, next(steps)) for _ in range(per_round)]
            if overlap:
                samples["overlapped_ms"].append(statistics.median(b + r for b, r in runs))
            else:
                samples["backward_ms"].append(statistics.median(b for b, _ in runs))
                samples["reduce_ms"].append(statistics.median(r for _, r in runs))
    res: dict[str, Any] = {}
    for name, values in samples.items():
        t = torch.tensor([statistics.median(values)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        res[name] = float(t)
    apart = res["backward_ms"] + res["reduce_ms"]
    raw = (apart - res["overlapped_ms"]) / max(1e-9, min(res["backward_ms"], res["reduce_ms"]))
    res.update(raw=raw, overlap=min(1.0, max(0.0, raw)), rounds=rounds, iterations_per_round=per_round,
               buckets=len(runtimes[True][0].buffers.layout.buckets))
    return res
