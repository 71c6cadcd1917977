"""`sync`: the synchronous-redundant baseline (the paper's DP-SC, Moonlight-style) -- planner.

Every DP rank obtains every full gradient (all-reduce, or with ``dist.sync_variant=zero1_gather``
a ZeRO-1 reduce-scatter followed by an all-gather of the gradients, as Moonlight does) and
every TP rank all-gathers every TP-sharded matrix, then computes every update redundantly.
No parameter sync is needed afterwards: all replicas computed the same values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.plan import dp as dpmod
from canzona.plan.common import common_inputs, matrix_rule_enabled
from canzona.plan.types import Plan

if TYPE_CHECKING:
    from canzona.config import TrialConfig

NAME = "sync"
SUMMARY = "every rank reduces every gradient and computes every update (DP all-reduce, TP all-gather)"


def plan(cfg: TrialConfig) -> Plan:
    params, layout, cost, cost_name = common_inputs(cfg)
    n = len(params)
    zero1 = cfg.dist.sync_variant == "zero1_gather"
    return Plan(
        method="sync", params=tuple(params), layout=layout, cost=cost, cost_model=cost_name,
        matrix_rule=matrix_rule_enabled(cfg),
        grad_reduce="reduce_scatter" if zero1 else "all_reduce", param_sync="none",
        tp_mode="duplicated" if cfg.parallel.tp > 1 else "local",
        shard_ranges=tuple(dpmod.ranges_from_cuts(dpmod.equal_cuts(layout))) if zero1 else None,
        dp_owner=(None,) * n, tp_owner=(None,) * n, micro_groups=((),) * layout.dp,
    )
