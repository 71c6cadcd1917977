"""`adamw`: the reference -- Megatron's ZeRO-1 distributed optimizer with AdamW everywhere.

Gradients reduce-scattered into equal shards of every bucket, an elementwise update of the
shard, parameters all-gathered; TP shards are updated locally (elementwise needs no gather).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.plan import dp as dpmod
from canzona.plan.common import common_inputs
from canzona.plan.types import Plan

if TYPE_CHECKING:
    from canzona.config import TrialConfig

NAME = "adamw"
SUMMARY = "plain ZeRO-1: equal shards, elementwise AdamW on the shard"


def plan(cfg: TrialConfig) -> Plan:
    """Megatron's ZeRO-1: equal shards of every bucket, elementwise update of the shard."""
    params, layout, cost, cost_name = common_inputs(cfg)
    n = len(params)
    return Plan(
        method="adamw", params=tuple(params), layout=layout, cost=cost, cost_model=cost_name,
        matrix_rule=False, grad_reduce="reduce_scatter", param_sync="shards", tp_mode="local",
        shard_ranges=tuple(dpmod.ranges_from_cuts(dpmod.equal_cuts(layout))), dp_owner=(None,) * n, tp_owner=(None,) * n,
        micro_groups=((),) * layout.dp,
    )
