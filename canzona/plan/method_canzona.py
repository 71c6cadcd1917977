"""`canzona`: α-balanced static DP partitioning composed with load-balanced TP micro-groups.

DP: ZeRO-1 bucket shards cut only at parameter boundaries (every matrix whole on one DP rank),
sized by the optimizer's cost (`canzona.plan.dp`). TP: each TP-sharded matrix gets one owner
TP rank and the matrices are packed into micro-groups (`canzona.plan.tp`) that the executor
runs as a pipeline of gather -> compute -> scatter rounds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from canzona.plan import dp as dpmod
from canzona.plan import loads
from canzona.plan.common import common_inputs, matrix_rule_enabled
from canzona.plan.critical_path import critical_path
from canzona.plan.tp import MicroGroup, schedule
from canzona.plan.types import Plan

if TYPE_CHECKING:
    from canzona.config import TrialConfig

NAME = "canzona"
SUMMARY = "cost-balanced DP shards cut at parameter boundaries; TP micro-group pipeline, one owner per matrix"


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


def plan(cfg: TrialConfig) -> Plan:
    """α-balanced static DP partitioning composed with TP micro-groups.

    Candidate DP plans: the atomic plan (the paper's fallback), the α-blended per-bucket plan
    (``canzona.dp_variant``: exact ``minmax`` or the paper's ``snap``) and, for α = 1, a joint
    LPT over DP×TP bins that keeps each rank's part of a bucket contiguous. Each candidate is
    composed with the TP schedule and scored by ``α·critical-path imbalance + (1-α)·widest
    shard`` (the critical path counts each micro-group at its slowest TP rank; without TP it is
    the compute imbalance); the best wins (the atomic plan only when it is strictly better).
    """
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
        path = critical_path(plan, loads.owner_loads(plan)).imbalance
        return alpha * path + (1 - alpha) * _widest_shard(plan)

    plans = [_canzona_from_ranges(cfg, base, r, h) for r, h in candidates]
    return min(plans, key=score)  # min keeps the first of equal scores
