"""Reduce-scatter and all-gather over DP for shards of *uneven* size (DESIGN.md §3.1).

``reduce_scatter_tensor`` / ``all_gather_into_tensor`` need equal shards in rank order.
Canzona's shards are cut at parameter boundaries (uneven, possibly empty, in any rank order),
so three implementations are offered, chosen by ``dist.dp_collective`` and compared in the
benchmarks:

- ``padded``: copy each rank's range into row r of a ``[P, widest]`` buffer and use the even
  collective (one call; moves P × widest, wasteful when one shard is large).
- ``reduce_loop``: one rooted ``reduce`` / ``broadcast`` per non-empty shard (bandwidth-optimal
  per shard; P calls).
- ``all_to_all``: ``all_to_all_single`` with split sizes, then a local sum (reduce) or a
  placement (gather); each rank receives exactly what it needs.

- ``auto`` (default): per bucket, ``padded`` when padding costs little (P × widest shard
  ≤ 1.25 × the bucket), else ``reduce_loop``. Padding a bucket that holds one large matrix
  would move P times that matrix; at 64+ DP ranks that dominates the iteration.

Equal shards in rank order (Megatron's ZeRO-1) always take the even collectives directly.
All functions return async `Work`-like handles whose ``wait()`` completes the operation,
including the local copy-out; the caller must keep the handle until it waited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

Ranges = Sequence[tuple[int, int]]


class Pending:
    """Work handles plus a finaliser that runs after all of them completed."""

    def __init__(self, works: list, finish: Callable[[], None] | None = None):
        self.works = works
        self.finish = finish

    def wait(self) -> None:
        for w in self.works:
            if w is not None:
                w.wait()
        self.works = []
        if self.finish is not None:
            self.finish()
            self.finish = None


def equal_in_order(ranges: Ranges) -> bool:
    widths = {b - a for a, b in ranges}
    return len(widths) == 1 and all(ranges[r][1] == ranges[r + 1][0] for r in range(len(ranges) - 1))


PADDING_TOLERANCE = 1.25


def resolve(ranges: Ranges, how: str) -> str:
    """The implementation `how` means for this bucket (``auto`` picks per bucket)."""
    if how != "auto":
        return how
    widest = max(b - a for a, b in ranges)
    size = sum(b - a for a, b in ranges)  # the ranges cover the bucket
    return "padded" if len(ranges) * widest <= PADDING_TOLERANCE * size else "reduce_loop"


def reduce_scatter(
    buf: torch.Tensor, ranges: Ranges, me: int, group: dist.ProcessGroup, how: str, average: bool
) -> Pending:
    """Sum (then average) `buf`'s ranges over the group into rank `me`'s own range of `buf`."""
    how = resolve(ranges, how)
    p = len(ranges)
    lo, hi = ranges[me]
    scale = 1.0 / p if average else 1.0
    start, end = ranges[0][0], ranges[-1][1]
    if equal_in_order(ranges):
        out = torch.empty(hi - lo, dtype=buf.dtype, device=buf.device)
        work = dist.reduce_scatter_single(out, buf[start:end], group=group, async_op=True)
        return Pending([work], lambda: buf[lo:hi].copy_(out).mul_(scale))
    if how == "padded":
        widest = max(b - a for a, b in ranges)
        send = torch.zeros(p, widest, dtype=buf.dtype, device=buf.device)
        for r, (a, b) in enumerate(ranges):
            send[r, : b - a] = buf[a:b]
        out = torch.empty(widest, dtype=buf.dtype, device=buf.device)
        work = dist.reduce_scatter_single(out, send.view(-1), group=group, async_op=True)
        return Pending([work], lambda: buf[lo:hi].copy_(out[: hi - lo]).mul_(scale))
    if how == "reduce_loop":
        works = [
            dist.reduce(buf[a:b], dst=dist.get_global_rank(group, r), group=group, async_op=True)
            for r, (a, b) in enumerate(ranges)
            if b > a
        ]
        return Pending(works, lambda: buf[lo:hi].mul_(scale))
    if how == "all_to_all":
        send = torch.cat([buf[a:b] for a, b in ranges])
        recv = torch.empty(p * (hi - lo), dtype=buf.dtype, device=buf.device)
        work = dist.all_to_all_single(
            recv, send, output_split_sizes=[hi - lo] * p, input_split_sizes=[b - a for a, b in ranges],
            group=group, async_op=True,
        )

        def finish() -> None:
            # sum in source-rank order: the same order a ring or tree would not guarantee, but
            # every rank's result is deterministic
            total = recv.view(p, hi - lo).sum(dim=0) if hi > lo else recv[:0]
            buf[lo:hi].copy_(total).mul_(scale)

        return Pending([work], finish)
    raise ValueError(f"unknown dp_collective {how!r}")


def all_gather(buf: torch.Tensor, ranges: Ranges, me: int, group: dist.ProcessGroup, how: str) -> Pending:
    """Every rank's range of `buf` from its owner to all ranks (in place in `buf`)."""
    how = resolve(ranges, how)
    p = len(ranges)
    lo, hi = ranges[me]
    start, end = ranges[0][0], ranges[-1][1]
    if equal_in_order(ranges):
        out = torch.empty(end - start, dtype=buf.dtype, device=buf.device)
        work = dist.all_gather_single(out, buf[lo:hi].contiguous(), group=group, async_op=True)
        return Pending([work], lambda: buf[start:end].copy_(out))
    if how == "padded":
        widest = max(b - a for a, b in ranges)
        mine = torch.zeros(widest, dtype=buf.dtype, device=buf.device)
        mine[: hi - lo] = buf[lo:hi]
        out = torch.empty(p, widest, dtype=buf.dtype, device=buf.device)
        work = dist.all_gather_single(out.view(-1), mine, group=group, async_op=True)

        def finish() -> None:
            for r, (a, b) in enumerate(ranges):
                if r != me:
                    buf[a:b].copy_(out[r, : b - a])

        return Pending([work], finish)
    if how == "reduce_loop":
        works = [
            dist.broadcast(buf[a:b], src=dist.get_global_rank(group, r), group=group, async_op=True)
            for r, (a, b) in enumerate(ranges)
            if b > a
        ]
        return Pending(works)
    if how == "all_to_all":
        send = buf[lo:hi].repeat(p)
        recv = torch.empty(sum(b - a for a, b in ranges), dtype=buf.dtype, device=buf.device)
        work = dist.all_to_all_single(
            recv, send, output_split_sizes=[b - a for a, b in ranges], input_split_sizes=[hi - lo] * p,
            group=group, async_op=True,
        )

        def place() -> None:
            off = 0
            for a, b in ranges:
                buf[a:b].copy_(recv[off : off + b - a])
                off += b - a

        return Pending([work], place)
    raise ValueError(f"unknown dp_collective {how!r}")
