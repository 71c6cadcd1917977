"""Plan metrics as a counting pass over the per-rank programs (pure).

Per rank: the optimizer compute it runs (cost-model units: each `Compute` item's full-tensor
cost, and for `Elementwise` ranges the covered fraction of each parameter's cost), the
optimizer-state elements it holds (a full matrix for each computed matrix, each covered element
for elementwise ranges), the bytes it sends and receives over its links per iteration (ring /
chain volumes of every call, `Call.wire_elems`) and the number of collective calls it makes.

Imbalance (max rank load ÷ the work counted once ÷ ranks) therefore charges redundant work to
the method that does it: `sync` on T TP ranks computes every matrix on every rank.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from canzona.layout import RankLayout
from canzona.optim.definitions import muon_gram_share
from canzona.plan.critical_path import lower_bound
from canzona.plan.experts import RankSpace, rank_space
from canzona.program.actions import (
    DTYPE_BYTES,
    TRANSFER_TYPES,
    Apply,
    Backward,
    ClipScale,
    Comm,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GradNorm,
    GramCompute,
    Mark,
    Program,
    Wait,
    dispatch_table,
)


@dataclass(frozen=True)
class PlanMetrics:
    compute: np.ndarray  # [dp, tp] load in cost units
    numel: np.ndarray  # [dp, tp] optimizer-state elements held
    compute_imbalance: float
    memory_imbalance: float
    lower_bound: float
    send_bytes: np.ndarray  # [dp, tp] per iteration
    recv_bytes: np.ndarray
    collectives: int  # most collective calls any rank makes per iteration

    def ranks(self) -> list[dict[str, float | int]]:
        """One row per rank, in rank order."""
        grid = RankLayout(*self.compute.shape)
        return [
            {
                "dp_rank": d,
                "tp_rank": t,
                "compute": float(self.compute[d, t]),
                "numel": int(self.numel[d, t]),
                "send_bytes": int(self.send_bytes[d, t]),
                "recv_bytes": int(self.recv_bytes[d, t]),
            }
            for d, t in map(grid.coords, range(grid.world))
        ]

    def imbalance(self) -> dict[str, float]:
        return {"compute": self.compute_imbalance, "memory": self.memory_imbalance, "lower_bound": self.lower_bound}


class _Slots:
    """Which parameter each buffer element belongs to (for elementwise ranges), and each
    parameter's spec and cost, in one rank's index space (`canzona.plan.experts.RankSpace`: an
    MoE rank's experts after the dense params)."""

    def __init__(self, plan, rank: int = 0):
        space = rank_space(plan, rank)
        self.params = space.params
        self.cost = _space_costs(plan, space)
        slots = sorted((s for b in space.layout.buckets for s in b.params), key=lambda s: s.start)
        self.starts = [s.start for s in slots]
        self.slots = slots

    def overlaps(self, lo: int, hi: int):
        k = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while k < len(self.slots) and self.slots[k].start < hi:
            s = self.slots[k]
            n = min(hi, s.end) - max(lo, s.start)
            if n > 0:
                yield s.index, n
            k += 1


def _wire_bytes(a, sizes: dict[str, int]) -> tuple[tuple[float, float], ...]:
    """(sent, received) bytes of each of an action's own calls, in order."""
    out = []
    for c in a.calls():
        s, r = c.wire_elems(sizes[c.axis])
        width = DTYPE_BYTES[c.dtype]
        out.append((s * width, r * width))
    return tuple(out)


def _space_costs(plan, space: RankSpace) -> dict[int, float]:
    if space.ep_rank is None:
        return plan.cost
    expert = plan.experts.plans[space.ep_rank]
    return {**plan.cost, **{space.dense_params + k: c for k, c in expert.cost.items()}}


# An action's counts: (work, wire). ``work``: its optimizer work as the terms `count_program`
# adds, in its order -- a `Compute`'s (cost, state elements) of its items, an `Elementwise`'s
# covered fraction of each parameter's cost and the elements covered. ``wire``: `_wire_bytes` of
# every call it makes, in `Program.calls` order (a forward: the gathers its hooks issue; a
# backward: its own calls, then its bucket hooks').
Counts = tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]


