"""TP side of the optimizer step: whole matrices from TP shards, and update shards back.

- `gather_full` / `shard_of`: how a full matrix relates to its TP shards (concatenation along
  the param's TP dim, rank order).
- `MicroGroupPipeline`: Canzona's asynchronous pipeline (DESIGN.md §3.2). Per micro-group, one
  fused ``all_to_all_single`` sends every rank's shard of each matrix to the matrix's owner;
  owners compute full updates; one fused ``all_to_all_single`` sends each rank its shard of
  every update. With depth D, the gathers of the next D groups and the scatters of earlier
  groups are in flight while a group computes; depth 0 runs groups one at a time.
- `duplicated_gather`: the baselines' TP mode -- all-gather every matrix on every TP rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from canzona.executor.timing import StepTimer
from canzona.plan.tp import MicroGroup


def full_from_shards(shards: list[torch.Tensor], tp_dim: int) -> torch.Tensor:
    return torch.cat(shards, dim=tp_dim)


def shard_of(full: torch.Tensor, tp_dim: int, tp: int, rank: int) -> torch.Tensor:
    return full.chunk(tp, dim=tp_dim)[rank]


@dataclass
class TpItem:
    index: int
    tp_dim: int
    grad: torch.Tensor  # local shard (view into the grad buffer)


# compute(indices, full_grads) -> full updates, same order
ComputeFn = Callable[[list[int], list[torch.Tensor]], list[torch.Tensor]]
# apply(index, update_shard)
ApplyFn = Callable[[int, torch.Tensor], None]


class MicroGroupPipeline:
    def __init__(self, groups: tuple[MicroGroup, ...], tp: int, tp_rank: int, group: dist.ProcessGroup, depth: int):
        self.groups, self.tp, self.me, self.group, self.depth = groups, tp, tp_rank, group, depth

    def _gather(self, g: MicroGroup, items: dict[int, TpItem]) -> tuple[object, torch.Tensor, torch.Tensor]:
        # send: my shards grouped by owner rank (rank order), in group item order
        by_owner = [[i for i, o in zip(g.items, g.owners) if o == r] for r in range(self.tp)]
        send = torch.cat([items[i].grad.reshape(-1) for r in range(self.tp) for i in by_owner[r]])
        in_splits = [sum(items[i].grad.numel() for i in by_owner[r]) for r in range(self.tp)]
        mine = sum(items[i].grad.numel() for i in by_owner[self.me])
        recv = torch.empty(mine * self.tp, dtype=send.dtype, device=send.device)
        work = dist.all_to_all_single(recv, send, [mine] * self.tp, in_splits, group=self.group, async_op=True)
        return work, recv, send  # keep send alive until the work completes

    def _unpack_full(self, g: MicroGroup, items: dict[int, TpItem], recv: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
        owned = [i for i, o in zip(g.items, g.owners) if o == self.me]
        per_src = recv.view(self.tp, -1)
        fulls, off = [], 0
        for i in owned:
            it = items[i]
            n = it.grad.numel()
            shards = [per_src[s, off : off + n].view(it.grad.shape) for s in range(self.tp)]
            fulls.append(full_from_shards(shards, it.tp_dim))
            off += n
        return owned, fulls

    def _scatter(self, g: MicroGroup, items: dict[int, TpItem], owned: list[int], updates: list[torch.Tensor]):
        # send to each rank its shard of each of my updates; receive my shard of every update
        parts = [
            shard_of(u, items[i].tp_dim, self.tp, r).reshape(-1) for r in range(self.tp) for i, u in zip(owned, updates)
        ]
        mine_total = sum(items[i].grad.numel() for i in owned)
        send = torch.cat(parts) if parts else torch.empty(0, device=self._device(items))
        by_owner = [[i for i, o in zip(g.items, g.owners) if o == r] for r in range(self.tp)]
        out_splits = [sum(items[i].grad.numel() for i in by_owner[r]) for r in range(self.tp)]
        recv = torch.empty(sum(out_splits), dtype=torch.float32, device=send.device)
        work = dist.all_to_all_single(recv, send, out_splits, [mine_total] * self.tp, group=self.group, async_op=True)
        return work, recv, send, by_owner

    @staticmethod
    def _device(items: dict[int, TpItem]) -> torch.device:
        return next(iter(items.values())).grad.device

    def _apply(self, items: dict[int, TpItem], recv: torch.Tensor, by_owner: list[list[int]], apply: ApplyFn) -> None:
        off = 0
        for r in range(self.tp):
            for i in by_owner[r]:
                n = items[i].grad.numel()
                apply(i, recv[off : off + n].view(items[i].grad.shape))
                off += n

    def run(self, items: dict[int, TpItem], compute: ComputeFn, apply: ApplyFn, timer: StepTimer) -> None:
        groups = self.groups
        if not groups:
            return
        gathers: dict[int, tuple] = {}
        scatters: deque = deque()
        issued = 0

        def issue_gathers(upto: int) -> None:
            nonlocal issued
            while issued < min(upto, len(groups)):
                with timer.phase("gather", f"gather g{issued}"):
                    gathers[issued] = self._gather(groups[issued], items)
                issued += 1

        def drain_scatters(keep: int) -> None:
            while len(scatters) > keep:
                k, (work, recv, _send, by_owner) = scatters.popleft()
                with timer.phase("wait", f"wait scatter g{k}"):
                    work.wait()
                with timer.phase("apply", f"apply g{k}"):
                    self._apply(items, recv, by_owner, apply)

        for k, g in enumerate(groups):
            issue_gathers(k + 1 + self.depth)  # group k plus `depth` groups ahead
            work, recv, _send = gathers.pop(k)
            with timer.phase("wait", f"wait gather g{k}"):
                work.wait()
            owned, fulls = self._unpack_full(g, items, recv)
            with timer.phase("compute", f"compute g{k}"):
                updates = compute(owned, fulls) if owned else []
            with timer.phase("scatter", f"scatter g{k}"):
                scatters.append((k, self._scatter(g, items, owned, updates)))
            drain_scatters(self.depth)
        drain_scatters(0)


def duplicated_gather(items: list[TpItem], tp: int, group: dist.ProcessGroup) -> list[torch.Tensor]:
    """All-gather every item's full matrix on every TP rank (issued together, then awaited)."""
    pending = []
    for it in items:
        out = torch.empty(tp * it.grad.numel(), dtype=it.grad.dtype, device=it.grad.device)
        src = it.grad.contiguous().view(-1)
        pending.append((dist.all_gather_single(out, src, group=group, async_op=True), out, src))
    fulls = []
    for (work, out, _src), it in zip(pending, items):
        work.wait()
        fulls.append(full_from_shards(list(out.view(tp, *it.grad.shape).unbind(0)), it.tp_dim))
    return fulls
