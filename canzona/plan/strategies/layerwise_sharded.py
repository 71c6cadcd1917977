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
0.19's reduce-scatter on that buffer without cutting a matrix. Two candidates, by what the
harness's `DpLayout` can say:

- With a buffer of the strategy's own (a ``layout`` field on `DpLayout`, which the composer then
  gives the plan: `carries_own_buffer`), `own_buffer`: Megatron's layer-wise buckets as they are
  (equal shards in rank order, each the concatenation of its owner's params, padded: even
  reduce-scatter, even all-gather), beside the other params' buckets (below).
- Without one (this tree's `DpLayout`), 0.19's *owners* with the collectives that carry any
  ownership on the shared buffer: gradients all-reduced, each rank's updated params all-gathered
  packed and padded to the widest (``param_sync="owned_params"``, as ``layerwise``). The owners --
  hence the optimizer step and its balance -- are Megatron's exactly; the gradient reduction
  moves an all-reduce's volume, 2(P-1)/P of the buffer per rank, where 0.19's reduce-scatter
  moves (P-1)/P of its padded buffer.

tests/unit/test_mirror_owners.py holds the owners to megatron-core 0.19.2's own function.

The AdamW params Megatron keeps in its other buffer (norms, the embedding and output layer),
which Megatron's distributed optimizer shards elementwise, are owned whole here, as the lowering
needs when matrices have whole owners: on the shared buffer largest first, each to the rank that
holds the fewest elements so far, the matrices counted, so that optimizer state stays even; in
its own buffer as `own_buffer` says.

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
from canzona.plan.buckets import (
    PARAM_ALIGN,
    BucketPart,
    BufferLayout,
    ParamSlot,
    Ranges,
    bucket_size_of,
    join_buffers,
)
from canzona.plan.types import DpLayout, PlanInputs

NAME = "layerwise_sharded"
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


def own_buffer(inputs: PlanInputs, rule: str = "0.19", bucket_size: int | None = -1) -> DpLayout:
    """`own_buffer_layout` as the candidate with a buffer of its own: reduce-scatter into its
    shards, all-gather of them (needs a `DpLayout` with a ``layout`` field)."""
    if not carries_own_buffer():
        raise NotImplementedError("this harness's DpLayout cannot carry a buffer of its own (a 'layout' field)")
    layout, ranges, owners = own_buffer_layout(inputs, rule, bucket_size)
    return DpLayout("reduce_scatter", "shards", ranges, owners, layout=layout)  # type: ignore[call-arg]


def own_buffer_layout(inputs: PlanInputs, rule: str = "0.19", bucket_size: int | None = -1,
                      ) -> tuple[BufferLayout, tuple[Ranges, ...], tuple[int, ...]]:
    """Megatron's own buffers of ``inputs`` as one harness buffer: its layout, shard ranges per
    bucket and every param's DP owner.

    The layer-wise buckets (`shard_aligned_buckets`: slots in buffer order, shard by shard;
    equal shard ranges in rank order, so the lowering picks even collectives) and the other
    params' buckets, laid out by Megatron's distributed optimizer's rule (the 0.16 one of
    `canzona.plan.buckets.build_layout`, on those params alone) and shared at parameter ends
    as evenly as the ends allow (`canzona.plan.dp.alpha_cuts` at alpha 0: whole params, where
    Megatron's ZeRO-1 cuts them; the lowering's uneven collective moves them). Megatron's two
    buffers reduce independently; one harness buffer hands its buckets out in order, so the
    buckets are laid in the order their last gradient arrives (backprop order)."""
    from canzona.plan import dp as dpmod

    if bucket_size == -1:
        bucket_size = bucket_size_of(inputs.layout, inputs.params)
    got = assign(inputs, rule, bucket_size)
    dp, tp = inputs.dp, inputs.tp
    parts: list[BucketPart] = []
    for b in got.buckets:
        slots = tuple(ParamSlot(got.managed[k], start - b.start, end - b.start) for k, start, end, _ in b.members)
        equal = tuple((s * b.shard, (s + 1) * b.shard) for s in range(dp))
        parts.append(BucketPart(min(sl.index for sl in slots), slots, b.end - b.start, equal))
    owners = list(got.owners)
    managed_set = set(got.managed)
    rest = [i for i in range(len(inputs.params)) if i not in managed_set]

    def even_at_ends(sub: BufferLayout) -> list[dpmod.Cuts]:
        return dpmod.alpha_cuts(sub, {k: float(inputs.params[i].local_numel(tp)) for k, i in enumerate(rest)}, 0.0)

    rest_parts, rest_owners = dpmod.subset_buffer(inputs.params, rest, dp=dp, tp=tp, cuts=even_at_ends,
                                                  bucket_size=bucket_size if bucket_size is not None else 1 << 62)
    for i, r in rest_owners.items():
        owners[i] = r
    layout, ranges = join_buffers(parts + rest_parts, dp, tp)
    return layout, ranges, tuple(owners)


def layout_for(inputs: PlanInputs, rule: str) -> DpLayout:
    """The strategy's candidate: Megatron's own buffer where a `DpLayout` can carry one
    (`own_buffer`), else on the shared buffer Megatron's owners with an all-reduce and the padded
    gather of owned params."""
    if carries_own_buffer():
        return own_buffer(inputs, rule)
    return DpLayout("all_reduce", "owned_params", None, assign(inputs, rule).owners)


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    return [layout_for(inputs, "0.19")]


def carries_own_buffer() -> bool:
    """Whether this harness's `DpLayout` can carry a buffer of its own (then `own_buffer` runs)."""
    return "layout" in DpLayout.__dataclass_fields__
