"""A trial's aggregates (``summary.json``): step-time quantiles, the plan, the world, provenance."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from canzona import dist_rules
from canzona.config import TrialConfig
from canzona.plan.summary import plan_record

# Step-time keys summarised as median / p10 / p90 over measured steps of the max over ranks.
SUMMARISED = ("iteration_ms", "optimizer_step_ms", "param_sync_ms", "grad_reduce_ms")


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90); one value is all three."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), q[0], q[-1]


def matrix_names(plan: Any) -> list[str]:
    """The params the matrix rule updates: the dense plan's, then every EP rank's experts'."""
    plans = [plan, *(plan.experts.plans if plan.experts is not None else ())]
    return [p.params[i].name for p in plans for i in range(len(p.params)) if p.uses_matrix_rule(i)]


def summarise(cfg: TrialConfig, plan: Any, metrics: Any, rows: list[dict[str, Any]], peak_mb: list[float],
              ctx: Any, owned: Any, local_world: int | None = None) -> dict[str, Any]:
    """The summary of a trial from every rank's rows (``ctx``: rank 0's `ParallelContext`;
    ``owned``: per parameter name, how many ranks computed its full update; ``local_world``:
    the ranks on rank 0's host -- all of them, for `cpu_use`'s share of the cores)."""
    import torch

    measured = [r for r in rows if r["measured"]]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in measured:
        by_step.setdefault(r["step"], []).append(r)
    out: dict[str, Any] = {}
    for key in SUMMARISED:
        per_step = [max(r[key] for r in rs) for rs in by_step.values()]  # max over ranks
        med, p10, p90 = quantiles(per_step)
        out.update({f"{key}_median": med, f"{key}_p10": p10, f"{key}_p90": p90})
    out.update(cpu_use(by_step, ctx.world, all_local=local_world == ctx.world))
    matrix_owned = [int(owned.get(name, 0)) for name in matrix_names(plan)]
    out.update(
        {
            "peak_memory_mb": peak_mb,
            "world": {"world_size": ctx.world, "dp": ctx.dp, "tp": ctx.tp, "backend": ctx.backend,
                      "device": str(ctx.device.type), "nccl_rules": dist_rules.installed(),
                      **({"ep": ctx.ep, "etp": ctx.etp} if plan.experts is not None else {})},
            "plan": plan_record(plan, metrics),
            "matrix_owner_counts": {"min": min(matrix_owned, default=0), "max": max(matrix_owned, default=0)},
            "final_loss": measured[-1]["loss"] if measured else None,
            "versions": versions(),
            "host": platform.node(),
            "device_name": device_name(ctx.device),
            "config": cfg.to_dict(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch_threads": torch.get_num_threads(),
        }
    )
    return out


def cpu_use(by_step: dict[int, list[dict[str, Any]]], world: int, all_local: bool = True) -> dict[str, Any]:
    """How the optimizer step used this machine's cores, where the ranks recorded CPU times (a
    local CPU trial): per rank, the main thread's and the other threads' (gloo's) CPU ms
    (``step_thread_cpu_ms_mean``, ``step_other_threads_cpu_ms_mean``: mean over ranks, median
    over steps) and ``step_cores_busy``: every rank's CPU ÷ (this machine's cores × the step,
    max over ranks), median over steps -- about 1 where the ranks oversubscribe the cores and
    the step is bound by their CPU, not by waiting; only when every rank ran on this host
    (``all_local``). Nothing when a row lacks the times."""
    if not by_step or world < 1:
        return {}
    rows = [r for rs in by_step.values() for r in rs]
    if any(r.get("step_thread_cpu_ms") is None or r.get("step_other_threads_cpu_ms") is None for r in rows):
        return {}
    cores = os.cpu_count() or 1  # as the calibration counts them (device.cores) and threads_per_rank shares them
    main, other, busy = [], [], []
    for rs in by_step.values():
        main.append(statistics.fmean(r["step_thread_cpu_ms"] for r in rs))
        other.append(statistics.fmean(r["step_other_threads_cpu_ms"] for r in rs))
        span = max(r["optimizer_step_ms"] for r in rs)
        if all_local and len(rs) == world and span > 0:
            busy.append(sum(r["step_thread_cpu_ms"] + r["step_other_threads_cpu_ms"] for r in rs) / (cores * span))
    out = {"step_thread_cpu_ms_mean": statistics.median(main), "step_other_threads_cpu_ms_mean": statistics.median(other)}
    if busy:
        out.update(step_cores_busy=statistics.median(busy), cores=cores)
    return out


def program_check(programs: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Did every rank's executor hand torch.distributed exactly the bytes its program lists, in
    every step? (``comm_bytes`` of steps.jsonl against `canzona.program.check.expected_bytes`.)"""
    from canzona.program.check import compare_recorded

    problems = [f"step {r['step']}: {p}" for r in rows for p in compare_recorded(programs[r["rank"]], r["comm_bytes"])]
    return {"rows_checked": len(rows), "mismatches": problems[:20], "ok": not problems}


def peak_memory_mb(device: Any) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, max RSS on a CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def versions() -> dict[str, str]:
    """torch, megatron-core, Python and the git revision of this checkout."""
    import torch

    try:
        from importlib.metadata import version

        megatron = version("megatron-core")
    except Exception:  # pragma: no cover - metadata missing
        megatron = "unknown"
    try:
        git = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        git = "unknown"
    return {"torch": torch.__version__, "megatron_core": megatron, "python": platform.python_version(), "git": git}
