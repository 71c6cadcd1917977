"""DP strategy ``balanced``: Canzona's α-balanced static partition (docs/design.md §3.1).

ZeRO-1 bucket shards cut only at parameter boundaries, so every matrix is whole on one DP rank,
sized by the optimizer's cost. Candidates: the α-blended per-bucket split (``planner.dp_variant``:
exact ``minmax`` or the paper's ``snap``), for α = 1 a joint LPT over DP×TP bins (whose TP
owners the TP strategy may keep), and Megatron's whole-tensor partition last (the paper's fallback,
chosen only when strictly better). The composer scores each joined with the TP strategy by
``α·critical-path imbalance + (1-α)·widest shard``.
"""

from __future__ import annotations

from canzona.plan import dp as dpmod
from canzona.plan.critical_path import critical_path
from canzona.plan.loads import owner_loads
from canzona.plan.types import DpLayout, Plan, PlanInputs

NAME = "balanced"
RUNG = "1_1"  # the authors' USE_DP_ASYNC_OPT=1, USE_DP_BALANCED_OPT=1
ELEMENTWISE_ONLY = False


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    """``tp_split``: the matrices the TP strategy splits over TP owners (one owner each)."""
    layout, cost, s = inputs.layout, inputs.cost, inputs.settings
    out = [_layout(inputs, dpmod.ranges_from_cuts(dpmod.alpha_cuts(layout, cost, s.alpha, s.dp_variant)))]
    if s.alpha == 1.0:
        owners, hint = dpmod.joint_lpt_owners(layout, cost, layout.tp, {i: i in tp_split for i in range(len(inputs.params))})
        out.append(_layout(inputs, dpmod.ranges_from_owners(layout, owners), hint))
    out.append(_layout(inputs, dpmod.ranges_from_cuts(dpmod.atomic_cuts(layout))))  # last: never wins a tie
    return out


def _layout(inputs: PlanInputs, ranges: list, hint: dict[int, int] | None = None) -> DpLayout:
    owners = dpmod.owners_from_ranges(inputs.layout, ranges)
    return DpLayout("reduce_scatter", "shards", tuple(ranges), tuple(owners[i] for i in range(len(inputs.params))), hint)


def score(plan: Plan, inputs: PlanInputs) -> float:
    """Lower is better: α·critical-path imbalance + (1-α)·widest shard relative to an equal one."""
    alpha = inputs.settings.alpha
    path = critical_path(plan, owner_loads(plan)).imbalance
    return alpha * path + (1 - alpha) * widest_shard(plan)


def widest_shard(plan: Plan) -> float:
    """Widest shard over all buckets, relative to an equal split (1.0 = perfectly even)."""
    assert plan.shard_ranges is not None
    return max(
        max(b - a for a, b in rr) / (bucket.numel / plan.dp) for bucket, rr in zip(plan.layout.buckets, plan.shard_ranges)
    )
