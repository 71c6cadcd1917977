"""Data-parallel partitioning of the bucketed buffer into per-rank shards (pure).

A DP plan gives, for every bucket, P+1 absolute cut offsets: rank r owns the elements
``[cuts[r], cuts[r+1])`` of the buffer. Three plans are built here:

- ``equal_cuts``: Megatron's ZeRO-1 (``bucket / P`` each), which may cut params in pieces.
- ``atomic_cuts``: the paper's fallback; each param goes to the rank whose equal shard holds its
  first element, shard ends stretched to param boundaries.
- ``alpha_cuts``: α-balanced static partitioning (docs/design.md §3.1), in two variants:
  ``snap`` -- the paper's rule: visit buckets from largest to smallest, blend an equal split with
  a deficit-proportional (greedy) split, and snap the running sum to the nearest param boundary;
  ``minmax`` -- this project's refinement: for each bucket choose the contiguous in-order split
  that *minimises the maximum blended load* exactly (bisection on the bound + greedy prefix
  feasibility). It fixes the cases where snapping fails, e.g. a bucket holding one large matrix:
  snapping gives it to whichever rank's cut it is nearest, minmax to the least-loaded rank
  (which is exactly LPT when buckets hold one matrix each).

- ``joint_lpt_owners``: for α = 1, LPT over all params onto DP×TP bins, each DP rank's part of
  a bucket kept one contiguous range (``ranges_from_owners`` turns it into shard ranges).

The blended load for α: a rank's load is ``α·cost/total_cost + (1-α)·elements/bucket_elements``
accumulated over buckets for the cost part and per bucket for the element part, so α = 1
balances the chosen cost model across the whole step and α = 0 makes each bucket's shards as
equal as the boundaries allow (what the reduce-scatter and memory care about).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from canzona.inventory import ParamSpec
from canzona.plan.buckets import Bucket, BucketPart, BufferLayout, ParamSlot, Ranges, build_layout

Cuts = tuple[int, ...]


def equal_cuts(layout: BufferLayout) -> list[Cuts]:
    p = layout.dp
    return [tuple(b.start + r * (b.numel // p) for r in range(p)) + (b.end,) for b in layout.buckets]


def boundaries(bucket: Bucket) -> list[int]:
    """Allowed cut positions: the bucket's start, every param's start, the bucket's end.

    Cutting at a param's start (rather than the previous param's end) gives the alignment
    padding in between to the earlier shard; either way no param is split.
    """
    return [bucket.start] + [s.start for s in bucket.params[1:]] + [bucket.end]


def atomic_cuts(layout: BufferLayout) -> list[Cuts]:
    p = layout.dp
    plans = []
    for bucket, eq in zip(layout.buckets, equal_cuts(layout)):
        cuts = [bucket.start]
        bounds = boundaries(bucket)
        # Rank r owns the params whose first element lies in its equal shard, so its end cut is
        # the first boundary at or after the end of its equal shard.
        for r in range(1, p):
            cuts.append(max(cuts[-1], bounds[bisect.bisect_left(bounds, eq[r])]))
        cuts.append(bucket.end)
        plans.append(tuple(cuts))
    return plans


def owners_from_ranges(layout: BufferLayout, ranges: Sequence[Ranges]) -> dict[int, int]:
    """inventory index -> DP rank, for plans that never cut a param."""
    owners = {}
    for bucket, rr in zip(layout.buckets, ranges):
        nonempty = sorted((a, b, r) for r, (a, b) in enumerate(rr) if b > a)
        starts = [a for a, _, _ in nonempty]
        for slot in bucket.params:
            a, b, r = nonempty[bisect.bisect_right(starts, slot.start) - 1]
            assert a <= slot.start and slot.end <= b, f"param {slot.index} is cut by the plan"
            owners[slot.index] = r
    return owners


def _bucket_order(layout: BufferLayout, cost: dict[int, float]) -> list[int]:
    """Largest bucket first (by the cost it carries), ties by index: rank-independent."""
    return sorted(range(len(layout.buckets)), key=lambda i: (-sum(cost[s.index] for s in layout.buckets[i].params), i))


def _blend(bucket: Bucket, bounds: list[int], cost: dict[int, float], total_cost: float, alpha: float) -> np.ndarray:
    """Per-param blended weight inside one bucket (padding counts as elements)."""
    elems = np.diff(bounds).astype(float)  # param + the padding after it
    costs = np.array([cost[s.index] for s in bucket.params])
    return alpha * costs / total_cost + (1.0 - alpha) * elems / bucket.numel


def _greedy_fill(weights: Sequence[float], offsets: Sequence[float], bound: float) -> list[int] | None:
    """Contiguous in-order split of `weights` over ranks with `offsets[r] + load_r <= bound`.

    Each rank takes as long a prefix of what is left as fits; a rank that cannot fit the next
    item takes nothing. Returns the P+1 cut indices into the item list, or None if infeasible.
    Plain Python floats (the same IEEE doubles as numpy's): buckets hold a handful of params, so
    array calls would cost more than the arithmetic (an MoE expert buffer has hundreds of buckets).
    """
    p, n = len(offsets), len(weights)
    slack = [bound - o for o in offsets]
    tol = 1e-12 * max(abs(bound), 1.0)  # relative: costs can be ~1e14 flops, sums round
    cuts, i, r = [0], 0, 0
    while i < n:
        # ranks (from r) that cannot take item i at all take nothing
        need = weights[i] - tol
        while r < p and slack[r] < need:
            cuts.append(i)
            r += 1
        if r == p:
            return None
        room = slack[r]
        while i < n and weights[i] <= room + tol:
            room -= weights[i]
            i += 1
        cuts.append(i)
        r += 1
        if r == p and i < n:
            return None
    cuts.extend([n] * (p + 1 - len(cuts)))
    return cuts


def minmax_split(weights: np.ndarray, offsets: np.ndarray, rel_tol: float = 1e-9) -> list[int]:
    """Cut indices minimising max_r(offsets[r] + load_r) over contiguous in-order splits."""
    total = float(weights.sum())
    lo = max(float(offsets.min()) + float(weights.max(initial=0.0)), float(offsets.sum() + total) / len(offsets))
    hi = float(offsets.max()) + total
    w, off = weights.tolist(), offsets.tolist()
    best = _greedy_fill(w, off, hi)
    assert best is not None
    at_lo = _greedy_fill(w, off, lo)
    if at_lo is not None:
        return at_lo
    for _ in range(100):
        if hi - lo <= rel_tol * max(hi, 1e-300):
            break
        mid = 0.5 * (lo + hi)
        got = _greedy_fill(w, off, mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return best


def _snap_split(weights: np.ndarray, offsets: np.ndarray, target: float, alpha: float) -> list[int]:
    """The paper's rule: blend equal and deficit-proportional splits, snap running sums."""
    p = len(offsets)
    total = float(weights.sum())
    base = np.full(p, total / p)
    deficit = np.maximum(0.0, target - offsets)
    greedy = deficit / deficit.sum() * total if deficit.sum() > 0 else base
    desired = (1.0 - alpha) * base + alpha * greedy
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    cuts, prev = [0], 0
    for r in range(1, p):
        want = float(desired[:r].sum())
        i = int(np.argmin(np.abs(prefix - want)))
        prev = max(prev, i)
        cuts.append(prev)
    cuts.append(len(weights))
    return cuts


def alpha_cuts(
    layout: BufferLayout, cost: dict[int, float], alpha: float, variant: str = "minmax"
) -> list[Cuts]:
    """α-balanced static partitioning over all buckets; see the module docstring."""
    p = layout.dp
    total_cost = sum(cost[s.index] for b in layout.buckets for s in b.params) or 1.0
    cost_load = np.zeros(p)  # accumulated α-weighted cost share per rank
    result: dict[int, Cuts] = {}
    for bi in _bucket_order(layout, cost):
        bucket = layout.buckets[bi]
        bounds = boundaries(bucket)
        weights = _blend(bucket, bounds, cost, total_cost, alpha)
        if variant == "minmax":
            idx = minmax_split(weights, cost_load)
        else:
            idx = _snap_split(weights, cost_load, float(cost_load.sum() + weights.sum()) / p, alpha)
        cuts = tuple(bounds[i] if i < len(bucket.params) else bucket.end for i in idx)
        result[bi] = cuts
        prefix = np.concatenate([[0.0], np.cumsum([cost[s.index] for s in bucket.params])])
        at = np.asarray(idx)
        cost_load += alpha * (prefix[at[1:]] - prefix[at[:-1]]) / total_cost
    return [result[i] for i in range(len(layout.buckets))]


def joint_lpt_owners(
    layout: BufferLayout, cost: dict[int, float], tp: int, tp_split: dict[int, bool]
) -> tuple[dict[int, int], dict[int, int]]:
    """LPT over all params at once onto DP×TP bins, keeping each DP rank's part of a bucket
    one contiguous range (the padded collectives then move any such shard).

    Params are placed from most to least costly, each on the least-loaded bin among those whose
    DP rank can take it: a rank that holds nothing in the bucket yet, or one whose range can be
    stretched to it without swallowing a param another rank already holds (params in between
    that are not placed yet are then reserved for that rank). A param that is not split over TP
    (``tp_split[i]`` False: norms, shard-local elementwise params) loads every TP bin of its DP
    rank by cost/T. Ties go to the DP rank with the least total, then the lowest (DP, TP) bin,
    so every rank computes the same plan.
    """
    p = layout.dp
    loads = np.zeros((p, tp))
    where = {}  # index -> (bucket, position)
    for b in layout.buckets:
        for k, s in enumerate(b.params):
            where[s.index] = (b.index, k)
    owner_at = [[-1] * len(b.params) for b in layout.buckets]
    reserved = [[-1] * len(b.params) for b in layout.buckets]
    spans: list[dict[int, tuple[int, int]]] = [{} for _ in layout.buckets]  # rank -> (lo, hi) positions
    result: dict[int, int] = {}
    tp_owner: dict[int, int] = {}
    for i in sorted(cost, key=lambda j: (-cost[j], j)):
        b, k = where[i]
        owners, span = owner_at[b], spans[b]
        if reserved[b][k] >= 0:
            allowed = [reserved[b][k]]
        else:
            free = np.ones(p, dtype=bool)
            free[list(span)] = False
            allowed = sorted(np.flatnonzero(free).tolist() + [d for d in span if _extends(owners, reserved[b], span[d], k, d)])
        if tp_split[i]:
            sub = loads[allowed]
            # least-loaded bin; ties to the DP rank with the least total (spreads a bucket's
            # params over DP ranks instead of stacking them, and reservations, on rank 0)
            totals = np.repeat(sub.sum(axis=1), tp)
            flat = int(np.lexsort((totals, sub.ravel()))[0])
            d = allowed[flat // tp]
            tp_owner[i] = flat % tp
            loads[d, flat % tp] += cost[i]
        else:
            d = allowed[int(np.argmin(loads[allowed].max(axis=1)))]
            loads[d] += cost[i] / tp
        lo, hi = span.get(d, (k, k))
        lo, hi = min(lo, k), max(hi, k)
        span[d] = (lo, hi)
        for x in range(lo, hi + 1):
            if owners[x] == -1 and x != k:
                reserved[b][x] = d
        owners[k] = d
        result[i] = d
    return result, tp_owner


def _extends(owners: list[int], reserved: list[int], span: tuple[int, int], k: int, d: int) -> bool:
    lo, hi = min(span[0], k), max(span[1], k)
    return all(owners[x] in (-1, d) and reserved[x] in (-1, d) for x in range(lo, hi + 1))


def ranges_from_owners(layout: BufferLayout, owners: dict[int, int]) -> list[tuple[tuple[int, int], ...]]:
    """Per bucket, each DP rank's (start, end) range from whole-param owners (empty: start == end)."""
    out = []
    for bucket in layout.buckets:
        bounds = boundaries(bucket)
        rng = [(bucket.start, bucket.start)] * layout.dp
        for k, slot in enumerate(bucket.params):
            r = owners[slot.index]
            lo = rng[r][0] if rng[r][1] > rng[r][0] else bounds[k]
            rng[r] = (lo, bounds[k + 1])
        out.append(tuple(rng))
    return out


def ranges_from_cuts(cuts: Sequence[Cuts]) -> list[tuple[tuple[int, int], ...]]:
    return [tuple((c[r], c[r + 1]) for r in range(len(c) - 1)) for c in cuts]


def lpt(weights: Sequence[float], bins: int, order: Sequence[int] | None = None) -> list[int]:
    """Longest-processing-time-first: item -> bin. Ties go to the lowest bin (deterministic)."""
    import heapq

    items = order if order is not None else sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    heap = [(0.0, b) for b in range(bins)]
    owner = [0] * len(weights)
    for i in items:
        load, b = heapq.heappop(heap)
        owner[i] = b
        heapq.heappush(heap, (load + weights[i], b))
    return owner


def subset_buffer(params: Sequence[ParamSpec], indices: Sequence[int], *, dp: int, tp: int, bucket_size: int,
                  cuts: Callable[[BufferLayout], list[Cuts]]) -> tuple[list[BucketPart], dict[int, int]]:
    """The buffer Megatron lays out for the params ``indices`` alone (`build_layout` on them),
    its buckets cut by ``cuts`` at param boundaries: the buckets as parts of a joined buffer
    (`canzona.plan.buckets.join_buffers`) and each param's DP owner, in inventory indices."""
    if not indices:
        return [], {}
    sub = build_layout([params[i] for i in indices], dp=dp, tp=tp, bucket_size=bucket_size)
    ranges = ranges_from_cuts(cuts(sub))
    owners = {indices[k]: r for k, r in owners_from_ranges(sub, ranges).items()}
    parts = [BucketPart(min(indices[s.index] for s in b.params),
                        tuple(ParamSlot(indices[s.index], s.start - b.start, s.end - b.start) for s in b.params),
                        b.numel, tuple((x - b.start, y - b.start) for x, y in rr))
             for b, rr in zip(sub.buckets, ranges)]
    return parts, owners
