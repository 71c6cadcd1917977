"""DP strategy ``zero1``: Megatron's distributed optimizer as shipped (ZeRO-1, the AdamW reference).

Gradients reduce-scattered into equal shards of every bucket, an elementwise update of each
rank's flat shard (which may cut a matrix in pieces: only elementwise rules can run on it),
parameters all-gathered.
"""

from __future__ import annotations

from canzona.plan import dp as dpmod
from canzona.plan.types import DpLayout, PlanInputs

NAME = "zero1"
RUNG = None
ELEMENTWISE_ONLY = True  # equal shards cut matrices: every param gets the elementwise rule


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    ranges = tuple(dpmod.ranges_from_cuts(dpmod.equal_cuts(inputs.layout)))
    return [DpLayout("reduce_scatter", "shards", ranges, (None,) * len(inputs.params))]
