"""One rank of a full-size job, run for real on fake CUDA tensors (in a dry-run worker process).

The rank is what ``python -m canzona.run`` would run on a GPU node, minus the data: torch's
``fake`` process group at the job's world size (this process is rank ``rank`` of it; its
collectives return at once), Megatron's TP/DP groups laid out on it by the same
`canzona.model.parallel.init_parallel`, NCCL's rules (`canzona.dist_rules`) installed for the
declared ``cuda:0``, then -- inside a ``FakeTensorMode`` -- the model built by `build_model`
(randn gives fake tensors: nothing is generated), the plan's `Runtime` with its flat buffers,
hooks and prologue, and `STEPS` iterations of the rank's `Program` by the loop body a GPU rank
runs (`canzona.trial.rank.run_iterations`): forward (with the overlapped parameter gather's
waits), backward (bucket reductions from the hooks), clipping, the optimizer step, the
parameter gather. The first iteration creates the optimizer state, the
second is the steady state a long run repeats; `Runtime.finish` then drains the last gathers.

The plan is made for ``cuda`` by `make_plan`'s own cost-model choice: with no GPU visible, the
roofline of ``planner.cost_hardware`` (a cluster that times its GPUs may place some matrices
elsewhere; the layout, buffers and activations do not depend on it).

Per iteration the executor's recorded calls are compared with the program's
(`canzona.program.check.compare_recorded`); the `Observer` checks and tallies every collective
and keeps the memory ledger (see `canzona.trial.dryrun.observe`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from canzona import dist_rules
from canzona.config import TrialConfig
from canzona.executor.runtime import Runtime, model_dtype
from canzona.executor.timing import StepTimer
from canzona.model import qwen3
from canzona.model.parallel import destroy_parallel, init_parallel
from canzona.model.qwen3 import build_model
from canzona.plan.from_config import make_plan
from canzona.program.check import compare_recorded
from canzona.program.lower import lower
from canzona.trial.dryrun import fastkey
from canzona.trial.dryrun.device import DeviceFunctions, emulate_queries
from canzona.trial.dryrun.observe import Ledger, Observer
from canzona.trial.dryrun.report import expected_bytes
from canzona.trial.rank import run_iterations, step_batches

STEPS = 2


class PhaseTimer(StepTimer):
    """The runtime's step timer on the host clock; its phases also name the ledger's phase, so
    every allocation is booked to the phase of the program that made it."""

    def __init__(self, ledger: Ledger):
        self._ledger = ledger
        super().__init__("cpu")

    @contextlib.contextmanager
    def phase(self, name: str, label: str | None = None) -> Iterator[None]:
        with self._ledger.phase(name), super().phase(name, label):
            yield


def run_rank(cfg: TrialConfig, rank: int, plan: Any = None) -> dict[str, Any]:
    """Run rank ``rank`` of ``cfg``'s job on fake CUDA; its result for the report (raises on any
    violation: the caller reports it as this rank's error). ``plan``: the trial's plan (the dry
    run's launcher makes it once for all ranks); None plans here."""
    emulate_queries()
    fastkey.install()  # torch's fake-tensor cache keys, computed faster (checked against torch's)
    torch.set_num_threads(1)  # fake tensors compute nothing
    dist.init_process_group("fake", rank=rank, world_size=cfg.world_size, store=FakeStore())
    dist_rules.install()
    try:
        ctx = init_parallel(cfg.parallel.tp, "cuda", cfg.dist.timeout_s, ep=cfg.parallel.ep, etp=cfg.expert_tp)
        return _run(cfg, rank, ctx, plan)
    finally:
        dist_rules.uninstall()
        destroy_parallel()


def _run(cfg: TrialConfig, rank: int, ctx, plan: Any = None) -> dict[str, Any]:
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    plan = plan if plan is not None else make_plan(cfg, device="cuda")
    program = lower(plan, [rank])[0]
    mcfg = cfg.model_cfg()
    dtype = model_dtype(plan)
    # the rank's micro-batches of the first step stand for every step's: on fake tensors only their
    # shapes and dtypes count, the same at every step (generating 4096-token batches is real CPU work)
    batches = [step_batches(cfg, 0, ctx.dp_rank, ctx.dp)] * STEPS
    groups = {"dp": ctx.dp_group, "tp": ctx.tp_group, "world": dist.distributed_c10d._get_default_group()}
    if mcfg.moe:  # the expert groups: the dispatch's (ep), the expert buffer's (edp, etp)
        groups.update(ep=ctx.ep_group, edp=ctx.edp_group, etp=ctx.etp_group)
    observer = Observer(groups)
    ledger = observer.ledger
    checks: list[str] = []
    qwen3.RECOMPUTE_MODES[:] = [DeviceFunctions]  # a recomputed forward (train.recompute) runs on autograd's thread
    with FakeTensorMode() as mode, DeviceFunctions(), observer:
        with ledger.phase("build"):
            model = build_model(mcfg, device=ctx.device, seed=cfg.train.seed, dtype=dtype, init=False,
                                recompute=cfg.train.recompute == "full",
                                sequence_parallel=cfg.sequence_parallel,
                                # fake tensors have no values to route by: every expert gets the
                                # same tokens, split sizes known on the host (`canzona.model.moe`)
                                balanced_routing=mcfg.moe)
        seconds["build"] = time.perf_counter() - t0
        runtime = Runtime(model, plan, program, cfg.optimizer, ctx)
        for role, tensors in runtime.tensors_by_role().items():
            ledger.label(tensors, role)
        timer = PhaseTimer(ledger)
        started: list[float] = []
        seen: dict[str, Any] = {}  # the last iteration's calls, before the drain adds its own

        def inputs(step: int) -> list[tuple[Any, Any]]:
            started.append(time.perf_counter())
            ledger.iteration = step + 1
            observer.collectives.tally.clear()
            with ledger.phase("input"):
                return [tuple(mode.from_tensor(t).to(ctx.device) for t in b) for b in batches[step]]

        def after(step: int, loss: torch.Tensor) -> None:
            seen["executor"] = recorded = runtime.bytes_by_tag()
            seen["collectives"] = observer.collectives.summary()
            checks.extend(f"iteration {step + 1}: {p}" for p in compare_recorded(program, recorded))
            seconds[f"iteration {step + 1}"] = time.perf_counter() - started[step]

        run_iterations(runtime, timer, STEPS, inputs, after, drain=ledger.phase("drain"))
        collectives, executor = seen["collectives"], seen["executor"]
        for role, tensors in runtime.tensors_by_role().items():  # the optimizer state exists now
            ledger.label(tensors, role)
    at_peak = ledger.breakdown(ledger.peak_event)
    return {
        "rank": rank, "dp_rank": ctx.dp_rank, "tp_rank": ctx.tp_rank,
        "backends": {"dp": dist.get_backend(ctx.dp_group), "tp": dist.get_backend(ctx.tp_group)},
        "memory": {
            "peak_bytes": ledger.peak, "peak_phase": ledger.peak_where[0], "peak_iteration": ledger.peak_where[1],
            "at_peak": at_peak, "after_run": ledger.breakdown(),
            "phase_peaks": [{"iteration": it, "phase": ph, "bytes": b} for (it, ph), b in ledger.phase_peaks.items()],
        },
        "expected": expected_bytes(plan, program, cfg.optimizer),
        "program_check": checks,
        "executor_calls": executor,
        "collectives": collectives,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
