"""Per-rank optimizer work of any plan, from the plan alone (pure).

`canzona.program.count` counts the same from the lowered per-rank programs, which is what trials
and ``python -m canzona.plan`` report. This sum needs no programs: the composer scores candidate
plans with it before anything is lowered (`canzona.plan.compose`), and the expert report takes
each EP rank's expert-DP grid from it (`canzona.plan.expert_report`), which the counted programs
add into every global rank's total. Tests check that the two agree, on dense and MoE plans
(tests/unit/test_moe_plan.py). Units and rules are `count`'s: a computed matrix costs its full-tensor cost and holds a full matrix of
state on every rank that computes it (its DP and TP owner, or every rank of an axis without
one); an elementwise update costs the covered fraction of its param's cost and holds the
covered elements.
"""

from __future__ import annotations

import numpy as np

from canzona.plan.types import ExpertPlan, Plan


def plan_loads(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """([dp, tp] compute, [dp, tp] optimizer-state elements) of ``plan``'s params."""
    compute = np.zeros((plan.dp, plan.tp))
    numel = np.zeros((plan.dp, plan.tp))
    shard_share = _shard_shares(plan) if plan.elementwise_on_shards else {}
    for i, spec in enumerate(plan.params):
        d = plan.dp_owner[i]
        rows = slice(None) if d is None else d
        if plan.uses_matrix_rule(i):
            t = plan.tp_owner[i]
            cols = slice(None) if t is None else t
            compute[rows, cols] += plan.cost[i]
            numel[rows, cols] += spec.numel
        elif i in shard_share:  # ZeRO-1 elementwise: each DP rank its covered elements
            for r, n in shard_share[i].items():
                compute[r, :] += plan.cost[i] * n / spec.numel
                numel[r, :] += n
        else:
            local = spec.local_numel(plan.tp)
            compute[rows, :] += plan.cost[i] * local / spec.numel
            numel[rows, :] += local
    return compute, numel


def _shard_shares(plan: Plan) -> dict[int, dict[int, int]]:
    """inventory index -> {DP rank: elements of its TP-local shard that rank's ranges cover}."""
    assert plan.shard_ranges is not None
    out: dict[int, dict[int, int]] = {}
    for bucket, ranges in zip(plan.layout.buckets, plan.shard_ranges):
        for slot in bucket.params:
            share = out.setdefault(slot.index, {})
            for r, (lo, hi) in enumerate(ranges):
                n = min(hi, slot.end) - max(lo, slot.start)
                if n > 0:
                    share[r] = share.get(r, 0) + n
    return out


def step_loads(plan: Plan) -> np.ndarray:
    """[world] optimizer compute of every global rank: its dense work plus, for an MoE model, the
    work its expert-DP group's plan gives it (`canzona.layout.ExpertLayout` numbering)."""
    dense, _ = plan_loads(plan)
    out = dense.reshape(-1).copy()  # global rank = dp_rank * tp + tp_rank
    if plan.experts is not None:
        out += expert_rank_loads(plan.experts)
    return out


def expert_rank_loads(experts: ExpertPlan) -> np.ndarray:
    """[world] expert compute of every global rank."""
    lay = experts.layout
    out = np.zeros(lay.world)
    for e, plan in enumerate(experts.plans):
        loads, _ = plan_loads(plan)
        for d in range(lay.edp):
            for t in range(lay.etp):
                out[lay.rank_of(d, e, t)] += loads[d, t]
    return out
