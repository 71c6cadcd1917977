"""What a trial records about its plan (``summary.json``'s ``plan``), the same for measured and
projected trials: imbalance (per-rank compute, memory, critical path and their lower bounds),
the cost model and where its numbers came from, micro-groups, buckets, per-rank loads and how long planning took."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from canzona.plan.critical_path import critical_path


def plan_record(plan, metrics) -> dict[str, Any]:
    """``metrics``: the counting pass over the plan's programs (`canzona.program.count`)."""
    path = critical_path(plan, metrics.compute)
    return {
        "imbalance": {**metrics.imbalance(), "critical_path": path.imbalance,
                      "critical_path_lower_bound": path.lower_bound},
        "ranks": metrics.ranks(),
        "cost_model": plan.cost_model,
        "cost_source": plan.cost_source,
        "collectives_per_step": metrics.collectives,
        "micro_groups": [len(g) for g in plan.micro_groups],
        "buckets": len(plan.layout.buckets),
        "plan_seconds": plan.plan_seconds,
        "execution": asdict(plan.execution),  # dtype (and why), clipping, overlaps, collective, device
    }
