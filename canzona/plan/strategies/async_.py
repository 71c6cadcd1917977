"""TP strategy ``async``: the micro-group pipeline without balance (the authors' default async TP).

As Megatron-Canzona's ``AsyncGroupExecutor`` with ``--use-tp-balanced-opt`` off: a DP rank's
TP-sharded matrices in its gradient buffer's order (reverse registration), cut into chunks of
TP matrices, the i-th of a chunk owned by TP rank i; no cost, no capacity. The pipeline runs as
``async_balanced``'s; only who owns what and in which group differs.
"""

from __future__ import annotations

from canzona.plan.tp import MicroGroup, schedule
from canzona.plan.types import PlanInputs

NAME = "async"
RUNG = "1_0"  # the authors' USE_TP_ASYNC_OPT=1, USE_TP_BALANCED_OPT=0
MODE = "pipeline"


def groups(items: list[int], inputs: PlanInputs, hint: dict[int, int] | None) -> list[MicroGroup]:
    mine = set(items)
    buffer_order = [s.index for b in inputs.layout.buckets for s in b.params if s.index in mine]
    return schedule(buffer_order, inputs.cost, inputs.tp, "none", 1.0)
