"""One rank of a trial: set up, run the steps, gather every rank's rows, write the records.

`run_rank` sets the rank up (threads, device, process groups, model, plan, distributed
optimizer), hands over to `train_steps` -- the per-step loop -- and afterwards checks ownership,
gathers the rows on rank 0 and writes the records. The iterations themselves (`run_iterations`:
the step's calls into the executor) are the dry run's too (`canzona.trial.dryrun.execute`), so
that it runs the code a GPU rank runs.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.config import TrialConfig
from canzona.plan.from_config import threads_per_rank, trial_device
from canzona.records import PHASES

if TYPE_CHECKING:
    import torch

    from canzona.executor.runtime import Runtime
    from canzona.executor.timing import StepTimer


def run_rank(cfg: TrialConfig, out: Path, local_world: int, plan: Any = None) -> dict[str, Any] | None:
    """Run this process's rank of the trial; rank 0 writes the records and returns the summary.
    ``plan``: the trial's plan, made by the local launcher; None under an external launch, where
    rank 0 plans and hands its plan to every rank."""
    import torch
    import torch.distributed as dist

    from canzona import dist_rules
    from canzona.calibrate.probe import per_core, speed_probe, throughput_probe
    from canzona.executor.runtime import Runtime, model_dtype
    from canzona.host_memory import retain_freed_memory
    from canzona.model.parallel import destroy_parallel, init_parallel
    from canzona.model.qwen3 import build_model, full_state_dict
    from canzona.program.count import count_programs
    from canzona.program.lower import lower
    from canzona.records import atomic_torch_save, write_records
    from canzona.trial.shared_plan import shared_plan
    from canzona.trial.summary import peak_memory_mb, program_check, summarise
    from canzona.trial.trace import chrome_trace

    dist_rules.install_from_env()
    torch.set_num_threads(threads_per_rank(cfg, local_world))
    kind = trial_device(cfg, required=True)
    # a CPU rank keeps what it frees, as a GPU rank's caching allocator does (`canzona.host_memory`)
    allocator = retain_freed_memory() if kind == "cpu" else None
    ctx = init_parallel(cfg.parallel.tp, kind, cfg.dist.timeout_s, ep=cfg.parallel.ep, etp=cfg.expert_tp)
    try:
        if plan is None:  # rank 0's plan (its calibration, its costs) on every rank
            plan = shared_plan(cfg, kind, ctx.rank, torch.get_num_threads())
        programs = lower(plan)
        metrics = count_programs(plan, programs)
        model = build_model(cfg.model_cfg(), device=ctx.device, seed=cfg.train.seed, dtype=model_dtype(plan),
                            recompute=cfg.train.recompute == "full",
                            sequence_parallel=cfg.sequence_parallel)
        runtime = Runtime(model, plan, programs[ctx.rank], cfg.optimizer, ctx)
        rows = train_steps(cfg, runtime, ctx, float(metrics.compute[ctx.dp_rank, ctx.tp_rank]))
        peak_mb = peak_memory_mb(ctx.device)
        loaded_probe = None  # every rank's matmul rate at once: the machine's speed under this trial's load
        if ctx.device.type == "cpu":
            dist.barrier()
            loaded_probe = throughput_probe()
        if cfg.save_params:
            full = full_state_dict(model)
            if ctx.rank == 0:
                atomic_torch_save(full, Path(cfg.save_params))
        gathered: list[Any] = [None] * ctx.world
        space = runtime.space  # an MoE rank's indices number its own experts: report names
        report = {"rows": rows, "peak_mb": peak_mb, "computed": [space.params[i].name for i in sorted(runtime.computed)],
                  "probe": loaded_probe}
        dist.all_gather_object(gathered, report)  # over the gloo half of the groups
        if ctx.rank != 0:
            return None
        all_rows = sorted((r for g in gathered for r in g["rows"]), key=lambda r: (r["step"], r["rank"]))
        owners = Counter(n for g in gathered for n in g["computed"])  # ranks computing each full update
        summary = summarise(cfg, plan, metrics, all_rows, [g["peak_mb"] for g in gathered], ctx, owners, local_world)
        if ctx.device.type == "cpu":  # the machine's speed now, against the calibration's (validate)
            summary["speed_probe_flops_per_s"] = speed_probe()
            if local_world == ctx.world:  # every rank on this host: a core's speed with all of them busy
                summary["speed_probe_all_cores_flops_per_s"] = per_core([g["probe"] for g in gathered],
                                                                        os.cpu_count() or 1)
            summary["host_allocator"] = allocator
        summary["program_check"] = check = program_check(programs, all_rows)
        write_records(out, cfg.to_dict(), all_rows, summary, trace=chrome_trace(all_rows))
        if not check["ok"]:  # the timings are not those of the method's program: fail the trial
            raise RuntimeError(f"the executor handed torch.distributed other calls than the program lists "
                               f"({len(check['mismatches'])} mismatches, first: {check['mismatches'][0]}); "
                               f"records kept in {out} for inspection")
        return summary
    finally:
        destroy_parallel()


def train_steps(cfg: TrialConfig, runtime: Any, ctx: Any, planned: float) -> list[dict[str, Any]]:
    """``train.warmup + train.steps`` iterations of the rank's program (forward, backward with
    its bucket reductions, the optimizer step, the parameter sync); one row of
    `canzona.records.STEP_FIELDS` (+ ``comm_bytes`` per action and ``events``) per step.

    ``optimizer_step_ms`` runs from the program's ``step_start`` mark ("gradients reduced") to
    ``step_end`` ("every owned parameter updated"); ``iteration_ms`` from the start to the end of
    the iteration (see `canzona.executor.timing` for what the numbers mean on CPU and on CUDA).
    """
    import torch.distributed as dist

    from canzona.executor.timing import START, StepTimer

    timer = StepTimer(ctx.device)
    rows: list[dict[str, Any]] = []

    def inputs(step: int) -> list[tuple[Any, Any]]:
        batches = [tuple(t.to(ctx.device) for t in b) for b in step_batches(cfg, step, ctx.dp_rank, ctx.dp)]
        if cfg.train.fail_on_rank == ctx.rank and step == cfg.train.fail_at_step:
            raise RuntimeError(f"injected failure on rank {ctx.rank} at step {step} (train.fail_on_rank)")
        return batches

    def record(step: int, loss: torch.Tensor) -> None:
        step_cpu, iteration_cpu = timer.cpu_between("step_start", "step_end"), timer.cpu_between(START, "end")
        global_loss = loss.detach().float()
        dist.all_reduce(global_loss, group=ctx.dp_group)
        rows.append({
            "step": step, "measured": step >= cfg.train.warmup, "rank": ctx.rank, "dp_rank": ctx.dp_rank,
            "tp_rank": ctx.tp_rank, "iteration_ms": timer.at("end"),
            "optimizer_step_ms": timer.between("step_start", "step_end"),
            "step_start_ms": timer.at("step_start"),
            "compute_load": planned, "loss": float(global_loss) / ctx.dp,
            **{f"{p}_ms": timer.ms.get(p, 0.0) for p in PHASES},
            "param_gather_ms": runtime.param_gather_ms,
            "param_sync_peer_ms": None,  # the ranks' issue times are not compared on a common clock
            **cpu_fields("step", step_cpu), **cpu_fields("iteration", iteration_cpu),
            "comm_bytes": runtime.bytes_by_tag(),
            "events": timer.events,
        })

    run_iterations(runtime, timer, cfg.train.warmup + cfg.train.steps, inputs, record)
    return rows


def cpu_fields(span: str, cpu: tuple[float, float] | None) -> dict[str, float]:
    """A CPU rank's row keys for ``span`` ("step": step_start to step_end, "iteration"): its
    main thread's CPU ms and its other threads' (gloo's); none on CUDA."""
    if cpu is None:
        return {}
    return {f"{span}_thread_cpu_ms": cpu[0], f"{span}_other_threads_cpu_ms": cpu[1]}


def run_iterations(runtime: Runtime, timer: StepTimer, steps: int,
                   inputs: Callable[[int], Sequence[tuple[Any, Any]]],
                   after: Callable[[int, torch.Tensor], None],
                   drain: AbstractContextManager[Any] | None = None) -> None:
    """``steps`` iterations of the rank's program, then the drain of what the last leaves in
    flight: the body a rank runs, on a GPU (`train_steps`) and in the dry run
    (`canzona.trial.dryrun.execute`), which differ only in what they hand in.

    Per step: ``inputs(step)`` gives the micro-batches (one ``(tokens, labels)`` each), the
    timer is reset, the runtime runs the iteration, ``end`` is marked and the timer resolved;
    then ``after(step, loss)`` reads the step (the rank's mean loss, the timer, the runtime's
    recorded calls). ``drain``: a context the drain runs in (the dry run's ledger phase).
    """
    for step in range(steps):
        batches = inputs(step)
        timer.reset()
        loss = runtime.iteration(batches, timer)
        timer.mark("end")
        timer.finish()
        after(step, loss)
        del loss  # the caller's to keep: not held by the loop through the next iteration (4 bytes)
    with drain if drain is not None else nullcontext():
        runtime.finish(timer)


def step_batches(cfg: TrialConfig, step: int, dp_rank: int, dp: int) -> list[tuple[Any, Any]]:
    """The (tokens, labels) of each of the ``train.grad_accum`` micro-batches DP rank ``dp_rank``
    runs at ``step``, on the CPU: micro-batch m of DP rank d is sample block d·k + m of the
    global batch (k = ``train.grad_accum``)."""
    from canzona.model.data import synthetic_batch

    k = cfg.train.grad_accum
    return [synthetic_batch(cfg.model_cfg(), cfg.train.micro_batch, cfg.train.seq_len, cfg.train.seed, step,
                            dp_rank * k + m, dp * k) for m in range(k)]
