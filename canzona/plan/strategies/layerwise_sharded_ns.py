"""DP strategy ``layerwise_sharded_ns``: Megatron-LM main's layer-wise optimizer, whose
shard-aligned buckets deal matrices by Newton-Schulz cost (``max·min²``) with a soft-minimum
bucket size. The rule and how the harness runs it: `canzona.plan.strategies.layerwise_sharded`
(docs/design.md §1)."""

from __future__ import annotations

from canzona.plan.strategies.layerwise_sharded import layout_for
from canzona.plan.types import DpLayout, PlanInputs

NAME = "layerwise_sharded_ns"
RUNG = None
ELEMENTWISE_ONLY = False


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    return [layout_for(inputs, "main")]
