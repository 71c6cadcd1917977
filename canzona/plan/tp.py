"""Tensor-parallel micro-group scheduling (pure), docs/design.md §3.2.

Input: the TP-sharded matrices one DP rank owns, with their costs, and the TP size T.
Output: an ordered list of micro-groups; each group maps its matrices to owner TP ranks. The
executor runs one gather -> compute -> scatter round per group, pipelined.

What a schedule is judged by is its *critical path* (`canzona.plan.critical_path`): the TP ranks
of a group compute in parallel and the group ends with its slowest owner, so a DP rank's step
takes the sum over its groups of the slowest TP rank's load. Per-rank totals can be perfect
while the TP ranks take turns (one matrix per group), which costs up to T times the work.

Capacity is a *fraction of the per-rank ideal load* (the DP rank's TP work / T), so it means
the same under every cost model (numel, flops, seconds). The authors' default of 400·2²⁰ numel
is a fixed size in one model's units; a fraction travels across cost models and model sizes.

Modes:
- ``rounds`` (default): balanced rounds. The matrices are first dealt to the T TP ranks by LPT
  (or kept on the owners a joint DP×TP balance chose, ``hint``), so every TP rank's total is
  balanced; then each TP rank's matrices are split by LPT into k bins and the j-th largest bins
  of all TP ranks form round j. Every round thus gives every TP rank about 1/T of its load, and
  the critical path is the sum of the rounds' slowest bins. *Capacity rule*: k is at most
  ⌈1/capacity⌉ (about 8 rounds at 0.125) and at most the fewest matrices any TP rank holds, so
  every TP rank has at least one matrix in every round and a large matrix never forces a
  one-matrix group; of the k from that cap down to 1, the largest whose critical path is within
  ``ROUND_SLACK`` (1 %) of a single round's is taken -- one round has the shortest critical path
  (the largest TP total), more rounds let the pipeline hide communication, and matrices too
  coarse to split evenly (8B on TP8: two or three per TP rank) get fewer rounds rather than
  idle TP ranks. *Order*: rounds run largest first. At pipeline depth D the gathers of the next
  D rounds and the scatter of the previous one travel while a round computes. A round's
  transfers scale with its elements and its compute with its cost, in about the same ratio for
  all of a model's matrices, so what keeps neighbours' transfers behind compute is that no
  round is much smaller than the ones around it: a tiny group next to a large one cannot cover
  its neighbours' transfers with its short compute. A DP rank's rounds are near equal (each TP
  rank's bins are an LPT split), so a round's compute covers its neighbours' transfers
  whenever it would cover its own; then only the first gather and the last scatter are
  exposed, and run in non-increasing size the last scatter is the smallest round's. Starting with a tiny round does not help: at depth 2
  the second round's gather is then exposed instead of the first's. (A geometric ramp of sizes
  would, but its ratio is the machine's compute/communication speed, which a plan in cost units
  does not know.)
- ``global``: greedy rollback, the paper's rule (ablation) -- sort by cost, grow the group one
  matrix at a time, re-run LPT of the group over T ranks, and when the group's mean or max
  per-rank load would exceed the capacity roll the last matrix back and close the group. LPT
  ties go to the rank with the least accumulated load so far. When one matrix exceeds the
  capacity every group holds a single matrix and the TP ranks take turns.
- ``slot``: one global LPT (heap) over all matrices; a group closes when its largest slot reaches
  the capacity.
- ``single``: sorted by cost, chunks of T, i-th largest of a chunk to rank i.
- ``none``: registration order, round-robin owners, chunks of T (ablation baseline).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

# rounds: how much longer than one round's the critical path may get to allow more rounds
ROUND_SLACK = 0.01


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

    ``hint`` (``rounds`` and ``global``): TP owners already chosen by a joint DP×TP balance; the
    groups keep those owners (``rounds`` builds its rounds from them, ``global`` grows and closes
    groups by the same capacity rule without re-running LPT inside each group).
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
    if mode == "rounds":
        return _rounds(by_cost, cost, tp, capacity, hint)
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


def _lanes(by_cost: list[int], cost: dict[int, float], tp: int, hint: dict[int, int] | None) -> list[list[int]]:
    """Each TP rank's matrices (cost descending): the hinted owners, else LPT over the TP ranks
    (ties to the rank holding fewer matrices, then the lowest)."""
    lanes: list[list[int]] = [[] for _ in range(tp)]
    if hint is not None:
        for i in by_cost:
            lanes[hint[i]].append(i)
        return lanes
    heap = [(0.0, 0, t) for t in range(tp)]  # (load, matrices, rank)
    for i in by_cost:
        load, n, t = heapq.heappop(heap)
        lanes[t].append(i)
        heapq.heappush(heap, (load + cost[i], n + 1, t))
    return lanes


def _split_lane(lane: list[int], cost: dict[int, float], k: int) -> list[tuple[float, list[int]]]:
    """LPT of one TP rank's matrices (cost descending) into k bins; bins by load descending.
    With at least k matrices every bin gets one (ties go to the bin holding fewer)."""
    heap = [(0.0, 0, b) for b in range(k)]  # (load, matrices, bin)
    bins: list[list[int]] = [[] for _ in range(k)]
    loads = [0.0] * k
    for i in lane:
        load, n, b = heapq.heappop(heap)
        bins[b].append(i)
        loads[b] = load + cost[i]
        heapq.heappush(heap, (loads[b], n + 1, b))
    return sorted(zip(loads, bins), key=lambda lb: (-lb[0], lb[1][0] if lb[1] else -1))


def _round_plan(lanes: list[list[int]], cost: dict[int, float], k: int) -> tuple[float, list[list[list[int]]]]:
    """k rounds: every lane split into k bins, the j-th largest bins of all lanes form round j
    (pairing sorted bins minimises Σ_j max over lanes for the given splits; it also makes the
    rounds' slowest bins non-increasing, the order they run in). Returns the critical path
    (Σ over rounds of the slowest lane) and, per round, each lane's matrices."""
    split = [_split_lane(lane, cost, k) for lane in lanes]
    path = sum(max(s[j][0] for s in split) for j in range(k))
    return path, [[s[j][1] for s in split] for j in range(k)]


def _rounds(
    by_cost: list[int], cost: dict[int, float], tp: int, capacity: float, hint: dict[int, int] | None
) -> list[MicroGroup]:
    """Balanced rounds; see the module docstring."""
    lanes = _lanes(by_cost, cost, tp, hint)
    k_max = max(1, min(math.ceil(1.0 / capacity - 1e-9), min(len(lane) for lane in lanes)))
    best_path, best = _round_plan(lanes, cost, 1)
    for k in range(k_max, 1, -1):
        path, plan = _round_plan(lanes, cost, k)
        if path <= (1.0 + ROUND_SLACK) * best_path:
            best = plan
            break
    groups = []
    for bins in best:
        pairs = sorted(((i, t) for t, b in enumerate(bins) for i in b), key=lambda it: (-cost[it[0]], it[0]))
        groups.append(MicroGroup(tuple(i for i, _ in pairs), tuple(t for _, t in pairs)))
    return groups
