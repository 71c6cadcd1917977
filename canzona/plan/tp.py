"""Tensor-parallel micro-group scheduling (pure), DESIGN.md §3.2.

Input: the TP-sharded matrices one DP rank owns, with their costs, and the TP size T.
Output: an ordered list of micro-groups; each group maps its matrices to owner TP ranks. The
executor runs one gather -> compute -> scatter round per group, pipelined.

Capacity is the most one group may put on one TP rank, as a *fraction of the per-rank ideal
load* (the total / T), so it means the same under every cost model (numel, flops, seconds).
The authors' default of 400·2²⁰ numel is a fixed size in one model's units; a fraction travels
across cost models and model sizes (capacity 0.125 gives about 8 groups).

Modes:
- ``global``: greedy rollback -- sort by cost, grow the group one matrix at a time, re-run LPT of
  the group over T ranks, and when the group's mean or max per-rank load would exceed the
  capacity roll the last matrix back and close the group. LPT ties go to the rank with the
  least accumulated load over all groups so far, so small imbalances don't pile up on rank 0.
- ``slot``: one global LPT (heap) over all matrices; a group closes when its largest slot reaches
  the capacity.
- ``single``: sorted by cost, chunks of T, i-th largest of a chunk to rank i.
- ``none``: registration order, round-robin owners, chunks of T (ablation baseline).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MicroGroup:
    items: tuple[int, ...]  # inventory indices, in execution order
    owners: tuple[int, ...]  # TP owner of each item

    def loads(self, cost: dict[int, float], tp: int) -> list[float]:
        out = [0.0] * tp
        for i, o in zip(self.items, self.owners):
            out[o] += cost[i]
        return out


def _lpt_group(items: list[int], cost: dict[int, float], tp: int, base: list[float]) -> tuple[list[int], list[float]]:
    """LPT of `items` (already sorted by cost desc) over tp ranks; ties by accumulated `base`."""
    loads = [0.0] * tp
    owners = []
    for i in items:
        r = min(range(tp), key=lambda t: (loads[t], base[t], t))
        owners.append(r)
        loads[r] += cost[i]
    return owners, loads


def schedule(
    items: list[int], cost: dict[int, float], tp: int, mode: str, capacity: float, hint: dict[int, int] | None = None
) -> list[MicroGroup]:
    """Micro-groups for `items` (inventory indices in registration order).

    ``hint`` (``global`` mode only): owners already chosen by a joint DP×TP balance; groups are
    then grown and closed by the same capacity rule, but keep those owners instead of re-running
    LPT inside each group.
    """
    if not items:
        return []
    by_cost = sorted(items, key=lambda i: (-cost[i], i))
    total = sum(cost[i] for i in items)
    cap = capacity * total / tp
    if mode == "none":
        return [
            MicroGroup(tuple(items[k : k + tp]), tuple(range(len(items[k : k + tp]))))
            for k in range(0, len(items), tp)
        ]
    if mode == "single":
        return [
            MicroGroup(tuple(by_cost[k : k + tp]), tuple(range(len(by_cost[k : k + tp]))))
            for k in range(0, len(by_cost), tp)
        ]
    if mode == "slot":
        return _slot(by_cost, cost, tp, cap)
    if mode == "global":
        return _greedy_rollback(by_cost, cost, tp, cap, hint)
    raise ValueError(f"unknown grouping {mode!r}")


def _slot(by_cost: list[int], cost: dict[int, float], tp: int, cap: float) -> list[MicroGroup]:
    groups: list[MicroGroup] = []
    total_loads = [0.0] * tp
    group_items: list[int] = []
    group_owners: list[int] = []
    group_loads = [0.0] * tp
    for i in by_cost:
        r = min(range(tp), key=lambda t: (total_loads[t], t))
        group_items.append(i)
        group_owners.append(r)
        group_loads[r] += cost[i]
        total_loads[r] += cost[i]
        if max(group_loads) >= cap:
            groups.append(MicroGroup(tuple(group_items), tuple(group_owners)))
            group_items, group_owners, group_loads = [], [], [0.0] * tp
    if group_items:
        groups.append(MicroGroup(tuple(group_items), tuple(group_owners)))
    return groups


def _greedy_rollback(
    by_cost: list[int], cost: dict[int, float], tp: int, cap: float, hint: dict[int, int] | None = None
) -> list[MicroGroup]:
    groups: list[MicroGroup] = []
    base = [0.0] * tp
    if hint is not None:
        def assign(items: list[int], _c: dict[int, float], _t: int, _b: list[float]) -> tuple[list[int], list[float]]:
            loads = [0.0] * tp
            for i in items:
                loads[hint[i]] += cost[i]
            return [hint[i] for i in items], loads
    else:
        assign = _lpt_group
    current: list[int] = []
    k = 0
    while k < len(by_cost):
        trial = current + [by_cost[k]]
        owners, loads = assign(trial, cost, tp, base)
        over = max(loads) > cap or sum(loads) / tp > cap
        if over and current:
            owners, loads = assign(current, cost, tp, base)
            groups.append(MicroGroup(tuple(current), tuple(owners)))
            base = [b + x for b, x in zip(base, loads)]
            current = []
            continue  # retry the rolled-back matrix in a fresh group
        current = trial
        k += 1
    if current:
        owners, _ = assign(current, cost, tp, base)
        groups.append(MicroGroup(tuple(current), tuple(owners)))
    return groups
