"""DP strategy ``zero1_atomic``: Megatron's distributed optimizer with whole-tensor ownership.

The authors' default Muon run (Megatron-Canzona's train.sh with USE_DP_ASYNC_OPT=1 and
USE_DP_BALANCED_OPT=0): ZeRO-1 reduce-scatter and parameter all-gather, but each matrix belongs
whole to the DP rank whose *equal* shard holds its first element, and each rank's shard end is
stretched to the end of the last tensor it owns (`canzona.plan.dp.atomic_cuts`). No balance:
a rank owns what the layout happens to put at the start of its equal shard.
"""

from __future__ import annotations

from canzona.plan import dp as dpmod
from canzona.plan.types import DpLayout, PlanInputs

NAME = "zero1_atomic"
RUNG = "1_0"  # the authors' USE_DP_ASYNC_OPT=1, USE_DP_BALANCED_OPT=0
ELEMENTWISE_ONLY = False


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    ranges = dpmod.ranges_from_cuts(dpmod.atomic_cuts(inputs.layout))
    owners = dpmod.owners_from_ranges(inputs.layout, ranges)
    return [DpLayout("reduce_scatter", "shards", tuple(ranges), tuple(owners[i] for i in range(len(inputs.params))))]