class _Counter:
    """`count`: an action's `Counts` on one rank, kept per action object (the lowering shares
    actions between ranks, and so between the programs one counter reads)."""

    def __init__(self, slots: _Slots, sizes: dict[str, int], memo: dict[int, tuple]):
        self.slots, self.sizes, self.memo = slots, sizes, memo

    def count(self, a) -> Counts:
        hit = self.memo.get(id(a))
        if hit is not None:
            return hit[1]
        counts = self._COUNT[type(a)](self, a)
        self.memo[id(a)] = (a, counts)  # the action is held too, so that its id is not reused meanwhile
        return counts

    def _forward(self, a: Forward) -> Counts:
        return (), tuple(p for comm in a.issues() for p in self.count(comm)[1])

    def _backward(self, a: Backward) -> Counts:
        return (), _wire_bytes(a, self.sizes) + tuple(p for h in a.hooks for comm in h.issue for p in self.count(comm)[1])

    def _comm(self, a: Comm) -> Counts:
        return (), _wire_bytes(a, self.sizes)

    def _compute(self, a: Compute) -> Counts:
        cost, params = self.slots.cost, self.slots.params
        return ((sum(cost[i] for i in a.items), sum(params[i].numel for i in a.items)),), ()

    def _gram(self, a: GramCompute) -> Counts:
        """A TP shard's Newton–Schulz: its share of each matrix's cost (`muon_gram_share`: about
        1/TP, the Gram's polynomial whole on every rank), the shard's state, and the
        all-reduces inside."""
        cost, params = self.slots.cost, self.slots.params
        work = tuple((cost[i] * muon_gram_share([s for _, s in params[i].matrices], params[i].tp_dim, a.tp, a.steps),
                      params[i].numel // a.tp) for i in a.items)
        return work, _wire_bytes(a, self.sizes)

    def _elementwise(self, a: Elementwise) -> Counts:
        cost, params = self.slots.cost, self.slots.params
        return tuple((cost[i] * n / params[i].numel, n) for lo, hi in a.ranges for i, n in self.slots.overlaps(lo, hi)), ()

    def _nothing(self, a) -> Counts:
        """Waits, marks and the host work the metrics do not count."""
        return (), ()

    _COUNT = dispatch_table({
        Forward: _forward, Backward: _backward, TRANSFER_TYPES: _comm, Compute: _compute, GramCompute: _gram,
        Elementwise: _elementwise,
        (Wait, Mark, Apply, GradNorm, ClipScale, CopyToModel): _nothing,
    })


def count_program(plan, program: Program, slots: _Slots | None = None,
                  _memo: dict[int, tuple] | None = None) -> tuple[float, float, float, float, int]:
    """(compute, state elements, sent bytes, received bytes, calls) of one rank's program."""
    slots = slots or _Slots(plan, program.rank)
    grid = plan.rank_layout
    counter = _Counter(slots, {axis: grid.size(axis) for axis in grid.axes}, {} if _memo is None else _memo)
    compute = numel = 0.0
    sent = recv = 0.0
    calls = 0
    for a in program.actions:
        work, pairs = counter.count(a)
        for c, n in work:
            compute += c
            numel += n
        calls += len(pairs)  # every call in `Program.calls` order, summed in it
        for s, r in pairs:
            sent += s
            recv += r
    return compute, numel, sent, recv, calls


def count_programs(plan, programs: Sequence[Program]) -> PlanMetrics:
    dp, tp = plan.dp, plan.tp
    compute = np.zeros((dp, tp))
    numel = np.zeros((dp, tp))
    send = np.zeros((dp, tp))
    recv = np.zeros((dp, tp))
    calls = 0
    spaces: dict[int | None, _Slots] = {}  # per EP rank (an MoE plan), else one
    memo: dict[int, tuple] = {}  # actions are shared between ranks
    done: dict[tuple[int, ...], tuple] = {}  # and whole programs' action lists, between TP ranks
    for prog in programs:
        same = tuple(map(id, prog.actions))  # the same objects in the same order: the same sums
        counted = done.get(same)
        if counted is None:
            ep_rank = plan.experts.layout.coords(prog.rank)[1] if plan.experts is not None else None
            if ep_rank not in spaces:
                spaces[ep_rank] = _Slots(plan, prog.rank)
            counted = done[same] = count_program(plan, prog, spaces[ep_rank], memo)
        c, n, s, r, k = counted
        d, t = prog.dp_rank, prog.tp_rank
        compute[d, t], numel[d, t], send[d, t], recv[d, t] = c, n, s, r
        calls = max(calls, k)
    ranks = plan.rank_layout.world
    ideal = (sum(plan.cost.values()) + _expert_total(plan, lambda p: sum(p.cost.values()))) / ranks
    total_numel = sum(p.numel for p in plan.params) + _expert_total(plan, lambda p: sum(s.numel for s in p.params))
    return PlanMetrics(
        compute=compute,
        numel=numel,
        compute_imbalance=float(compute.max() / ideal) if ideal else 1.0,
        memory_imbalance=float(numel.max() / (total_numel / ranks)),
        lower_bound=lower_bound(plan),
        send_bytes=send,
        recv_bytes=recv,
        collectives=calls,
    )


def _expert_total(plan, of) -> float:
    """``of`` summed over every EP rank's expert plan: each expert counted once (0: a dense plan)."""
    return 0.0 if plan.experts is None else sum(of(p) for p in plan.experts.plans)


def compute_metrics(plan) -> PlanMetrics:
    """Lower every rank's program and count it."""
    from canzona.program.lower import lower

    return count_programs(plan, lower(plan))

