"""From a trial's config to its plan: the one place that reads `TrialConfig` for planning.

`plan_inputs` turns the config and a cost model into the planners' plain inputs (shapes,
buffer layout, one cost per param, the strategies' settings); `make_plan` picks the cost model
(which may time missing shapes into this machine's calibration cache first -- never inside a
planner), composes the method's DP and TP strategies (`canzona.plan.compose`) and attaches the
trial's execution settings. With the same cost model the plan is identical on every process.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from canzona.config import TrialConfig
from canzona.errors import ConfigError
from canzona.inventory import ParamSpec, build_inventory
from canzona.optim import registry as optimizers
from canzona.plan.buckets import build_layout
from canzona.plan.compose import compose
from canzona.plan.experts import ExpertInputs, expert_inputs, plan_experts
from canzona.plan.registry import PRESETS
from canzona.plan.types import Execution, Plan, PlanInputs, PlanSettings

if TYPE_CHECKING:
    from canzona.cost import CostModel


def plan_settings(cfg: TrialConfig) -> PlanSettings:
    c = cfg.planner
    return PlanSettings(c.alpha, c.dp_variant, c.grouping, c.capacity, cfg.dist.sync_variant)


def _inventory(cfg: TrialConfig) -> tuple[ParamSpec, ...]:
    return tuple(build_inventory(cfg.model_cfg(), split_fused=cfg.model.split_fused,
                                 matrix_embeddings=cfg.model.matrix_embeddings,
                                 sequence_parallel=cfg.sequence_parallel))


def refuse_peer(cfg: TrialConfig) -> None:
    """A peer (`canzona.peers`) plans inside its own code: the harness has no plan of it to make,
    simulate or dry-run (its mirror strategies do: docs/design.md §1)."""
    if cfg.method.peer:
        raise ConfigError(f"method={cfg.method.name} is a peer that plans inside its own code: the harness cannot "
                          f"plan, project or dry-run it; use a harness method ({', '.join(PRESETS)})")


def plan_inputs(cfg: TrialConfig, cost_model: CostModel) -> PlanInputs:
    """The planners' inputs for ``cfg``'s dense buffer with ``cost_model``'s costs (raises
    `ConfigError` on a layout the model cannot take). An MoE model's experts are not in it
    (`expert_plan_inputs`)."""
    refuse_peer(cfg)
    params = tuple(p for p in _inventory(cfg) if p.expert is None)
    layout = build_layout(list(params), dp=cfg.parallel.dp, tp=cfg.parallel.tp, bucket_size=cfg.bucket_size())
    cost = {i: cost_model.cost(p) for i, p in enumerate(params)}
    return PlanInputs(params, layout, cost, cost_model.name, optimizers.get(cfg.optimizer.name).matrix,
                      plan_settings(cfg))


def expert_plan_inputs(cfg: TrialConfig, cost_model: CostModel) -> ExpertInputs | None:
    """The planners' inputs for each EP rank's expert buffer (None for a dense model). Experts
    of one shape cost the same, so each shape is priced once."""
    params = _inventory(cfg)
    priced: dict[tuple, float] = {}
    cost = {}
    for i, p in enumerate(params):
        if p.expert is not None:
            key = (p.shape, p.kind, p.tp_dim, tuple(s.shape for s in p.subs))
            cost[i] = priced[key] if key in priced else priced.setdefault(key, cost_model.cost(p))
    return expert_inputs(params, cfg.expert_layout(), cfg.expert_bucket_size(), cost, cost_model.name,
                         optimizers.get(cfg.optimizer.name).matrix, plan_settings(cfg))


def make_plan(cfg: TrialConfig, device: str | None = None, cost_model: CostModel | None = None) -> Plan:
    """Plan one trial for a device kind (``cpu``/``cuda``; default: what ``dist.device`` means
    on this machine) with ``cost_model`` (default: `canzona.cost.select_cost_model`'s for that
    device); an MoE model's expert buffer too (`Plan.experts`)."""
    from canzona.cost import select_cost_model
    from canzona.devices import trial_device

    refuse_peer(cfg)
    device = device or trial_device(cfg)
    model = cost_model or select_cost_model(cfg, device)
    plan = compose(plan_inputs(cfg, model), cfg.method.dp, cfg.method.tp)
    moe = expert_plan_inputs(cfg, model)
    if moe is not None:
        plan = replace(plan, experts=plan_experts(moe, cfg.method.dp, cfg.method.tp))
    return replace(plan, execution=Execution.from_config(cfg, device), cost_source=model.source)

