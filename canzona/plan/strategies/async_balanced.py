"""TP strategy ``async_balanced``: Canzona's load-balanced micro-group pipeline (docs/design.md §3.2).

Each TP-sharded matrix gets one owner TP rank; the matrices are packed into micro-groups by
``planner.grouping`` (default ``rounds``: balanced rounds in which every TP rank has work;
``global``: the paper's greedy rollback) within ``planner.capacity``, keeping the owners a joint
DP×TP balance chose when the DP strategy offers them. Per group: one all-to-all gathers the
shards to their owners, the owners compute, one all-to-all scatters the results back.
"""

from __future__ import annotations

from canzona.plan.tp import MicroGroup, schedule
from canzona.plan.types import PlanInputs

NAME = "async_balanced"
RUNG = "1_1"  # the authors' USE_TP_ASYNC_OPT=1, USE_TP_BALANCED_OPT=1
MODE = "pipeline"


def groups(items: list[int], inputs: PlanInputs, hint: dict[int, int] | None) -> list[MicroGroup]:
    s = inputs.settings
    return schedule(items, inputs.cost, inputs.tp, s.grouping, s.capacity, hint)
