"""The executor's only ``torch.distributed`` caller: issues a program's communication actions.

`Communicator.issue(action)` makes exactly the calls `action.calls()` lists (the tests check
that against what `Recorder` saw) and returns a `Pending` whose ``wait()`` completes them,
including the local copy-out, averaging or unpacking; the runtime keeps every pending handle
and the tensors it refers to until that wait (dropping them early can tear a collective).

How uneven DP shards travel (``impl``, chosen by the lowering per bucket):
``even`` uses reduce_scatter / all_gather directly; ``padded`` copies each range into row r of a
``[P, widest]`` buffer and uses the even collective; ``reduce_loop`` issues one rooted reduce /
broadcast per non-empty shard; ``coalesced`` issues those rooted calls inside one coalescing
group (NCCL launches them as one group call; gloo has no coalescing and runs them in turn);
``all_to_all`` sends exact split sizes with all_to_all_single and sums / places locally.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from canzona.program.actions import (
    BucketGather,
    BucketReduce,
    Call,
    Comm,
    NormReduce,
    OwnedParamsGather,
    StepBarrier,
    TpAllGather,
    TpGather,
    TpScatter,
)

# torch >= 2.12 names; older releases (e.g. 2.11 on some GPU images) have the *_tensor spellings.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}


class Pending:
    """Work handles plus a finaliser that runs after all of them completed; ``result`` is what
    the action produced for later actions (gathered matrices, received update shards)."""

    def __init__(self, works: list, finish: Callable[[], Any] | None = None, keep: tuple = ()):
        self.works = works
        self.finish = finish
        self.keep = keep  # tensors that must outlive the works
        self.result: Any = None
        self.issued = time.perf_counter()
        self.completed: float | None = None  # when the backend said the works were done, if it says
        self._pending_futures = 0
        for w in works:
            future = getattr(w, "get_future", None)
            if future is None:
                continue
            try:
                fut = future()
            except (RuntimeError, NotImplementedError):  # a backend without futures
                continue
            self._pending_futures += 1
            fut.add_done_callback(self._done)

    def _done(self, _fut) -> None:
        self._pending_futures -= 1
        if self._pending_futures == 0:
            self.completed = time.perf_counter()

    def duration_ms(self) -> float | None:
        """Issue to completion as the backend reported it (the collective's own time, waits or
        not), or None when the backend gives no completion callback."""
        return None if self.completed is None else (self.completed - self.issued) * 1e3

    def wait(self) -> Any:
        for w in self.works:
            if w is not None:
                w.wait()
        self.works = []
        if self.finish is not None:
            self.result = self.finish()
            self.finish = None
        self.keep = ()
        return self.result


@dataclass
class Recorder:
    """What the communicator handed to torch, per action tag (one iteration at a time)."""

    calls: dict[str, list[Call]] = field(default_factory=dict)

    def add(self, tag: str, call: Call) -> None:
        self.calls.setdefault(tag, []).append(call)

    def reset(self) -> None:
        self.calls = {}

    def bytes_by_tag(self) -> dict[str, list[int]]:
        return {t: [sum(c.in_bytes for c in cs), sum(c.out_bytes for c in cs), len(cs)] for t, cs in self.calls.items()}


class Communicator:
    """Issues communication actions over one rank's DP and TP groups."""

    def __init__(self, dp_group: dist.ProcessGroup, tp_group: dist.ProcessGroup, device: torch.device,
                 recorder: Recorder | None = None, *, edp_group: dist.ProcessGroup | None = None,
                 etp_group: dist.ProcessGroup | None = None):
        # None: the default (world) group; an MoE model's expert-DP and expert-TP groups beside
        self.groups = {"dp": dp_group, "tp": tp_group, "world": None, "edp": edp_group, "etp": etp_group}
        self.device = device
        self.recorder = recorder or Recorder()

    # ------------------------------------------------------------------ recorded torch calls
    def _rec(self, tag: str, op: str, axis: str, inp: torch.Tensor, out: torch.Tensor, root: int | None = None,
             coalesced: bool = False, local: int = 0) -> None:
        self.recorder.add(tag, Call(op, axis, inp.numel(), out.numel(), _DTYPES[inp.dtype], root, coalesced, local))

    def _reduce_scatter(self, tag: str, axis: str, out: torch.Tensor, inp: torch.Tensor):
        self._rec(tag, "reduce_scatter", axis, inp, out)
        return _reduce_scatter(out, inp, group=self.groups[axis], async_op=True)

    def _all_gather(self, tag: str, axis: str, out: torch.Tensor, inp: torch.Tensor):
        self._rec(tag, "all_gather", axis, inp, out)
        return _all_gather(out, inp, group=self.groups[axis], async_op=True)

    def _all_reduce(self, tag: str, axis: str, t: torch.Tensor):
        self._rec(tag, "all_reduce", axis, t, t)
        return dist.all_reduce(t, group=self.groups[axis], async_op=True)

    def _all_to_all(self, tag: str, axis: str, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                    in_splits: list[int], me: int):
        self._rec(tag, "all_to_all", axis, inp, out, local=in_splits[me])
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.groups[axis], async_op=True)

    def _rooted(self, tag: str, op: str, axis: str, t: torch.Tensor, root: int, coalesced: bool):
        group = self.groups[axis]
        self._rec(tag, op, axis, t, t, root, coalesced)
        fn = dist.reduce if op == "reduce" else dist.broadcast
        return fn(t, dist.get_global_rank(group, root), group=group, async_op=True)

    @contextlib.contextmanager
    def _coalescing(self, axis: str, on: bool) -> Iterator[list]:
        """Collect the works of calls issued inside; with ``on``, as one coalesced group where the
        backend supports it (NCCL); gloo has no coalescing, its calls run one after another."""
        works: list = []
        if not on or self.device.type != "cuda":
            yield works
            return
        with dist._coalescing_manager(self.groups[axis], self.device, async_ops=True) as cm:
            yield works
        works[:] = [cm]

    # ------------------------------------------------------------------ actions
    def issue(self, a: Comm, param_buf: torch.Tensor, grad_buf: torch.Tensor, results: dict[str, Any],
              grad_of: Callable[[int], torch.Tensor], param_of: Callable[[int], torch.Tensor],
              tp_dims: dict[int, int]) -> Pending:
        if isinstance(a, BucketReduce):
            return self._bucket_reduce(a, grad_buf)
        if isinstance(a, BucketGather):
            return self._bucket_gather(a, param_buf if a.buffer == "param" else grad_buf)
        if isinstance(a, OwnedParamsGather):
            return self._owned_gather(a, param_of)
        if isinstance(a, TpGather):
            return self._tp_gather(a, grad_of, tp_dims)
        if isinstance(a, TpScatter):
            return self._tp_scatter(a, results.get(a.source, {}), grad_of, tp_dims)
        if isinstance(a, TpAllGather):
            return self._tp_all_gather(a, grad_of, tp_dims)
        if isinstance(a, NormReduce):
            total = results[a.source].clone()
            return Pending([self._all_reduce(a.tag, a.axis, total)], lambda: total, (total,))
        if isinstance(a, StepBarrier):
            token = torch.zeros(1, device=self.device)
            return Pending([self._all_reduce(a.tag, a.axis, token)], lambda: None, (token,))
        raise TypeError(f"not a communication action: {a!r}")

    def _bucket_reduce(self, a: BucketReduce, buf: torch.Tensor) -> Pending:
        tag = a.tag
        if a.op == "all_reduce":
            view = buf[a.start : a.end]
            p = a.average_over or dist.get_world_size(self.groups[a.axis])
            work = self._all_reduce(tag, a.axis, view)
            return Pending([work], (lambda: view.mul_(1.0 / p)) if a.average else None)
        ranges = a.ranges
        assert ranges is not None
        p = len(ranges)
        lo, hi = ranges[a.me]
        scale = 1.0 / (a.average_over or p) if a.average else 1.0
        if a.impl == "even":
            out = torch.empty(hi - lo, dtype=buf.dtype, device=buf.device)
            work = self._reduce_scatter(tag, a.axis, out, buf[a.start : a.end])
            return Pending([work], lambda: buf[lo:hi].copy_(out).mul_(scale), (out,))
        if a.impl == "padded":
            widest = max(e - s for s, e in ranges)
            send = torch.zeros(p, widest, dtype=buf.dtype, device=buf.device)
            for r, (s, e) in enumerate(ranges):
                send[r, : e - s] = buf[s:e]
            out = torch.empty(widest, dtype=buf.dtype, device=buf.device)
            work = self._reduce_scatter(tag, a.axis, out, send.view(-1))
            return Pending([work], lambda: buf[lo:hi].copy_(out[: hi - lo]).mul_(scale), (send, out))
        if a.impl in ("reduce_loop", "coalesced"):
            co = a.impl == "coalesced"
            with self._coalescing(a.axis, co) as works:
                works.extend(self._rooted(tag, "reduce", a.axis, buf[s:e], r, co) for r, (s, e) in enumerate(ranges) if e > s)
            return Pending(works, lambda: buf[lo:hi].mul_(scale))
        if a.impl == "all_to_all":
            send = torch.cat([buf[s:e] for s, e in ranges])
            recv = torch.empty(p * (hi - lo), dtype=buf.dtype, device=buf.device)
            work = self._all_to_all(tag, a.axis, recv, send, [hi - lo] * p, [e - s for s, e in ranges], a.me)

            def finish() -> None:
                # summed in source-rank order: deterministic on every rank
                total = recv.view(p, hi - lo).sum(dim=0) if hi > lo else recv[:0]
                buf[lo:hi].copy_(total).mul_(scale)

            return Pending([work], finish, (send, recv))
        raise ValueError(f"unknown impl {a.impl!r}")

    def _bucket_gather(self, a: BucketGather, buf: torch.Tensor) -> Pending:
        tag, ranges = a.tag, a.ranges
        p = len(ranges)
        lo, hi = ranges[a.me]
        start, end = ranges[0][0], ranges[-1][1]
        if a.impl == "even":
            out = torch.empty(end - start, dtype=buf.dtype, device=buf.device)
            mine = buf[lo:hi].contiguous()
            work = self._all_gather(tag, a.axis, out, mine)
            return Pending([work], lambda: buf[start:end].copy_(out), (out, mine))
        if a.impl == "padded":
            widest = max(e - s for s, e in ranges)
            mine = torch.zeros(widest, dtype=buf.dtype, device=buf.device)
            mine[: hi - lo] = buf[lo:hi]
            out = torch.empty(p, widest, dtype=buf.dtype, device=buf.device)
            work = self._all_gather(tag, a.axis, out.view(-1), mine)

            def place() -> None:
                for r, (s, e) in enumerate(ranges):
                    if r != a.me:
                        buf[s:e].copy_(out[r, : e - s])

            return Pending([work], place, (mine, out))
        if a.impl in ("reduce_loop", "coalesced"):
            co = a.impl == "coalesced"
            with self._coalescing(a.axis, co) as works:
                works.extend(self._rooted(tag, "broadcast", a.axis, buf[s:e], r, co) for r, (s, e) in enumerate(ranges) if e > s)
            return Pending(works)
        if a.impl == "all_to_all":
            send = buf[lo:hi].repeat(p)
            recv = torch.empty(sum(e - s for s, e in ranges), dtype=buf.dtype, device=buf.device)
            work = self._all_to_all(tag, a.axis, recv, send, [e - s for s, e in ranges], [hi - lo] * p, a.me)

            def place_all() -> None:
                off = 0
                for s, e in ranges:
                    buf[s:e].copy_(recv[off : off + e - s])
                    off += e - s

            return Pending([work], place_all, (send, recv))
        raise ValueError(f"unknown impl {a.impl!r}")

    def _owned_gather(self, a: OwnedParamsGather, param_of: Callable[[int], torch.Tensor]) -> Pending:
        widest = max(a.sizes)
        mine_items = a.owned[a.me]
        sample = param_of(mine_items[0]) if mine_items else param_of(next(i for o in a.owned for i in o))
        mine = torch.zeros(widest, dtype=sample.dtype, device=sample.device)
        if mine_items:
            mine[: a.sizes[a.me]] = torch.cat([param_of(i).reshape(-1) for i in mine_items])
        out = torch.empty(len(a.sizes), widest, dtype=mine.dtype, device=mine.device)
        work = self._all_gather(a.tag, a.axis, out.view(-1), mine)

        def unpack() -> None:
            for r, items in enumerate(a.owned):
                if r == a.me:
                    continue
                off = 0
                for i in items:
                    view = param_of(i)
                    view.copy_(out[r, off : off + view.numel()].view_as(view))
                    off += view.numel()

        return Pending([work], unpack, (mine, out))

    # ------------------------------------------------------------------ tensor parallel
    def _tp_gather(self, a: TpGather, grad_of: Callable[[int], torch.Tensor], tp_dims: dict[int, int]) -> Pending:
        """Send my shard of each matrix to its owner (owners in rank order, group order within);
        the result maps each matrix I own to its full gradient."""
        tp, me = a.tp, a.me
        by_owner = [[i for i, o in zip(a.items, a.owners) if o == r] for r in range(tp)]
        send = torch.cat([grad_of(i).reshape(-1) for r in range(tp) for i in by_owner[r]])
        in_splits = [sum(grad_of(i).numel() for i in by_owner[r]) for r in range(tp)]
        mine = in_splits[me]
        recv = torch.empty(mine * tp, dtype=send.dtype, device=send.device)
        work = self._all_to_all(a.tag, a.axis, recv, send, [mine] * tp, in_splits, me)

        def unpack() -> dict[int, torch.Tensor]:
            per_src = recv.view(tp, -1)
            fulls, off = {}, 0
            for i in by_owner[me]:
                g = grad_of(i)
                shards = [per_src[s, off : off + g.numel()].view(g.shape) for s in range(tp)]
                fulls[i] = torch.cat(shards, dim=tp_dims[i])
                off += g.numel()
            return fulls

        return Pending([work], unpack, (send, recv))

    def _tp_scatter(self, a: TpScatter, updates: dict[int, torch.Tensor], grad_of: Callable[[int], torch.Tensor],
                    tp_dims: dict[int, int]) -> Pending:
        """Send each rank its shard of every update I computed; the result maps every matrix of
        the group to my shard of its update."""
        tp, me = a.tp, a.me
        owned = [i for i, o in zip(a.items, a.owners) if o == me]
        parts = [updates[i].chunk(tp, dim=tp_dims[i])[r].reshape(-1) for r in range(tp) for i in owned]
        device = grad_of(a.items[0]).device
        send = torch.cat(parts) if parts else torch.empty(0, device=device)
        by_owner = [[i for i, o in zip(a.items, a.owners) if o == r] for r in range(tp)]
        out_splits = [sum(grad_of(i).numel() for i in by_owner[r]) for r in range(tp)]
        mine = out_splits[me]
        recv = torch.empty(sum(out_splits), dtype=send.dtype if parts else torch.float32, device=device)
        work = self._all_to_all(a.tag, a.axis, recv, send, out_splits, [mine] * tp, me)

        def unpack() -> dict[int, torch.Tensor]:
            shards, off = {}, 0
            for r in range(tp):
                for i in by_owner[r]:
                    g = grad_of(i)
                    shards[i] = recv[off : off + g.numel()].view(g.shape)
                    off += g.numel()
            return shards

        return Pending([work], unpack, (send, recv))

    def _tp_all_gather(self, a: TpAllGather, grad_of: Callable[[int], torch.Tensor], tp_dims: dict[int, int]) -> Pending:
        pending = []
        for i in a.items:
            g = grad_of(i)
            src = g.contiguous().view(-1)
            out = torch.empty(a.tp * g.numel(), dtype=g.dtype, device=g.device)
            pending.append((self._all_gather(a.tag, a.axis, out, src), out, src))

        def fulls() -> dict[int, torch.Tensor]:
            return {
                i: torch.cat(list(out.view(a.tp, *grad_of(i).shape).unbind(0)), dim=tp_dims[i])
                for i, (_, out, _) in zip(a.items, pending)
            }

        return Pending([w for w, _, _ in pending], fulls, tuple(t for _, o, s in pending for t in (o, s)))

    def summing(self, tag: str, axis: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """A blocking sum over the ``axis`` group, recorded under ``tag``: what the optimizer
        maths is handed to sum partial products over TP (`GramCompute`), so that it needs no
        process group of its own."""
        def reduce(t: torch.Tensor) -> torch.Tensor:
            self._all_reduce(tag, axis, t).wait()
            return t

        return reduce

    def group_rank(self, axis: str) -> int:
        """This rank's index in its ``axis`` group."""
        return dist.get_rank(self.groups[axis])

    def tp_partial_reduce(self, grad: torch.Tensor) -> None:
        """A replicated param's partial gradient summed over TP (in its backward hook)."""
        self._all_reduce("backward", "tp", grad).wait()
