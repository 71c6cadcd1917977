"""DP strategy ``layerwise``: Megatron-LM's ``LayerWiseDistributedOptimizer``.

Gradients are all-reduced as in plain DDP; whole params are dealt to DP ranks by LPT on their
TP-local ``numel`` (not on the optimizer's cost); each rank updates the params it owns; then the
updated params are all-gathered, each rank's owned params packed into a shard padded to the
largest. Megatron pairs it with ``duplicated`` TP (preset ``layerwise``).
"""

from __future__ import annotations

from canzona.plan.dp import lpt
from canzona.plan.types import DpLayout, PlanInputs

NAME = "layerwise"
SUMMARY = "all-reduce; whole params dealt to DP ranks by LPT on numel; padded all-gather of the owned params"
RUNG = None
ELEMENTWISE_ONLY = False


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    numel = [float(p.local_numel(inputs.tp)) for p in inputs.params]
    return [DpLayout("all_reduce", "owned_params", None, tuple(lpt(numel, inputs.dp)))]
