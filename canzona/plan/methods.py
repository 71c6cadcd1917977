"""The four planners behind one interface: ``plan(cfg) -> Plan`` (pure, rank-independent).

``canzona`` and ``adamw`` live here; the baselines' planners live in ``baselines/`` and are
registered in `PLANNERS`. Adding a method is one function and one registry entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from canzona.config import TrialConfig
from canzona.cost import make_cost_model
from canzona.inventory import ParamSpec, build_inventory
from canzona.plan import dp as dpmod
from canzona.plan.buckets import BufferLayout, build_layout
from canzona.plan.tp import MicroGroup, schedule
from canzona.plan.types import Plan


def common_inputs(cfg: TrialConfig) -> tuple[list[ParamSpec], BufferLayout, dict[int, float], str]:
    """Inventory, buffer layout and per-param costs: what every planner starts from."""
    mcfg = cfg.model_cfg()
    params = build_inventory(mcfg, split_fused=cfg.model.split_fused, matrix_embeddings=cfg.model.matrix_embeddings)
    layout = build_layout(params, dp=cfg.parallel.dp, tp=cfg.parallel.tp, bucket_size=cfg.bucket_size())
    opt = "adamw" if cfg.method == "adamw" else cfg.optimizer.name
    model = make_cost_model(
        cfg.canzona.cost,
        opt,
        ns_steps=cfg.optimizer.ns_steps,
        precondition_frequency=cfg.optimizer.precondition_frequency,
        profile=cfg.canzona.measured_profile,
        elementwise_flops=cfg.canzona.elementwise_flops,
    )
    cost = {i: model.cost(p) for i, p in enumerate(params)}
    return params, layout, cost, model.name


def matrix_rule_enabled(cfg: TrialConfig) -> bool:
    return cfg.method != "adamw" and cfg.optimizer.name != "adamw"


def plan_adamw(cfg: TrialConfig) -> Plan:
    """Megatron's ZeRO-1: equal shards of every bucket, elementwise update of the shard."""
    params, layout, cost, cost_name = common_inputs(cfg)
    n = len(params)
    return Plan(
        method="adamw", params=tuple(params), layout=layout, cost=cost, cost_model=cost_name,
        matrix_rule=False, grad_reduce="reduce_scatter", param_sync="shards", tp_mode="local",
        shard_ranges=tuple(dpmod.ranges_from_cuts(dpmod.equal_cuts(layout))), dp_owner=(None,) * n, tp_owner=(None,) * n,
        micro_groups=((),) * layout.dp,
    )


def _widest_shard(plan: Plan) -> float:
    """Widest shard over all buckets, relative to an equal split (1.0 = perfectly even)."""
    assert plan.shard_ranges is not None
    return max(
        max(b - a for a, b in rr) / (bucket.numel / plan.dp) for bucket, rr in zip(plan.layout.buckets, plan.shard_ranges)
    )


def _canzona_from_ranges(cfg: TrialConfig, base: Plan, ranges: list, hint: dict[int, int] | None = None) -> Plan:
    params = base.params
    owners = dpmod.owners_from_ranges(base.layout, ranges)
    dp_owner = tuple(owners[i] for i in range(len(params)))
    tp_owner: list[int | None] = [None] * len(params)
    groups: list[tuple[MicroGroup, ...]] = []
    owned: list[list[int]] = [[] for _ in range(base.dp)]
    if base.tp_mode == "pipeline":
        for i in range(len(params)):
            if _tp_pipelined(base, i):
                owned[dp_owner[i]].append(i)
    for items in owned:
        mgs = schedule(items, base.cost, base.tp, cfg.canzona.grouping, cfg.canzona.capacity, hint)
        for g in mgs:
            for i, o in zip(g.items, g.owners):
                tp_owner[i] = o
        groups.append(tuple(mgs))
    return replace(base, shard_ranges=tuple(ranges), dp_owner=dp_owner, tp_owner=tuple(tp_owner), micro_groups=tuple(groups))


def _tp_pipelined(plan: Plan, index: int) -> bool:
    return plan.uses_matrix_rule(index) and plan.params[index].tp_dim is not None


def plan_canzona(cfg: TrialConfig) -> Plan:
    """α-balanced static DP partitioning composed with TP micro-groups.

    Candidate DP plans: the atomic plan (the paper's fallback), the α-blended per-bucket plan
    (``canzona.dp_variant``: exact ``minmax`` or the paper's ``snap``) and, for α = 1, a joint
    LPT over DP×TP bins that keeps each rank's part of a bucket contiguous. Each candidate is
    composed with the TP schedule and scored by ``α·critical-path imbalance + (1-α)·widest
    shard`` (the critical path counts each micro-group at its slowest TP rank; without TP it is
    the compute imbalance); the best wins (the atomic plan only when it is strictly better).
    """
    from canzona.plan.critical_path import critical_path
    from canzona.plan.metrics import compute_metrics

    params, layout, cost, cost_name = common_inputs(cfg)
    matrix_rule = matrix_rule_enabled(cfg)
    pipelined = matrix_rule and cfg.parallel.tp > 1
    base = Plan(
        method="canzona", params=tuple(params), layout=layout, cost=cost, cost_model=cost_name,
        matrix_rule=matrix_rule, grad_reduce="reduce_scatter", param_sync="shards",
        tp_mode="pipeline" if pipelined else "local",
        shard_ranges=None, dp_owner=(), tp_owner=(), micro_groups=(),
    )
    alpha = cfg.canzona.alpha
    candidates = [(dpmod.ranges_from_cuts(dpmod.alpha_cuts(layout, cost, alpha, cfg.canzona.dp_variant)), None)]
    if alpha == 1.0:
        tp_split = {i: _tp_pipelined(base, i) for i in range(len(params))}
        owners, hint = dpmod.joint_lpt_owners(layout, cost, layout.tp, tp_split)
        candidates.append((dpmod.ranges_from_owners(layout, owners), hint))
    candidates.append((dpmod.ranges_from_cuts(dpmod.atomic_cuts(layout)), None))  # last: wins ties never

    def score(plan: Plan) -> float:
        path = critical_path(plan, compute_metrics(plan, with_comm=False).compute).imbalance
        return alpha * path + (1 - alpha) * _widest_shard(plan)

    plans = [_canzona_from_ranges(cfg, base, r, h) for r, h in candidates]
    return min(plans, key=score)  # min keeps the first of equal scores


def _planners() -> dict[str, Callable[[TrialConfig], Plan]]:
    from baselines.layerwise import plan_layerwise
    from baselines.sync import plan_sync

    return {"canzona": plan_canzona, "sync": plan_sync, "layerwise": plan_layerwise, "adamw": plan_adamw}


def make_plan(cfg: TrialConfig) -> Plan:
    """Plan one trial; the result is identical on every rank and process."""
    t0 = time.perf_counter()
    plan = _planners()[cfg.method](cfg)
    object.__setattr__(plan, "plan_seconds", time.perf_counter() - t0)
    return plan
