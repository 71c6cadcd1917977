"""One trial: ``python -m canzona.run key=value ... out=DIR``.

Started plainly it launches its own ranks (one process per rank, dp×tp of them, over gloo on
CPU or NCCL on GPUs) and waits for them; under ``torchrun`` or Slurm (``RANK``/``WORLD_SIZE``
or ``SLURM_PROCID``/``SLURM_NTASKS`` in the environment) this process is one rank of that
launch. Each rank builds the Qwen3 shard, the plan's distributed optimizer, and runs
``train.warmup`` + ``train.steps`` steps of forward, backward, gradient reduction, optimizer
step and parameter sync, timing each phase (DESIGN.md §6). Rank 0 writes the records of
`canzona.records` into ``out``.

Failure: an exception on any rank ends the trial; locally the launcher kills the other ranks at
once and exits non-zero with that rank's traceback; under an external launcher the other ranks
fail at their next collective (gloo reports the closed connection at once) or, at the latest,
at the collective timeout (``dist.timeout_s``).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from canzona.config import TrialConfig, load_config
from canzona.errors import ConfigError
from canzona.net import free_port
from canzona.records import PHASES, atomic_write_json, atomic_write_text


# ---------------------------------------------------------------------------------- launching
def launched_externally() -> bool:
    env = os.environ
    return ("RANK" in env and "WORLD_SIZE" in env) or ("SLURM_PROCID" in env and "SLURM_NTASKS" in env)


def _env_from_slurm() -> None:
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env["SLURM_NTASKS"]
        env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))




def _spawned_rank(local_rank: int, cfg_dict: dict[str, Any], out: str, port: int, world: int) -> None:
    os.environ.update(
        {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    cfg = load_config(base=cfg_dict)
    run_rank(cfg, Path(out), local_world=world)


def run_trial(cfg: TrialConfig, out: Path) -> dict[str, Any]:
    """Launch dp×tp local ranks for one trial and return its summary (raises on failure)."""
    import torch.multiprocessing as mp

    from canzona.plan.methods import make_plan

    make_plan(cfg)  # invalid layouts fail here, before any process starts
    out.mkdir(parents=True, exist_ok=True)
    world = cfg.world_size
    # forkserver: the server imports torch and megatron-core once (seconds), every rank of this
    # and later trials in the same process forks from it instead of importing them again.
    mp.set_forkserver_preload(["canzona.executor.runtime", "canzona.model.qwen3"])
    ctx = mp.start_processes(
        _spawned_rank, args=(cfg.to_dict(), str(out), free_port(), world), nprocs=world, join=False,
        start_method="forkserver",
    )
    while not ctx.join():  # raises ProcessRaisedException / ProcessExitedException, killing the rest
        pass
    return json.loads((out / "summary.json").read_text())


def run_rank_from_env(cfg: TrialConfig, out: Path) -> dict[str, Any] | None:
    """Run as one rank of an external launch (torchrun, Slurm, submitit tasks)."""
    _env_from_slurm()
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise ConfigError(f"the launch has {world} ranks but parallel.dp*parallel.tp = {cfg.world_size}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", world)).split("(")[0])
    return run_rank(cfg, out, local_world=local_world)


# ---------------------------------------------------------------------------------- one rank
def _device_and_backend(cfg: TrialConfig) -> tuple[str, str]:
    import torch

    want = cfg.dist.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("dist.device=cuda but no CUDA device is visible; use dist.device=cpu or auto")
    return want, ("nccl" if want == "cuda" else "gloo")


def run_rank(cfg: TrialConfig, out: Path, local_world: int) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    from canzona.executor.runtime import Runtime
    from canzona.executor.timing import StepTimer
    from canzona.model.data import synthetic_batch
    from canzona.model.parallel import destroy_parallel, init_parallel
    from canzona.model.qwen3 import build_model, full_state_dict
    from canzona.plan.methods import make_plan
    from canzona.program.count import count_programs
    from canzona.program.lower import lower

    cores = os.cpu_count() or 1
    torch.set_num_threads(cfg.dist.threads_per_rank or max(1, cores // max(1, local_world)))
    device_kind, backend = _device_and_backend(cfg)
    ctx = init_parallel(cfg.parallel.tp, backend, cfg.dist.timeout_s)
    try:
        plan = make_plan(cfg, device=device_kind)
        programs = lower(plan)
        metrics = count_programs(plan, programs)
        mcfg = cfg.model_cfg()
        dtype = torch.bfloat16 if plan.execution.dtype == "bfloat16" else torch.float32
        model = build_model(mcfg, device=ctx.device, seed=cfg.train.seed, dtype=dtype)
        runtime = Runtime(model, plan, programs[ctx.rank], cfg.optimizer, ctx)
        planned = float(metrics.compute[ctx.dp_rank, ctx.tp_rank])
        timer = StepTimer(ctx.device)
        rows: list[dict[str, Any]] = []
        for step in range(cfg.train.warmup + cfg.train.steps):
            tokens, labels = synthetic_batch(
                mcfg, cfg.train.micro_batch, cfg.train.seq_len, cfg.train.seed, step, ctx.dp_rank, ctx.dp
            )
            tokens, labels = tokens.to(ctx.device), labels.to(ctx.device)
            if cfg.train.fail_on_rank == ctx.rank and step == cfg.train.fail_at_step:
                raise RuntimeError(f"injected failure on rank {ctx.rank} at step {step} (train.fail_on_rank)")
            timer.reset()
            loss = runtime.iteration(tokens, labels, timer)
            iteration_ms = timer.now_ms()
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss, group=ctx.dp_group)
            row = {
                "step": step, "measured": step >= cfg.train.warmup, "rank": ctx.rank, "dp_rank": ctx.dp_rank,
                "tp_rank": ctx.tp_rank, "iteration_ms": iteration_ms,
                "optimizer_step_ms": runtime.marks["step_end"] - runtime.marks["step_start"],
                "compute_load": planned, "loss": float(global_loss) / ctx.dp,
                **{f"{p}_ms": timer.ms.get(p, 0.0) for p in PHASES},
                "comm_bytes": runtime.bytes_by_tag(),
                "events": timer.events,
            }
            rows.append(row)
        runtime.finish(timer)
        peak_mb = _peak_memory_mb(ctx.device)
        if cfg.save_params:
            full = full_state_dict(model)
            if ctx.rank == 0:
                _atomic_torch_save(full, Path(cfg.save_params))
        owned = sorted(runtime.computed)
        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, {"rows": rows, "peak_mb": peak_mb, "owned": owned})
        if ctx.rank != 0:
            return None
        all_rows = sorted((r for g in gathered for r in g["rows"]), key=lambda r: (r["step"], r["rank"]))
        counts = [0] * len(plan.params)
        for g in gathered:
            for i in g["owned"]:
                counts[i] += 1
        summary = _summarise(cfg, plan, metrics, all_rows, [g["peak_mb"] for g in gathered], ctx, counts)
        summary["program_check"] = _program_check(programs, all_rows)
        _write_records(cfg, out, all_rows, summary)
        return summary
    finally:
        destroy_parallel()


def _program_check(programs, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Did every rank's executor hand torch.distributed exactly the bytes its program lists, in
    every step? (``comm_bytes`` of steps.jsonl against `canzona.program.check.expected_bytes`.)"""
    from canzona.program.check import compare_recorded

    problems = [f"step {r['step']}: {p}" for r in rows for p in compare_recorded(programs[r["rank"]], r["comm_bytes"])]
    return {"rows_checked": len(rows), "mismatches": problems[:20], "ok": not problems}


