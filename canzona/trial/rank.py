"""One rank of a trial: set up, run the steps, gather every rank's rows, write the records.

`run_rank` sets the rank up (threads, device, process groups, model, plan, distributed
optimizer), hands over to `train_steps` -- the whole per-step loop, in one function, so that the
step's calls into the executor live in one place -- and afterwards checks ownership, gathers the
rows on rank 0 and writes the records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from canzona.config import TrialConfig
from canzona.errors import ConfigError
from canzona.records import PHASES


def device_kind(cfg: TrialConfig) -> str:
    """``dist.device`` resolved: ``auto`` is cuda when a CUDA device is visible, else cpu."""
    import torch

    want = cfg.dist.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("dist.device=cuda but no CUDA device is visible; use dist.device=cpu or auto")
    return want


def run_rank(cfg: TrialConfig, out: Path, local_world: int) -> dict[str, Any] | None:
    """Run this process's rank of the trial; rank 0 writes the records and returns the summary."""
    import torch
    import torch.distributed as dist

    from canzona import dist_rules
    from canzona.executor.optimizer import DistributedOptimizer
    from canzona.model.parallel import destroy_parallel, init_parallel
    from canzona.model.qwen3 import build_model, full_state_dict
    from canzona.plan.methods import make_plan
    from canzona.plan.metrics import compute_metrics
    from canzona.trial.output import atomic_torch_save, write_records
    from canzona.trial.summary import peak_memory_mb, summarise

    dist_rules.install_from_env()
    cores = os.cpu_count() or 1
    torch.set_num_threads(cfg.dist.threads_per_rank or max(1, cores // max(1, local_world)))
    ctx = init_parallel(cfg.parallel.tp, device_kind(cfg), cfg.dist.timeout_s)
    try:
        plan = make_plan(cfg)
        metrics = compute_metrics(plan)
        model = build_model(cfg.model_cfg(), device=ctx.device, seed=cfg.train.seed)
        opt = DistributedOptimizer(model, plan, cfg, ctx)
        rows = train_steps(cfg, model, opt, ctx, float(metrics.compute[ctx.dp_rank, ctx.tp_rank]))
        peak_mb = peak_memory_mb(ctx.device)
        if cfg.save_params:
            full = full_state_dict(model)
            if ctx.rank == 0:
                atomic_torch_save(full, Path(cfg.save_params))
        owned = opt.owned_count.to(ctx.device, copy=True)
        dist.all_reduce(owned)  # every matrix must be owned exactly once (checked by tests)
        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, {"rows": rows, "peak_mb": peak_mb})  # over the gloo half
        if ctx.rank != 0:
            return None
        all_rows = sorted((r for g in gathered for r in g["rows"]), key=lambda r: (r["step"], r["rank"]))
        summary = summarise(cfg, plan, metrics, all_rows, [g["peak_mb"] for g in gathered], ctx, owned.cpu())
        write_records(cfg, out, all_rows, summary)
        return summary
    finally:
        destroy_parallel()


def train_steps(cfg: TrialConfig, model: Any, opt: Any, ctx: Any, planned: float) -> list[dict[str, Any]]:
    """``train.warmup + train.steps`` steps of forward, backward, gradient reduction, optimizer
    step and parameter sync; one row of `canzona.records.STEP_FIELDS` (+ ``events``) per step.

    ``optimizer_step_ms`` runs from "gradients reduced" to "every owned parameter updated";
    ``iteration_ms`` from the step's start to the end of the parameter sync (see
    `canzona.executor.timing` for what the numbers mean on CPU and on CUDA).
    """
    import torch.distributed as dist

    from canzona.executor.timing import StepTimer
    from canzona.model.data import synthetic_batch

    mcfg = cfg.model_cfg()
    timer = StepTimer(ctx.device)
    rows: list[dict[str, Any]] = []
    for step in range(cfg.train.warmup + cfg.train.steps):
        tokens, labels = synthetic_batch(
            mcfg, cfg.train.micro_batch, cfg.train.seq_len, cfg.train.seed, step, ctx.dp_rank, ctx.dp
        )
        tokens, labels = tokens.to(ctx.device), labels.to(ctx.device)
        timer.reset()
        opt.start_step()
        with timer.phase("forward"):
            loss = model(tokens, labels)
        with timer.phase("backward"):
            loss.backward()
        with timer.phase("grad_reduce"):
            opt.finish_grad_sync()
        timer.mark("grads_reduced")
        if cfg.train.fail_on_rank == ctx.rank and step == cfg.train.fail_at_step:
            raise RuntimeError(f"injected failure on rank {ctx.rank} at step {step} (train.fail_on_rank)")
        opt.step(timer)
        timer.mark("updated")
        with timer.phase("param_sync"):
            opt.sync_params()
        timer.mark("end")
        timer.finish()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, group=ctx.dp_group)
        rows.append({
            "step": step, "measured": step >= cfg.train.warmup, "rank": ctx.rank, "dp_rank": ctx.dp_rank,
            "tp_rank": ctx.tp_rank, "iteration_ms": timer.at("end"),
            "optimizer_step_ms": timer.between("grads_reduced", "updated"),
            "compute_load": planned, "loss": float(global_loss) / ctx.dp,
            **{f"{p}_ms": timer.ms.get(p, 0.0) for p in PHASES},
            "events": timer.events,
        })
    return rows
