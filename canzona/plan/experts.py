"""The expert buffer of an MoE model, planned by the method's own DP and TP strategies (pure).

Megatron keeps expert params out of the dense gradient buffer: each EP rank lays its own
experts (``num_experts / ep`` per layer) into an expert buffer of their own, in the same reverse
registration order and with the same 64-element alignment, closing buckets at
``bucket.expert_size``, and reduces it over its expert-data-parallel group
(`canzona.layout.ExpertLayout`) instead of the DP group. So an EP rank's experts are one more
planning problem of exactly the shape the strategies already solve -- a buffer, its buckets and
one cost per param over ``edp`` DP ranks and ``etp`` TP ranks -- and `plan_experts` hands it to
`canzona.plan.compose` unchanged. Every expert matrix then has one place: its EP rank (by its
index), and inside that EP rank's plan its expert-DP owner and expert-TP owner, exactly as a
dense matrix has a DP and a TP owner. EP ranks whose experts have the same shapes and costs (all
of them, in the Qwen3 models) get one plan, computed once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from canzona.inventory import ParamSpec
from canzona.layout import ExpertLayout
from canzona.plan.buckets import build_layout
from canzona.plan.compose import compose
from canzona.plan.types import ExpertPlan, Plan, PlanInputs, PlanSettings


@dataclass(frozen=True)
class ExpertInputs:
    """What `plan_experts` reads: the grid, and per EP rank its params' inventory indices and the
    planners' inputs for its expert buffer (``dp`` = expert-DP, ``tp`` = expert-TP)."""

    layout: ExpertLayout
    index: tuple[tuple[int, ...], ...]
    inputs: tuple[PlanInputs, ...]
    bucket_size: int


def local_experts(params: Sequence[ParamSpec], ep: int) -> list[tuple[int, ...]]:
    """Per EP rank, the inventory indices of the expert matrices it holds, in inventory order:
    EP rank r holds experts ``r·E/ep .. (r+1)·E/ep - 1`` of every layer (Megatron's
    ``local_expert_indices_offset``)."""
    experts = [p.expert for p in params if p.expert is not None]
    if not experts:
        return []
    per_rank = (max(experts) + 1) // ep
    out: list[list[int]] = [[] for _ in range(ep)]
    for i, p in enumerate(params):
        if p.expert is not None:
            out[p.expert // per_rank].append(i)
    return [tuple(x) for x in out]


def expert_inputs(params: Sequence[ParamSpec], layout: ExpertLayout, bucket_size: int, cost: dict[int, float],
                  cost_model: str, matrix_optimizer: bool, settings: PlanSettings) -> ExpertInputs | None:
    """The expert planning problem of an inventory (None when it has no experts); ``cost``:
    inventory index -> full-tensor update cost of at least every expert matrix."""
    index = local_experts(params, layout.ep)
    if not index:
        return None
    inputs = []
    for mine in index:
        local = tuple(params[i] for i in mine)
        buffer = build_layout(list(local), dp=layout.edp, tp=layout.etp, bucket_size=bucket_size)
        inputs.append(PlanInputs(local, buffer, {k: cost[i] for k, i in enumerate(mine)}, cost_model,
                                 matrix_optimizer, settings))
    return ExpertInputs(layout, tuple(index), tuple(inputs), bucket_size)


def _key(inputs: PlanInputs) -> tuple:
    """What a plan depends on: shapes, splits, kinds and costs in order (not names)."""
    return (tuple((p.shape, p.tp_dim, p.kind, tuple(s.shape for s in p.subs)) for p in inputs.params),
            tuple(inputs.cost[k] for k in range(len(inputs.params))))


def plan_experts(ei: ExpertInputs, dp: str, tp: str) -> ExpertPlan:
    """Every EP rank's expert buffer planned by DP strategy ``dp`` with TP strategy ``tp``."""
    t0 = time.perf_counter()
    done: dict[tuple, Plan] = {}
    plans = []
    for inputs in ei.inputs:
        key = _key(inputs)
        if key not in done:
            done[key] = compose(inputs, dp, tp)
        plans.append(replace(done[key], params=inputs.params))  # same plan, this EP rank's names
    return ExpertPlan(ei.layout, ei.index, tuple(plans), ei.bucket_size, time.perf_counter() - t0)
