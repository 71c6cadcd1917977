"""Per-rank optimizer compute of a Canzona plan, as the planner scores its candidates (pure).

The reported metrics come from counting the lowered per-rank programs
(`canzona.program.count`); scoring candidates that way while planning would lower every rank
several times, so the planner uses this direct sum instead. A test checks that the two agree.
"""

from __future__ import annotations

import numpy as np


def owner_loads(plan) -> np.ndarray:
    """[dp, tp] compute of a plan whose every parameter has a DP owner: TP-owned matrices on
    their TP owner, other matrices on every TP rank of the owning DP rank, elementwise params
    split over TP when TP-sharded."""
    loads = np.zeros((plan.dp, plan.tp))
    for i, spec in enumerate(plan.params):
        d = plan.dp_owner[i]
        t = plan.tp_owner[i]
        if plan.uses_matrix_rule(i):
            if t is not None:
                loads[d, t] += plan.cost[i]
            else:
                loads[d, :] += plan.cost[i]
        else:
            loads[d, :] += plan.cost[i] / (plan.tp if spec.tp_dim is not None else 1)
    return loads
