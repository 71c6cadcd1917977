"""Lowering an MoE plan: one rank's dense program and its EP rank's expert program as one (pure).

Megatron keeps an MoE model's experts in a buffer of their own, reduced over the expert-data-
parallel group, and steps them with an optimizer of their own chained after the dense one
(``ChainedOptimizer``: one gradient norm over both, then the dense step, then the expert step).
The expert buffer's plan (`canzona.plan.types.ExpertPlan`) is a `Plan` like the dense one, over
the expert grid (its ``dp`` the expert-DP size, its ``tp`` the expert-TP size), so it is lowered
by the same `canzona.program.lower._Lowering`, and its actions are then moved into the rank's one
index space and buffer (`canzona.plan.experts.RankSpace`): param indices after the dense ones,
buffer offsets after the dense buffer, buckets after the dense buckets, tags prefixed
``expert``, and the DP / TP collectives onto the ``edp`` / ``etp`` groups. What the two share is
built here, once for the rank:

- one forward (the two overlapped parameter-gather chains' waits), one backward whose bucket
  hooks issue both buffers' reductions, one wait for all of them;
- one gradient norm: each rank counts every element it holds once over the *world* (a buffer
  every DP rank holds whole counts on its first DP rank only; replicated params on TP rank 0
  only), one all-reduce over the world, one clip of everything either step reads;
- the dense step, then the expert step, one copy of the main params into the model;
- both parameter syncs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from canzona.layout import RankLayout
from canzona.plan.experts import RankSpace, rank_space
from canzona.program.actions import (
    Action,
    Apply,
    Backward,
    BucketGather,
    BucketHook,
    BucketReduce,
    ClipScale,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GatherWait,
    GradNorm,
    GramCompute,
    Mark,
    NormReduce,
    OwnedParamsGather,
    Program,
    Ranges,
    TpAllGather,
    TpGather,
    TpScatter,
    Wait,
)

TAG = "expert "  # prefix of every expert action's tag


class _Shift:
    """Moves expert actions into the rank space; each action object is moved once and the moved
    one shared, as the lowering shares actions between ranks."""

    def __init__(self, space: RankSpace, dense_dp: int):
        self.p, self.r, self.b = space.dense_params, space.dense_numel, space.dense_buckets
        self.dense_dp = dense_dp
        self._done: dict[int, tuple[Action, Action]] = {}

    def items(self, items: Sequence[int]) -> tuple[int, ...]:
        return tuple(i + self.p for i in items)

    def ranges(self, ranges: Ranges) -> Ranges:
        return tuple((a + self.r, b + self.r) for a, b in ranges)

    def __call__(self, a):
        if a is None:
            return None
        hit = self._done.get(id(a))
        if hit is not None:
            return hit[1]
        moved = self._move(a)
        self._done[id(a)] = (a, moved)  # the original is held too, so that its id is not reused
        return moved

    def all(self, actions: Sequence[Action]) -> tuple[Action, ...]:
        return tuple(self(a) for a in actions)

    def _move(self, a):
        kind = type(a)
        if kind is BucketReduce:
            return replace(a, tag=TAG + a.tag, bucket=a.bucket + self.b, start=a.start + self.r, end=a.end + self.r,
                           ranges=None if a.ranges is None else self.ranges(a.ranges), axis="edp",
                           average_over=self.dense_dp)
        if kind is BucketGather:
            return replace(a, tag=TAG + a.tag, bucket=a.bucket + self.b, ranges=self.ranges(a.ranges), axis="edp")
        if kind is OwnedParamsGather:
            return replace(a, tag=TAG + a.tag, owned=tuple(self.items(o) for o in a.owned), axis="edp")
        if kind is TpGather or kind is TpAllGather or kind is GramCompute:
            return replace(a, tag=TAG + a.tag, items=self.items(a.items), axis="etp")
        if kind is TpScatter:
            return replace(a, tag=TAG + a.tag, source=TAG + a.source, items=self.items(a.items), axis="etp")
        if kind is Compute:
            return replace(a, tag=TAG + a.tag, items=self.items(a.items),
                           source=None if a.source is None else TAG + a.source)
        if kind is Apply:
            return replace(a, tag=TAG + a.tag, items=self.items(a.items), source=TAG + a.source,
                           slice_tp=self.items(a.slice_tp))
        if kind is Elementwise:
            return replace(a, tag=TAG + a.tag, ranges=self.ranges(a.ranges))
        if kind is Wait:
            return replace(a, tags=tuple(TAG + t for t in a.tags), label=TAG + a.label if a.label else a.label)
        if kind is GatherWait:
            return replace(a, param=a.param + self.p, tag=TAG + a.tag, then=self(a.then))
        if kind is BucketHook:
            return replace(a, bucket=a.bucket + self.b, issue=self.all(a.issue))
        raise TypeError(f"an expert program has no {kind.__name__} of its own to move")


class MoeLowering:
    """Rank-independent facts of an MoE plan: the dense lowering and one per EP rank's plan.
    ``lowering`` is the class that lowers one `Plan` (`canzona.program.lower`, which calls this)."""

    def __init__(self, plan, lowering: Callable[..., Any]):
        self.plan = plan
        self.dense = lowering(plan)
        self.layout = plan.experts.layout
        self.grid = RankLayout(plan.dp, plan.tp, self.layout)
        # one lowering per distinct expert plan (EP ranks of equal experts share one)
        by_id: dict[int, Any] = {}
        self.experts = [by_id.setdefault(id(p), lowering(replace(p, execution=plan.execution), reduce_alone=plan.dp > 1))
                        for p in plan.experts.plans]
        self._shift: dict[int, _Shift] = {}

    def shift(self, ep_rank: int, rank: int) -> _Shift:
        """The mover into the space of ``rank``, whose EP rank is ``ep_rank`` (one per EP rank)."""
        if ep_rank not in self._shift:
            self._shift[ep_rank] = _Shift(rank_space(self.plan, rank), self.plan.dp)
        return self._shift[ep_rank]

    def program(self, rank: int) -> Program:
        dense = self.dense
        d, t = dense.grid.coords(rank)
        ed, e, et = self.layout.coords(rank)
        low = self.experts[e]
        mv = self.shift(e, rank)
        ex = self.plan.execution

        # forward and backward: one of each, both buffers' hooks and reductions
        dense_fb = dense._once(("through_backward", d), lambda: tuple(dense._through_backward(d)))
        expert_fb = low._once(("through_backward", ed), lambda: tuple(low._through_backward(ed)))
        out: list[Action] = []
        forwards = [a for a in dense_fb if isinstance(a, Forward)]
        backwards = [a for a in dense_fb if isinstance(a, Backward)]
        e_first = next(a for a in expert_fb if isinstance(a, Forward))
        e_last = [a for a in expert_fb if isinstance(a, Backward)][-1]
        for k, f in enumerate(forwards):
            waits = f.waits + (mv.all(e_first.waits) if k == 0 else ())
            out.append(Forward(waits, f.micro))
            b = backwards[k]
            out.append(replace(b, hooks=b.hooks + mv.all(e_last.hooks)) if b.last else b)
        for part, shift in ((dense_fb, None), (expert_fb, mv)):  # reductions outside hooks, waits, re-gathers
            for a in part:
                if not isinstance(a, (Forward, Backward)):
                    out.append(a if shift is None else shift(a))

        # the step: one norm and clip over both, the dense step, then the expert step
        d_step = dense.step(d, t)
        e_local = low.step(ed, et)
        e_step = mv.all(e_local)
        out += [*dense.step_barrier(), Mark("step_start")]
        if ex.clip_grad > 0:
            counted = _world_norm_ranges(dense, d, t) + mv.ranges(_world_norm_ranges(low, ed, et))
            read = dense._read_ranges(d_step) + mv.ranges(low._read_ranges(e_local))
            out += [GradNorm("grad norm", counted, dtype=ex.clip_norm_dtype),
                    NormReduce("grad norm reduce", "world", dtype=ex.clip_norm_dtype),
                    Wait(("grad norm reduce",), "clip_grad", "grad norm"),
                    ClipScale("clip", "grad norm reduce", ex.clip_grad, read)]
        out += [*d_step, *e_step]
        main = dense.main_ranges(d_step) + mv.ranges(low.main_ranges(e_local))
        if dense.bf16 and main:
            out.append(CopyToModel("copy main->model", main))
        out.append(Mark("step_end"))

        # the parameter syncs (overlapped: each chain's first gather; else every gather, one wait each)
        out += dense._once(("param_sync", d), lambda: tuple(dense.param_sync(d)))
        out += mv.all(low._once(("param_sync", ed), lambda: tuple(low.param_sync(ed))))
        drain = dense._once(("drain", d), lambda: dense.drain(d)) + mv.all(low._once(("drain", ed), lambda: low.drain(ed)))
        prologue = (dense._once(("prologue", d), lambda: dense.prologue(d))
                    + mv.all(low._once(("prologue", ed), lambda: low.prologue(ed))))
        items = dense.matrix_items(d, t) + mv.items(low.matrix_items(ed, et))
        return Program(rank, d, t, self.plan.dp, self.plan.tp, tuple(out), drain, prologue, items, main,
                       dense.param_dtype, experts=self.layout)


def _world_norm_ranges(low, d: int, t: int) -> Ranges:
    """What rank (d, t) of ``low``'s grid counts in a norm summed over the world: its shards, or,
    when every DP rank holds the whole buffer, the buffer on DP rank 0 only; without replicated
    params on TP ranks other than 0."""
    if d != 0 and (low.full_grads or low.plan.shard_ranges is None):
        return ()
    return low._norm_ranges(d, t)

