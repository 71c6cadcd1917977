"""DP strategies ``layerwise_sharded`` and ``layerwise_sharded_ns``: the layer-wise optimizer of
megatron-core 0.19 and of Megatron-LM's main branch (docs/design.md §1).

**What Megatron does.** megatron-core 0.17+ (read at 0.19.2, ``LayerWiseDistributedOptimizer.
_compute_per_buffer_param_layout``) gives the matrices Muon updates -- 2-D params other than the
embedding and output layer -- a gradient buffer of their own with a *shard-aligned* layout. It
walks them in backprop order (reverse registration order), collecting a chunk until the chunk
holds ``max(bucket_size, int(0.9 * dp * its largest param))`` elements; each chunk becomes one
bucket whose params are dealt to ``dp`` shards by LPT on element count (largest first, stable
in backprop order; each to the shard with the fewest elements so far, ties to the lowest shard;
each param starts at a multiple of 64 within its shard). Every shard is then padded to the
widest, rounded up to ``lcm(64, lcm(dp, 128) / dp)``, so the bucket is ``dp`` equal shards laid
end to end, each the concatenation of the params that shard owns: an even reduce-scatter of
gradients and an even all-gather of params move it, and a param belongs to the DP rank whose
shard holds it. The other params (norms, embedding, output layer: AdamW) go to a separate
buffer under Megatron's ordinary distributed optimizer.

Megatron-LM's main branch (``layerwise_sharded_ns``; read at commit 1d82259e1c, 2026-08-20,
"Balance LayerWise optimizer shards by Newton-Schulz cost" and "Treat LayerWise bucket_size as
a soft minimum") changes the rule twice. The deal: largest Newton-Schulz cost first (a 2-D
param's ``max(m, n) * min(m, n)**2`` on its TP-local shape, otherwise its element count), each to
the shard with the least NS cost accumulated *over all buckets so far*, among the shards whose
element count stays within 1.3x the chunk's mean per shard (none fits: the shard with the fewest
elements). The bucket closing: ``bucket_size`` becomes a soft minimum -- once the chunk holds the
threshold above, a param still joins it if it fits into the least-loaded shard's padding (an
element-count estimate placed in backprop order) and only a param that would widen the bucket
opens a new one. 0.19.2 has neither (its deal is LPT on numel), hence two strategies rather than
a ``planner`` option: each is one rule of one Megatron version.

**What the harness runs.** `shard_aligned_buckets` is the rule above on element counts (and,
for main's, shapes), pure; `assign` applies it to a `PlanInputs` and gives each param's DP owner
and Megatron's buckets. Every harness method reduces the *same* buffer (`canzona.plan.buckets`,
megatron-core 0.16's layout, one buffer in reverse registration order), whose shard ranges are
one contiguous range per DP rank and bucket (`canzona.plan.types.DpLayout`). 0.19's shards are
not contiguous there -- LPT reorders a bucket's params by owner -- so the lowering cannot express
0.19's reduce-scatter on that buffer without cutting a matrix. The candidate layout is therefore
0.19's *owners* with the collectives that carry any ownership on the shared buffer: gradients
all-reduced, each rank's updated params all-gathered packed and padded to the widest
(``param_sync="owned_params"``, as ``layerwise``). Owners -- hence the optimizer step and its
balance -- are Megatron's exactly (tests/unit/test_mirror_owners.py holds them to megatron's own
function); the gradient reduction moves an all-reduce's volume, 2(P-1)/P of the buffer per rank,
where 0.19's reduce-scatter moves (P-1)/P of its padded buffer. `aligned_layout` builds 0.19's
own buffer (its buckets, padding and per-shard order as a `BufferLayout`, with its equal shard
ranges) for the day a `DpLayout` may carry a buffer of its own; with it the layout would be
``DpLayout("reduce_scatter", "shards", equal ranges, owners)`` and every collective even.

The AdamW params Megatron keeps in its other buffer (norms, the embedding and output layer),
which Megatron's distributed optimizer shards elementwise, are given whole owners here (the
lowering needs every param owned under ``owned_params``): largest first, each to the rank that
holds the fewest elements so far, the matrices counted, so that optimizer state stays even.

The bucket size is not among the planner's inputs; `bucket_size_of` recovers it from the shared
buffer's bucket boundaries (an interval of sizes that give them), preferring Megatron's default
``max(4e7, 1e6 * dp)``, else the roundest size in the interval. It is exact for the default and
for any round ``bucket.size``, and a one-bucket buffer needs no exact size (`bucket_size_of`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from canzona.inventory import ParamSpec
from canzona.plan.buckets import PARAM_ALIGN, Bucket, BufferLayout, ParamSlot
from canzona.plan.types import DpLayout, PlanInputs

NAME = "layerwise_sharded"
SUMMARY = ("megatron-core 0.19's layer-wise optimizer: whole matrices dealt per shard-aligned bucket by LPT on numel; "
           "all-reduce on the shared buffer; padded all-gather of the owned params")
RUNG = None
ELEMENTWISE_ONLY = False

PADDING_FLOOR = 0.9  # Megatron's: a bucket holds at least 0.9 x dp x its largest param
NUMEL_EPSILON = 0.3  # main's cap: a shard holds at most 1.3 x the chunk's mean per shard
RULES = ("0.19", "main")


@dataclass(frozen=True)
class AlignedBucket:
    """One shard-aligned bucket: ``dp`` equal shards of ``shard`` elements from ``start``.

    ``members``: (position in the input list, start, end, shard) of each param, in buffer order
    (shard by shard, within a shard in the order the deal placed them)."""

    start: int
    end: int
    shard: int
    members: tuple[tuple[int, int, int, int], ...]


def _pad(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


def shard_divisor(dp: int, pad_for_high_nccl_busbw: bool = False) -> int:
    """What each shard's width is a multiple of: ``lcm(64, bucket end divisor / dp)``."""
    end_divisor = math.lcm(dp, 128, 2**16) if pad_for_high_nccl_busbw else math.lcm(dp, 128)
    return math.lcm(PARAM_ALIGN, end_divisor // dp)


def ns_cost(shape: Sequence[int]) -> int:
    """Main's Newton-Schulz cost of a param: ``max·min²`` of a 2-D shape, else its element count."""
    if len(shape) != 2:
        return math.prod(shape)
    big, small = max(shape), min(shape)
    return big * small * small


def shard_aligned_buckets(numels: Sequence[int], bucket_size: int | None, dp: int, *, rule: str = "0.19",
                          shapes: Sequence[Sequence[int]] | None = None,
                          pad_for_high_nccl_busbw: bool = False) -> list[AlignedBucket]:
    """Megatron's shard-aligned buckets of params with element counts ``numels`` (registration
    order; walked in reverse), under ``rule`` "0.19" (megatron-core 0.19.2) or "main" (Megatron-LM
    main: NS-cost deal, soft-minimum bucket size; needs ``shapes``). ``bucket_size`` None: one
    bucket. See the module docstring."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: one of {RULES}")
    if rule == "main" and shapes is None:
        raise ValueError("rule='main' deals by Newton-Schulz cost: give the params' shapes")
    divisor = shard_divisor(dp, pad_for_high_nccl_busbw)
    costs = [ns_cost(s) for s in shapes] if shapes is not None else list(numels)
    compute = [0] * dp  # main: NS cost per shard, kept over all buckets
    out: list[AlignedBucket] = []
    cursor = 0

    def emit(chunk: list[int]) -> None:
        nonlocal cursor
        if not chunk:
            return
        placed: list[list[int]] = [[] for _ in range(dp)]
        fill = [0] * dp
        if rule == "0.19":
            for k in sorted(chunk, key=lambda j: -numels[j]):  # stable: ties in backprop order
                s = min(range(dp), key=lambda r: fill[r])
                placed[s].append(k)
                fill[s] = _pad(fill[s], PARAM_ALIGN) + numels[k]
        else:
            cap = sum(numels[k] for k in chunk) / dp * (1 + NUMEL_EPSILON)
            for k in sorted(chunk, key=lambda j: -costs[j]):
                fits = [r for r in range(dp) if _pad(fill[r], PARAM_ALIGN) + numels[k] <= cap]
                s = min(fits, key=lambda r: compute[r]) if fits else min(range(dp), key=lambda r: fill[r])
                placed[s].append(k)
                fill[s] = _pad(fill[s], PARAM_ALIGN) + numels[k]
                compute[s] += costs[k]
        width = _pad(max(fill), divisor)
        members = []
        for s in range(dp):
            at = cursor + s * width
            for k in placed[s]:
                at = _pad(at, PARAM_ALIGN)
                members.append((k, at, at + numels[k], s))
                at += numels[k]
        out.append(AlignedBucket(cursor, cursor + dp * width, width, tuple(members)))
        cursor += dp * width

    chunk: list[int] = []
    chunk_numel = chunk_max = 0
    loads = [0] * dp  # main: the closing rule's element-count estimate, in backprop order

    def absorbs(numel: int) -> bool:
        return _pad(min(loads), PARAM_ALIGN) + numel <= _pad(max(loads), divisor)

    for k in reversed(range(len(numels))):
        n = numels[k]
        if rule == "main":
            if bucket_size is not None and chunk:
                threshold = max(bucket_size, int(dp * chunk_max * PADDING_FLOOR))
                if chunk_numel >= threshold and not absorbs(n):
                    emit(chunk)
                    chunk, chunk_numel, chunk_max = [], 0, 0
                    loads = [0] * dp
            s = min(range(dp), key=lambda r: loads[r])
            loads[s] = _pad(loads[s], PARAM_ALIGN) + n
        chunk.append(k)
        chunk_numel += n
        chunk_max = max(chunk_max, n)
        if rule == "0.19" and bucket_size is not None:
            if chunk_numel >= max(bucket_size, int(dp * chunk_max * PADDING_FLOOR)):
                emit(chunk)
                chunk, chunk_numel, chunk_max = [], 0, 0
    emit(chunk)
    return out


def managed(p: ParamSpec) -> bool:
    """Megatron's ``is_managed_by_layer_wise_optimizer``: a 2-D param other than the embedding
    and output layer (which Megatron routes to Adam whatever the optimizer)."""
    return len(p.shape) == 2 and not p.name.startswith(("embedding.", "output_layer."))


def bucket_size_of(layout: BufferLayout, params: Sequence[ParamSpec]) -> int:
    """A bucket size that made ``layout`` (`canzona.plan.buckets.build_layout`): Megatron's
    default ``max(4e7, 1e6 * dp)`` if it would, else the roundest size that would.

    Sizes in an interval (lo, hi] give the layout. A one-bucket layout (hi unbounded) gives no
    size away, and needs none: every size above lo gives the same Megatron chunks, because no
    chunk of matrices reaches lo elements before the buffer's last param, where the walk ends
    anyway (Megatron's chunks count raw matrix elements, a part of the padded buffer)."""
    lo, hi = 0, math.inf  # sizes in (lo, hi] give this layout
    for n, b in enumerate(layout.buckets):
        ends = [s.end - b.start for s in b.params]
        if len(ends) > 1:
            lo = max(lo, ends[-2])
        if n < len(layout.buckets) - 1:
            hi = min(hi, ends[-1])
    default = max(40_000_000, 1_000_000 * layout.dp)
    if lo < default <= hi:
        return default
    if hi == math.inf:
        return lo + 1
    for e in range(18, -1, -1):
        m = 10**e
        c = (lo // m + 1) * m
        if c <= hi:
            return int(c)
    raise AssertionError("unreachable: an integer lies in (lo, hi]")


@dataclass(frozen=True)
class Assignment:
    """`assign`'s result: the managed params (inventory indices, registration order), their
    shard-aligned buckets (``members`` index into ``managed``) and every param's DP owner."""

    managed: tuple[int, ...]
    buckets: tuple[AlignedBucket, ...]
    owners: tuple[int, ...]


def assign(inputs: PlanInputs, rule: str = "0.19", bucket_size: int | None = -1) -> Assignment:
    """Megatron's owners of ``inputs``' params under ``rule``; ``bucket_size`` -1: recovered from
    the shared buffer (`bucket_size_of`). The AdamW params outside Megatron's layer-wise buffer
    are dealt by element count (module docstring)."""
    if bucket_size == -1:
        bucket_size = bucket_size_of(inputs.layout, inputs.params)
    tp, dp = inputs.tp, inputs.dp
    mine = tuple(i for i, p in enumerate(inputs.params) if managed(p))
    buckets = shard_aligned_buckets([inputs.params[i].local_numel(tp) for i in mine], bucket_size, dp, rule=rule,
                                    shapes=[inputs.params[i].local_shape(tp) for i in mine])
    owners = [-1] * len(inputs.params)
    for b in buckets:
        for k, _, _, s in b.members:
            owners[mine[k]] = s
    # the rest (AdamW), largest first, each to the rank holding the fewest elements so far
    # (ties to the lowest): whole-param owners that keep the ranks' optimizer state even
    held = [0] * dp
    for i in mine:
        held[owners[i]] += inputs.params[i].local_numel(tp)
    heap = [(n, d) for d, n in enumerate(held)]
    heapq.heapify(heap)
    for i in sorted((i for i in range(len(inputs.params)) if owners[i] < 0),
                    key=lambda i: (-inputs.params[i].local_numel(tp), i)):
        n, d = heapq.heappop(heap)
        owners[i] = d
        heapq.heappush(heap, (n + inputs.params[i].local_numel(tp), d))
    return Assignment(mine, tuple(buckets), tuple(owners))


def aligned_layout(inputs: PlanInputs, rule: str = "0.19",
                   bucket_size: int | None = -1) -> tuple[BufferLayout, tuple[tuple[tuple[int, int], ...], ...]]:
    """Megatron's own layer-wise buffer of ``inputs``' managed params as a `BufferLayout` (slots
    in buffer order; ``index``: the inventory index) and its equal shard ranges per bucket. The
    other params are not in it (Megatron keeps them in a second buffer)."""
    got = assign(inputs, rule, bucket_size)
    buckets, ranges = [], []
    for n, b in enumerate(got.buckets):
        slots = tuple(ParamSlot(got.managed[k], start, end) for k, start, end, _ in b.members)
        buckets.append(Bucket(n, b.start, b.end, slots))
        ranges.append(tuple((b.start + s * b.shard, b.start + (s + 1) * b.shard) for s in range(inputs.dp)))
    numel = buckets[-1].end if buckets else 0
    return BufferLayout(tuple(buckets), numel, inputs.dp, inputs.tp), tuple(ranges)


def layout_for(inputs: PlanInputs, rule: str) -> DpLayout:
    """The candidate on the shared buffer: Megatron's owners, all-reduce, padded owned gather."""
    return DpLayout("all_reduce", "owned_params", None, assign(inputs, rule).owners)


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    return [layout_for(inputs, "0.19")]
