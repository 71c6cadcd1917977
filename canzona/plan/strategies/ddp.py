"""DP strategy ``ddp``: the fully synchronous baseline (the paper's DP-SC, Moonlight-style).

Every DP rank obtains every full gradient -- a bucketed all-reduce, or with
``dist.sync_variant=zero1_gather`` a ZeRO-1 reduce-scatter followed by an all-gather of the
gradients, as Moonlight does -- and computes every update itself. No parameter sync afterwards:
all replicas computed the same values.
"""

from __future__ import annotations

from canzona.plan import dp as dpmod
from canzona.plan.types import DpLayout, PlanInputs

NAME = "ddp"
RUNG = "0_0"  # the authors' USE_DP_ASYNC_OPT=0
ELEMENTWISE_ONLY = False


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    n = len(inputs.params)
    if inputs.settings.sync_variant == "zero1_gather":
        ranges = tuple(dpmod.ranges_from_cuts(dpmod.equal_cuts(inputs.layout)))
        return [DpLayout("reduce_scatter", "none", ranges, (None,) * n)]
    return [DpLayout("all_reduce", "none", None, (None,) * n)]