def _peak_memory_mb(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), q[0], q[-1]


def _summarise(cfg, plan, metrics, rows, peak_mb, ctx, owned) -> dict[str, Any]:
    import torch

    from canzona.plan.summary import plan_record

    measured = [r for r in rows if r["measured"]]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in measured:
        by_step.setdefault(r["step"], []).append(r)
    out: dict[str, Any] = {}
    for key in ("iteration_ms", "optimizer_step_ms", "param_sync_ms", "grad_reduce_ms"):
        per_step = [max(r[key] for r in rs) for rs in by_step.values()]  # max over ranks
        med, p10, p90 = _quantiles(per_step)
        out.update({f"{key}_median": med, f"{key}_p10": p10, f"{key}_p90": p90})
    matrix_owned = [int(owned[i]) for i in range(len(plan.params)) if plan.uses_matrix_rule(i)]
    out.update(
        {
            "peak_memory_mb": peak_mb,
            "world": {"world_size": ctx.world, "dp": ctx.dp, "tp": ctx.tp, "backend": ctx.backend,
                      "device": str(ctx.device.type)},
            "plan": plan_record(plan, metrics),
            "matrix_owner_counts": {"min": min(matrix_owned, default=0), "max": max(matrix_owned, default=0)},
            "final_loss": measured[-1]["loss"] if measured else None,
            "versions": _versions(),
            "host": platform.node(),
            "device_name": _device_name(ctx.device),
            "config": cfg.to_dict(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch_threads": torch.get_num_threads(),
        }
    )
    return out


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
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


def _trace(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Chrome trace (Perfetto): one process per rank, steps laid end to end."""
    events = []
    offset: dict[int, float] = {}
    for r in rows:
        if not r["measured"]:
            continue
        base = offset.get(r["rank"], 0.0)
        for e in r["events"]:
            events.append({"name": e["name"], "cat": e["cat"], "ph": "X", "pid": r["rank"], "tid": 0,
                           "ts": (base + e["start_ms"]) * 1e3, "dur": e["dur_ms"] * 1e3, "args": {"step": r["step"]}})
        offset[r["rank"]] = base + r["iteration_ms"]
    meta = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}} for rank in offset]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def _write_records(cfg: TrialConfig, out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_json(out / "trace.json", _trace(rows))
    atomic_write_json(out / "summary.json", summary)  # last: its presence means the trial finished


# ---------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print("usage: python -m canzona.run [key=value ...] out=DIR   (see README: configuration)")
        return 0
    try:
        cfg = load_config(argv)
        if not cfg.out:
            raise ConfigError("out=DIR is required: where the trial writes its records")
        from canzona.plan.methods import make_plan

        make_plan(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(cfg.out)
    try:
        if launched_externally():
            summary = run_rank_from_env(cfg, out)
        else:
            summary = run_trial(cfg, out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - report any rank failure as one trial failure
        print(f"trial failed: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        return 1
    if summary is not None:
        print(
            f"{cfg.method} {cfg.optimizer.name} dp={cfg.parallel.dp} tp={cfg.parallel.tp}: "
            f"iteration {summary['iteration_ms_median']:.1f} ms, optimizer step {summary['optimizer_step_ms_median']:.1f} ms "
            f"(median of {cfg.train.steps}); records in {out}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
