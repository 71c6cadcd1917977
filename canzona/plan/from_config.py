"""From a trial's configuration to everything below it needs: the one seam above `canzona.config`.

Below this module nothing reads a `TrialConfig`. Here the config is unpacked, once per plan:

- the device kind and the torch threads per rank a trial runs with (`trial_device`,
  `threads_per_rank`; resolved by `canzona.devices` against what this machine has);
- the model inventory (`inventory`), built once per plan and handed to the cost model's
  calibration and to both buffers' planner inputs;
- the cost model (`select_cost_model`): which kind ``planner.cost`` means on that device and,
  for ``measured`` on this machine, the calibration it is handed -- timed into this machine's
  calibration cache first when shapes are missing, never inside a cost model or a planner;
- the planners' plain inputs (`plan_inputs`, `expert_plan_inputs`: shapes, buffer layout, one
  cost per parameter, the strategies' settings) and the execution settings the lowering reads
  (`execution`).

`make_plan` joins them: it composes the method's DP and TP strategies (`canzona.plan.compose`)
and attaches the execution settings. With the same cost model the plan is identical on every
process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from canzona.config import TrialConfig
from canzona.cost import (
    COSTS,
    ELEMENTWISE_FLOP_EQUIVALENT,
    CostModel,
    FlopsCost,
    NumelCost,
    from_calibration,
    load_measured,
)
from canzona.devices import device_here, resolve_device, resolve_dtype
from canzona.errors import ConfigError
from canzona.inventory import ParamSpec, build_inventory
from canzona.optim import registry as optimizers
from canzona.optim.section import OptimizerSection
from canzona.plan.buckets import build_layout
from canzona.plan.compose import compose
from canzona.plan.experts import ExpertInputs, expert_inputs, plan_experts
from canzona.plan.registry import PRESETS, elementwise_only
from canzona.plan.types import Execution, Plan, PlanInputs, PlanSettings

if TYPE_CHECKING:
    from canzona.calibrate.cache import Calibration


# ------------------------------------------------------------------------ device and threads
def trial_device(cfg: TrialConfig, *, required: bool = False) -> str:
    """The device kind a trial of ``cfg`` runs on here: ``dist.device`` resolved
    (`canzona.devices.resolve_device`; ``required`` when the trial's ranks run in this process)."""
    return resolve_device(cfg.dist.device, required=required)


def threads_per_rank(cfg: TrialConfig, ranks: int | None = None, cores: int | None = None) -> int:
    """The torch threads each rank of a trial of ``cfg`` runs with: ``dist.threads_per_rank``,
    else the ``cores`` (default: this machine's) shared among ``ranks`` (default: the trial's
    world size; a rank passes the ranks on its host), at least one."""
    if cfg.dist.threads_per_rank:
        return cfg.dist.threads_per_rank
    if cores is None:
        cores = os.cpu_count() or 1
    return max(1, int(cores) // max(1, cfg.world_size if ranks is None else ranks))


def execution(cfg: TrialConfig, device: str) -> Execution:
    """The trial settings that shape how a plan of ``cfg`` runs on a ``device`` kind."""
    dtype, why = resolve_dtype(cfg.train.dtype, device)
    return Execution(dp_collective=cfg.dist.dp_collective, overlap_grad_reduce=cfg.dist.overlap_grad_reduce,
                     pipeline_depth=cfg.planner.pipeline_depth, dtype=dtype, dtype_reason=why,
                     overlap_param_gather=cfg.dist.overlap_param_gather, clip_grad=cfg.optimizer.clip_grad,
                     device=device, grad_accum=cfg.train.grad_accum, clip_norm_dtype=cfg.optimizer.clip_norm_dtype,
                     ns_dtype=cfg.optimizer.ns_dtype, ns_steps=cfg.optimizer.ns_steps,
                     step_barrier=cfg.dist.step_barrier)


# ------------------------------------------------------------------------------- the inventory
def inventory(cfg: TrialConfig) -> tuple[ParamSpec, ...]:
    """Every parameter of ``cfg``'s model as the trial lays it out (fused matrices split or not,
    embeddings to the matrix rule or not, norms' gradients under sequence parallelism)."""
    return tuple(build_inventory(cfg.model_cfg(), split_fused=cfg.model.split_fused,
                                 matrix_embeddings=cfg.model.matrix_embeddings,
                                 sequence_parallel=cfg.sequence_parallel))


# ------------------------------------------------------------------------------ the cost model
def make_cost_model(
    kind: str,
    optimizer: str,
    *,
    ns_steps: int = 5,
    precondition_frequency: int = 10,
    table: str | None = None,
    elementwise_flops: float = ELEMENTWISE_FLOP_EQUIVALENT,
    settings: Any = None,
    calibration: Calibration | None = None,
    hardware: Any = None,
) -> CostModel:
    """A cost model of an explicit ``kind`` (`canzona.cost.COSTS` but ``auto``). ``settings``,
    the whole optimizer section (so ``max_preconditioner_dim`` and any other option counts), wins
    over the ``ns_steps`` / ``precondition_frequency`` shorthands. ``measured`` reads ``table``
    (the path of a hardware file that ``python -m canzona.calibrate`` wrote) or else
    ``calibration`` (this machine's cache, see `select_cost_model`); ``roofline`` runs on
    ``hardware`` (a `canzona.hardware.Hardware`, a name or a path; None:
    `canzona.hardware.DEFAULT_HARDWARE`)."""
    if settings is None:
        settings = OptimizerSection(ns_steps=ns_steps, precondition_frequency=precondition_frequency)
    flops = FlopsCost(optimizer, settings, elementwise_flops)
    if kind == "numel":
        return NumelCost()
    if kind == "flops":
        return flops
    if kind == "measured":
        if table is not None:
            return load_measured(table, optimizer, flops)
        if calibration is None:
            raise ConfigError("planner.cost=measured needs planner.measured_table=PATH or this machine's calibration")
        return from_calibration(calibration, optimizer, flops)
    if kind == "roofline":
        from canzona.hardware import DEFAULT_HARDWARE
        from canzona.roofline import RooflineCost

        return RooflineCost.on(hardware or DEFAULT_HARDWARE, optimizer, settings)
    raise ConfigError(f"planner.cost={kind!r} is not allowed; choose one of: {', '.join(COSTS)}")


def select_cost_model(cfg: TrialConfig, device: str, *, hardware: Any = None, threads: int | None = None,
                      log: Callable[[str], Any] | None = None,
                      params: tuple[ParamSpec, ...] | None = None) -> CostModel:
    """The cost model a plan of ``cfg`` for a ``device`` (cpu | cuda) uses.

    ``planner.cost=auto``: ``measured`` when this machine has such a device (a CPU always; CUDA
    when a GPU is visible), timed into this machine's calibration cache as needed (or read from
    ``planner.measured_table`` when given); otherwise ``roofline`` on ``hardware`` (the
    simulator's), else ``planner.cost_hardware``. ``threads``: the torch threads per rank the
    trial runs with (default: `threads_per_rank`). ``log`` hears the cache's path. ``params``:
    the plan's inventory when the caller has it (default: built here).
    """
    kind = cfg.planner.cost
    optimizer = "adamw" if elementwise_only(cfg.method.dp) else cfg.optimizer.name
    if kind == "auto":
        kind = "measured" if device_here(device) or cfg.planner.measured_table else "roofline"
    measured_here = kind == "measured" and not cfg.planner.measured_table
    if measured_here and not device_here(device):
        raise ConfigError(f"planner.cost=measured: this machine has no {device} device to time (dist.device="
                          f"{cfg.dist.device}); use planner.cost=roofline or planner.measured_table=PATH")
    calibration = None
    if measured_here:
        calibration = _calibration(cfg, device, optimizer, threads, log, params)
    return make_cost_model(kind, optimizer, table=cfg.planner.measured_table if kind == "measured" else None,
                           elementwise_flops=cfg.planner.elementwise_flops, settings=cfg.optimizer,
                           calibration=calibration, hardware=hardware or cfg.planner.cost_hardware)


def _calibration(cfg: TrialConfig, device: str, optimizer: str, threads: int | None,
                 log: Callable[[str], Any] | None, params: tuple[ParamSpec, ...] | None) -> Calibration:
    """This machine's calibration of ``optimizer`` on ``device``, holding the kernels of every
    matrix in the inventory (timed into the cache first when some are missing)."""
    from canzona.calibrate.cache import Need, ensure

    if threads is None:
        threads = threads_per_rank(cfg)
    d = optimizers.get(optimizer)
    needs = []
    if d.matrix:
        # The matrices' shapes only: sequence parallelism, which `inventory` applies, changes
        # no matrix, so this is the set the cache was always asked for.
        params = inventory(cfg) if params is None else params
        shapes = [shape for p in params if p.kind == "matrix" for _, shape in p.matrices]
        needs.append(Need(optimizer, cfg.optimizer, tuple(d.calibration_shapes(shapes, cfg.optimizer))))
    calibration, _ = ensure(device, threads, needs, cfg.planner.cost_cache, log)
    return calibration


# ---------------------------------------------------------------------------- planner inputs
def plan_settings(cfg: TrialConfig) -> PlanSettings:
    c = cfg.planner
    return PlanSettings(c.alpha, c.dp_variant, c.grouping, c.capacity, cfg.dist.sync_variant)


def refuse_peer(cfg: TrialConfig) -> None:
    """A peer (`canzona.peers`) plans inside its own code: the harness has no plan of it to make,
    simulate or dry-run (its mirror strategies do: docs/design.md §1)."""
    if cfg.method.peer:
        raise ConfigError(f"method={cfg.method.name} is a peer that plans inside its own code: the harness cannot "
                          f"plan, project or dry-run it; use a harness method ({', '.join(PRESETS)})")


def plan_inputs(cfg: TrialConfig, cost_model: CostModel, params: tuple[ParamSpec, ...] | None = None) -> PlanInputs:
    """The planners' inputs for ``cfg``'s dense buffer with ``cost_model``'s costs (raises
    `ConfigError` on a layout the model cannot take). An MoE model's experts are not in it
    (`expert_plan_inputs`). ``params``: the plan's inventory (default: built here)."""
    refuse_peer(cfg)
    dense = tuple(p for p in (inventory(cfg) if params is None else params) if p.expert is None)
    layout = build_layout(list(dense), dp=cfg.parallel.dp, tp=cfg.parallel.tp, bucket_size=cfg.bucket_size())
    cost = {i: cost_model.cost(p) for i, p in enumerate(dense)}
    return PlanInputs(dense, layout, cost, cost_model.name, optimizers.get(cfg.optimizer.name).matrix,
                      plan_settings(cfg))


def expert_plan_inputs(cfg: TrialConfig, cost_model: CostModel,
                       params: tuple[ParamSpec, ...] | None = None) -> ExpertInputs | None:
    """The planners' inputs for each EP rank's expert buffer (None for a dense model). Experts
    of one shape cost the same, so each shape is priced once. ``params``: the plan's inventory
    (default: built here)."""
    params = inventory(cfg) if params is None else params
    priced: dict[tuple, float] = {}
    cost = {}
    for i, p in enumerate(params):
        if p.expert is not None:
            key = (p.shape, p.kind, p.tp_dim, tuple(s.shape for s in p.subs))
            cost[i] = priced[key] if key in priced else priced.setdefault(key, cost_model.cost(p))
    return expert_inputs(params, cfg.expert_layout(), cfg.expert_bucket_size(), cost, cost_model.name,
                         optimizers.get(cfg.optimizer.name).matrix, plan_settings(cfg))


# ------------------------------------------------------------------------------------ the plan
def make_plan(cfg: TrialConfig, device: str | None = None, cost_model: CostModel | None = None, *,
              hardware: Any = None, threads: int | None = None) -> Plan:
    """Plan one trial for a device kind (``cpu``/``cuda``; default: what ``dist.device`` means
    on this machine) with ``cost_model`` (default: `select_cost_model`'s for that device, with
    ``hardware`` and ``threads``); an MoE model's expert buffer too (`Plan.experts`). The
    inventory is built once, here."""
    refuse_peer(cfg)
    device = device or trial_device(cfg)
    params = inventory(cfg)
    model = cost_model or select_cost_model(cfg, device, hardware=hardware, threads=threads, params=params)
    plan = compose(plan_inputs(cfg, model, params), cfg.method.dp, cfg.method.tp)
    moe = expert_plan_inputs(cfg, model, params)
    if moe is not None:
        plan = replace(plan, experts=plan_experts(moe, cfg.method.dp, cfg.method.tp))
    return replace(plan, execution=execution(cfg, device), cost_source=model.source)
