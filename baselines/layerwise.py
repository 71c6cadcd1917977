"""`layerwise`: Megatron-LM's ``LayerWiseDistributedOptimizer`` -- planner.

Gradients are all-reduced as in plain DDP; whole params are dealt to DP ranks by LPT on
``numel`` (not on the optimizer's cost); each rank updates the params it owns; then the updated
params are all-gathered, each rank's owned params packed into a shard padded to the largest.
TP is "duplicated": every TP rank all-gathers each matrix and computes the same update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.plan.common import common_inputs, matrix_rule_enabled
from canzona.plan.dp import lpt
from canzona.plan.types import Plan

if TYPE_CHECKING:
    from canzona.config import TrialConfig

NAME = "layerwise"
SUMMARY = "whole params dealt to DP ranks by LPT on numel, all-reduce, padded param all-gather, duplicated TP"


def plan(cfg: TrialConfig) -> Plan:
    params, layout, cost, cost_name = common_inputs(cfg)
    numel = [float(p.local_numel(cfg.parallel.tp)) for p in params]
    owner = lpt(numel, cfg.parallel.dp)
    n = len(params)
    return Plan(
        method="layerwise", params=tuple(params), layout=layout, cost=cost, cost_model=cost_name,
        matrix_rule=matrix_rule_enabled(cfg), grad_reduce="all_reduce", param_sync="owned_params",
        tp_mode="duplicated" if cfg.parallel.tp > 1 else "local",
        shard_ranges=None, dp_owner=tuple(owner), tp_owner=(None,) * n, micro_groups=((),) * layout.dp,
    )
