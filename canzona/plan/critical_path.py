"""Critical-path imbalance of a plan (pure), docs/design.md §3.2.

Per-rank totals (``imbalance.compute``) say how much each rank computes, not how long the
step takes: inside one TP micro-group the TP ranks compute in parallel and the group ends
with its slowest owner, and the next group's results are needed in order. So the time a DP
rank's TP group spends on the optimizer step is

    Σ over its micro-groups of max over TP ranks (that rank's load in the group)
    + max over TP ranks (what the rank computes outside groups: elementwise updates,
      matrices that are not TP-sharded)

and the plan's critical-path imbalance is the largest of these over DP ranks divided by the
ideal, the work counted once ÷ (DP·TP). It is at least the per-rank compute imbalance, and
equals it when every group gives every TP rank the same load. A schedule whose groups hold one
matrix each (the TP ranks take turns) scores about TP × the per-rank figure.

Lower bound: max(1, largest indivisible item ÷ ideal), where an item is one matrix update
(computed whole by one owner) or an elementwise parameter kept whole on one DP rank (split
over TP only, so cost ÷ TP per rank).

The per-rank loads come in as an argument (``rank_compute``, the ``[dp, tp]`` array counted
from the lowered programs by `canzona.program.count`, or the planner's own `canzona.plan.loads`
while it scores candidates); this module only subtracts the grouped work and re-adds it group
by group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from canzona.plan.types import Plan


@dataclass(frozen=True)
class CriticalPath:
    per_dp: np.ndarray  # [dp] critical-path load of each DP rank's TP group, cost units
    imbalance: float  # max(per_dp) ÷ ideal
    lower_bound: float  # max(1, largest indivisible item ÷ ideal)


def lower_bound(plan: Plan) -> float:
    """max(1, largest indivisible item ÷ (work counted once ÷ ranks))."""
    ideal = sum(plan.cost.values()) / plan.rank_layout.world
    largest = max(
        (
            plan.cost[i] if plan.uses_matrix_rule(i) else plan.cost[i] / plan.tp
            for i in range(len(plan.params))
            if plan.uses_matrix_rule(i) or plan.dp_owner[i] is not None
        ),
        default=0.0,
    )
    return max(1.0, largest / ideal) if ideal > 0 else 1.0


def critical_path(plan: Plan, rank_compute: np.ndarray) -> CriticalPath:
    """The plan's critical path per DP rank and its imbalance; see the module docstring.

    ``rank_compute[d, t]`` is everything rank (d, t) computes in the step, grouped or not.
    """
    dp, tp = plan.dp, plan.tp
    per_dp = np.zeros(dp)
    for d in range(dp):
        outside = np.array(rank_compute[d], dtype=float)
        path = 0.0
        for g in plan.micro_groups[d] if plan.micro_groups else ():
            loads = np.asarray(g.loads(plan.cost, tp))
            outside -= loads
            path += float(loads.max())
        # rounding can leave -1e-12 where a rank computes nothing outside groups
        per_dp[d] = path + max(0.0, float(outside.max()))
    ideal = sum(plan.cost.values()) / plan.rank_layout.world
    return CriticalPath(per_dp=per_dp, imbalance=float(per_dp.max() / ideal) if ideal > 0 else 1.0,
                        lower_bound=lower_bound(plan))
