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
from canzona.plan.buckets import Bucket, BufferLayout, ParamSlot, build_layout
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


def plan_experts(ei: ExpertInputs, dp_strategy: str, tp_strategy: str) -> ExpertPlan:
    """Every EP rank's expert buffer planned by DP strategy ``dp_strategy`` with TP strategy
    ``tp_strategy``."""
    t0 = time.perf_counter()
    done: dict[tuple, Plan] = {}
    plans = []
    for inputs in ei.inputs:
        key = _key(inputs)
        if key not in done:
            done[key] = compose(inputs, dp_strategy, tp_strategy)
        plans.append(replace(done[key], params=inputs.params))  # same plan, this EP rank's names
    return ExpertPlan(ei.layout, ei.index, tuple(plans), ei.bucket_size, time.perf_counter() - t0)


@dataclass(frozen=True)
class RankSpace:
    """One rank's parameters and flat buffer as its executor holds them: the dense plan's params
    and buffer, then (an MoE model) its EP rank's experts, appended with their indices shifted by
    ``dense_params``, their buffer offsets by ``dense_numel`` and their buckets by
    ``dense_buckets``. The lowering (`canzona.program.experts`) shifts the expert program the
    same way, so that every action addresses one index space and one buffer; only the expert
    buffer's collectives run on other groups (axes ``edp``, ``etp``)."""

    params: tuple[ParamSpec, ...]
    layout: BufferLayout
    dense_params: int
    dense_numel: int
    dense_buckets: int
    ep_rank: int | None = None  # None: a dense model
    expert_tp: int = 1  # the expert-TP size the expert params are split over

    @property
    def chains(self) -> tuple[tuple[int, int], ...]:
        """The bucket ranges whose reductions are issued strictly in order among themselves: the
        dense buffer's and the expert buffer's (each group issues its own in order)."""
        n = len(self.layout.buckets)
        return ((0, self.dense_buckets),) + (((self.dense_buckets, n),) if n > self.dense_buckets else ())

    def split_over(self, index: int, tp: int) -> int:
        """How many ranks param ``index``'s TP dim is split over: ``tp`` (dense), the expert-TP size."""
        return tp if index < self.dense_params else self.expert_tp


def rank_space(plan: Plan, rank: int) -> RankSpace:
    """`RankSpace` of global ``rank`` under ``plan`` (pure)."""
    lay = plan.layout
    if plan.experts is None:
        return RankSpace(plan.params, lay, len(plan.params), lay.numel, len(lay.buckets))
    _, ep_rank, _ = plan.experts.layout.coords(rank)
    eplan = plan.experts.plans[ep_rank]
    n, off, nb = len(plan.params), lay.numel, len(lay.buckets)
    shifted = tuple(
        Bucket(nb + b.index, b.start + off, b.end + off,
               tuple(ParamSlot(s.index + n, s.start + off, s.end + off) for s in b.params))
        for b in eplan.layout.buckets)
    layout = BufferLayout(lay.buckets + shifted, off + eplan.layout.numel, lay.dp, lay.tp)
    return RankSpace(plan.params + eplan.params, layout, n, off, nb, ep_rank, plan.experts.layout.etp)
