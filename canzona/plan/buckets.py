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
