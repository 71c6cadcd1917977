"""Flat parameter and gradient buffers with the planner's bucket layout.

Every TP-local parameter becomes a view into one flat fp32 parameter buffer (so a DP
all-gather writes straight into the model's weights) and gets a slot in a flat gradient buffer.
A post-accumulate-grad hook moves each gradient into its slot as backward produces it; when
every param of a bucket has its gradient, the bucket's DP reduction is issued asynchronously
(buckets strictly in index order, so every rank issues the same collectives in the same order),
overlapping the rest of backward as Megatron's DDP does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from canzona.executor.collectives import Pending
from canzona.plan.buckets import BufferLayout, ParamSlot
from canzona.plan.types import Plan


class FlatBuffers:
    def __init__(self, model: nn.Module, plan: Plan, device: torch.device):
        self.layout: BufferLayout = plan.layout
        self.params = [p for _, p in model.named_parameters()]
        assert len(self.params) == len(plan.params), "model and plan disagree on the parameter list"
        self.param_buf = torch.zeros(self.layout.numel, dtype=torch.float32, device=device)
        self.grad_buf = torch.zeros_like(self.param_buf)
        self.slots: dict[int, ParamSlot] = {}
        self.bucket_of: dict[int, int] = {}
        for bucket in self.layout.buckets:
            for slot in bucket.params:
                self.slots[slot.index] = slot
                self.bucket_of[slot.index] = bucket.index
        with torch.no_grad():
            for i, p in enumerate(self.params):
                view = self.param_view(i)
                view.copy_(p.detach())
                p.data = view
        self._hooks: list = []
        self._reduce: Callable[[int], Pending] | None = None
        self._pending: dict[int, Pending] = {}
        self._ready: list[int] = [0] * len(self.layout.buckets)
        self._next_bucket = 0
        self._overlap = True
        self._tp_allreduce: set[int] = set()
        self._tp_group: dist.ProcessGroup | None = None

    # ---- views
    def param_view(self, index: int) -> torch.Tensor:
        s = self.slots[index]
        return self.param_buf[s.start : s.end].view(self.params[index].shape)

    def grad_view(self, index: int) -> torch.Tensor:
        s = self.slots[index]
        return self.grad_buf[s.start : s.end].view(self.params[index].shape)

    # ---- gradient hooks
    def install_hooks(
        self,
        reduce_bucket: Callable[[int], Pending],
        *,
        overlap: bool,
        tp_allreduce: set[int],
        tp_group: dist.ProcessGroup | None,
    ) -> None:
        """`reduce_bucket(b)` issues bucket b's DP reduction and returns its pending handle."""
        self._reduce, self._overlap = reduce_bucket, overlap
        self._tp_allreduce, self._tp_group = tp_allreduce, tp_group
        for i, p in enumerate(self.params):
            self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            grad = param.grad
            if index in self._tp_allreduce and self._tp_group is not None:
                dist.all_reduce(grad, group=self._tp_group)  # partial per TP rank (q/k-norm)
            self.grad_view(index).add_(grad)
            param.grad = None
            b = self.bucket_of[index]
            self._ready[b] += 1
            if self._overlap:
                self._launch_ready()

        return hook

    def _launch_ready(self) -> None:
        assert self._reduce is not None
        while self._next_bucket < len(self.layout.buckets):
            b = self._next_bucket
            if self._ready[b] < len(self.layout.buckets[b].params):
                return
            self._pending[b] = self._reduce(b)
            self._next_bucket += 1

    def start_step(self) -> None:
        self.grad_buf.zero_()
        self._ready = [0] * len(self.layout.buckets)
        self._next_bucket = 0
        self._pending = {}

    def mark_all_ready(self) -> None:
        """Treat every gradient as produced (when grads were written without backward)."""
        self._ready = [len(b.params) for b in self.layout.buckets]

    def finish_grad_sync(self) -> None:
        """Issue what backward did not, then wait for every bucket's reduction."""
        missing = [b.index for b, n in zip(self.layout.buckets, self._ready) if n < len(b.params)]
        if missing:
            raise RuntimeError(f"buckets {missing} did not receive every gradient (unused parameters?)")
        self._launch_ready()
        for b in sorted(self._pending):
            self._pending[b].wait()
        self._pending = {}

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
