"""What ``python -m canzona.plan`` shows of an MoE model's expert plan (pure): every expert
matrix with its place, the expert buckets and the imbalance over the expert-DP groups.

The figures come from the plan itself (`canzona.plan.rank_loads`), one expert-DP grid per EP
rank: the counted programs (`canzona.program.count`) hold each global rank's dense and expert
work together, with which these sums agree (a test checks it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from canzona.plan.critical_path import critical_path
from canzona.plan.rank_loads import plan_loads, step_loads
from canzona.plan.types import ExpertPlan, Plan


def expert_params(ex: ExpertPlan) -> list[dict[str, Any]]:
    """Every expert matrix once (its sub-matrices with ``model.split_fused``, sharing its place):
    its EP rank, its expert-DP owner (``dp_owner``, a rank of the expert-DP group), its expert-TP
    owner and the global ranks that compute its update."""
    out = []
    for e, plan in enumerate(ex.plans):
        for k, spec in enumerate(plan.params):
            dp_owner = plan.dp_owner[k]
            tp_owner = plan.tp_owner[k] if plan.uses_matrix_rule(k) else None
            ranks = ex.computing_ranks(e, dp_owner, tp_owner)
            for sub in spec.subs or (None,):
                name, shape = (sub.name, sub.shape) if sub else (spec.name, spec.shape)
                share = plan.cost[k] if sub is None else plan.cost[k] * shape[0] * shape[1] / spec.numel
                out.append({"name": name, "shape": list(shape), "kind": spec.kind if plan.matrix_rule else "adamw",
                            "tp_partition_dim": spec.tp_dim, "expert": spec.expert, "ep_rank": e,
                            "dp_owner": dp_owner, "tp_owner": tp_owner, "ranks": ranks, "cost": share})
    return out


def bucket_rows(plan: Plan) -> list[dict[str, Any]]:
    """Per bucket of one EP rank's expert buffer: its elements and matrices, its widest shard
    relative to an equal one (None without shards: all-reduce), and the largest expert-DP rank's
    share of the bucket's cost relative to an equal one (None where no rank owns whole matrices)."""
    rows = []
    for bi, bucket in enumerate(plan.layout.buckets):
        widest = None
        if plan.shard_ranges is not None:
            widest = max(b - a for a, b in plan.shard_ranges[bi]) / (bucket.numel / plan.dp)
        owned = [plan.dp_owner[s.index] for s in bucket.params]
        cost_max = None
        if all(o is not None for o in owned):
            per = np.zeros(plan.dp)
            for s, o in zip(bucket.params, owned):
                per[o] += plan.cost[s.index]
            cost_max = float(per.max() / per.mean()) if per.sum() > 0 else 1.0
        rows.append({"bucket": bi, "numel": bucket.numel, "matrices": len(bucket.params), "widest_shard": widest,
                     "cost_imbalance": cost_max})
    return rows


def expert_imbalance(ex: ExpertPlan) -> dict[str, float]:
    """Worst over the EP ranks of each expert-DP grid's compute imbalance (max rank ÷ the work
    counted once ÷ edp·etp), critical-path imbalance and its lower bound."""
    worst = {"compute": 0.0, "critical_path": 0.0, "critical_path_lower_bound": 0.0}
    for plan in ex.plans:
        loads, _ = plan_loads(plan)
        ideal = sum(plan.cost.values()) / (plan.dp * plan.tp)
        path = critical_path(plan, loads)
        got = {"compute": float(loads.max() / ideal) if ideal else 1.0, "critical_path": path.imbalance,
               "critical_path_lower_bound": path.lower_bound}
        worst = {k: max(worst[k], got[k]) for k in worst}
    return worst


def step_imbalance(plan: Plan) -> float:
    """Whole optimizer step, dense and experts: the busiest global rank ÷ the work counted once ÷ world."""
    loads = step_loads(plan)
    once = sum(plan.cost.values()) + (sum(sum(p.cost.values()) for p in plan.experts.plans) if plan.experts else 0.0)
    return float(loads.max() / (once / loads.size)) if once else 1.0


def expert_summary(plan: Plan) -> dict[str, Any]:
    """The ``experts`` section of ``canzona.plan --json``."""
    ex = plan.experts
    assert ex is not None
    lay = ex.layout
    return {"ep": lay.ep, "etp": lay.etp, "edp": lay.edp, "bucket_size": ex.bucket_size,
            "matrices_per_ep_rank": len(ex.index[0]), "imbalance": expert_imbalance(ex),
            "step_compute_imbalance": step_imbalance(plan),
            "buckets": [bucket_rows(p) for p in ex.plans], "plan_seconds": ex.plan_seconds}


def render_experts(plan: Plan, shown: int = 8) -> list[str]:
    """The text lines on the experts: the grid, the buckets (first and last ``shown``), imbalance."""
    ex = plan.experts
    assert ex is not None
    lay, first = ex.layout, ex.plans[0]
    imb = expert_imbalance(ex)
    rows = bucket_rows(first)
    widest = [r["widest_shard"] for r in rows if r["widest_shard"] is not None]
    lines = [
        "",
        f"experts: ep={lay.ep} expert-tp={lay.etp} expert-dp={lay.edp}  {len(ex.index[0])} expert matrices per EP "
        f"rank  buffer {first.layout.numel:,} elements in {len(rows)} buckets (bucket.expert_size "
        f"{ex.bucket_size:,})  planned in {ex.plan_seconds * 1e3:.1f} ms",
        f"expert imbalance over each expert-DP group (planner's loads; worst EP rank): compute {imb['compute']:.3f}  "
        f"critical path {imb['critical_path']:.3f}  lower bound {imb['critical_path_lower_bound']:.3f}  "
        f"whole step (dense + experts, per global rank) {step_imbalance(plan):.3f}",
    ]
    if widest:
        lines.append(f"expert buckets' widest shard (x an equal one): min {min(widest):.3f}  "
                     f"median {float(np.median(widest)):.3f}  max {max(widest):.3f}")
    lines += ["", f"{'bucket':>6} {'numel':>13} {'matrices':>8} {'widest shard':>12} {'cost max/mean':>13}"]
    cut = rows if len(rows) <= 2 * shown else rows[:shown] + rows[-shown:]
    for k, r in enumerate(cut):
        if len(rows) > 2 * shown and k == shown:
            lines.append(f"{'...':>6} ({len(rows) - 2 * shown} more buckets)")
        w = "-" if r["widest_shard"] is None else f"{r['widest_shard']:.3f}"
        c = "-" if r["cost_imbalance"] is None else f"{r['cost_imbalance']:.3f}"
        lines.append(f"{r['bucket']:>6} {r['numel']:>13,} {r['matrices']:>8} {w:>12} {c:>13}")
    return lines
