"""Megatron's DDP gradient-buffer layout, computed from shapes alone.

Megatron (`_ParamAndGradBuffer`, megatron-core 0.16) lays the TP-local params of a model chunk
into one flat buffer in *reverse* registration order (roughly backprop order). With the
distributed optimizer each param starts at a multiple of 64 elements, a bucket closes as soon as
it holds at least ``bucket_size`` elements, and each bucket's end is padded to a multiple of
``lcm(dp, 128)`` so it splits into equal shards. We always use that padded layout, for every
method, so that all methods reduce exactly the same buffer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from canzona.inventory import ParamSpec

PARAM_ALIGN = 64


@dataclass(frozen=True)
class ParamSlot:
    """Where one param's TP-local shard lives in the flat buffer (absolute offsets)."""

    index: int  # position in the inventory
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Bucket:
    index: int
    start: int
    end: int  # padded end
    params: tuple[ParamSlot, ...]  # in buffer order

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class BufferLayout:
    buckets: tuple[Bucket, ...]
    numel: int
    dp: int
    tp: int


def _pad(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


def build_layout(params: list[ParamSpec], *, dp: int, tp: int, bucket_size: int) -> BufferLayout:
    """The flat buffer of one TP rank (identical on every TP rank: shards have equal shapes)."""
    end_divisor = math.lcm(dp, 128)
    buckets: list[Bucket] = []
    current: list[ParamSlot] = []
    bucket_start = 0
    cursor = 0
    for index in reversed(range(len(params))):
        start = _pad(cursor, PARAM_ALIGN)
        end = start + params[index].local_numel(tp)
        current.append(ParamSlot(index, start, end))
        if end - bucket_start >= bucket_size:
            bucket_end = _pad(end, end_divisor)
            buckets.append(Bucket(len(buckets), bucket_start, bucket_end, tuple(current)))
            current, bucket_start, cursor = [], bucket_end, bucket_end
        else:
            cursor = end
    if current:
        bucket_end = _pad(current[-1].end, end_divisor)
        buckets.append(Bucket(len(buckets), bucket_start, bucket_end, tuple(current)))
    return BufferLayout(tuple(buckets), buckets[-1].end if buckets else 0, dp, tp)


Ranges = tuple[tuple[int, int], ...]  # per DP rank, (start, end) in one bucket


@dataclass(frozen=True)
class BucketPart:
    """One bucket of a buffer that is joined with others into one harness buffer
    (`join_buffers`): offsets count from the bucket's start."""

    first: int  # the lowest inventory index in it: its last gradient arrives last
    slots: tuple[ParamSlot, ...]
    numel: int  # padded
    ranges: Ranges  # each DP rank's (start, end)


def join_buffers(parts: list[BucketPart], dp: int, tp: int) -> tuple[BufferLayout, tuple[Ranges, ...]]:
    """Several Megatron buffers as one harness buffer, and its shard ranges per bucket.

    Megatron reduces each of its buffers on its own (the authors' matrix buffer beside the
    ordinary one; 0.19's layer-wise buffer beside the distributed optimizer's); the harness has
    one buffer that hands its buckets out in order, so the buckets are laid end to end in the
    order their last gradient arrives (backprop order: the highest first index first)."""
    buckets: list[Bucket] = []
    ranges: list[Ranges] = []
    at = 0
    for n, part in enumerate(sorted(parts, key=lambda p: -p.first)):
        buckets.append(Bucket(n, at, at + part.numel,
                              tuple(ParamSlot(s.index, s.start + at, s.end + at) for s in part.slots)))
        ranges.append(tuple((x + at, y + at) for x, y in part.ranges))
        at += part.numel
    return BufferLayout(tuple(buckets), at, dp, tp), tuple(ranges)


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
