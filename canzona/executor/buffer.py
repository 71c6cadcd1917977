"""Flat parameter and gradient buffers with the planner's bucket layout.

Every TP-local parameter becomes a view into one flat parameter buffer of the model's dtype (so
a DP all-gather writes straight into the model's weights) and gets a slot in a flat fp32
gradient buffer (Megatron accumulates and reduces gradients in fp32 under bf16 too). A
post-accumulate-grad hook moves each gradient into its slot as backward produces it; once every
param of a bucket has its gradient -- and every earlier bucket is already out, so that all ranks
issue the same collectives in the same order -- ``on_bucket_ready(b)`` is called (the runtime
issues what the program's hook for that bucket says), overlapping the rest of backward as
Megatron's DDP does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from canzona.plan.buckets import BufferLayout, ParamSlot


class FlatBuffers:
    """``params`` in the layout's index order; ``chains``: bucket ranges [first, end) each handed
    out strictly in order on its own (an MoE rank's dense and expert buffers; default: one chain)."""

    def __init__(self, params: Sequence[nn.Parameter], layout: BufferLayout, device: torch.device,
                 param_dtype: torch.dtype = torch.float32, chains: Sequence[tuple[int, int]] | None = None):
        self.layout = layout
        self.params = list(params)
        n_slots = sum(len(b.params) for b in layout.buckets)
        if len(self.params) != n_slots:
            raise ValueError(f"the model has {len(self.params)} parameters, the plan's layout {n_slots}")
        self.chains = tuple(chains) if chains is not None else ((0, len(layout.buckets)),)
        self._chain_of = {b: k for k, (lo, hi) in enumerate(self.chains) for b in range(lo, hi)}
        self.param_buf = torch.zeros(layout.numel, dtype=param_dtype, device=device)
        self.grad_buf = torch.zeros(layout.numel, dtype=torch.float32, device=device)
        self.slots: dict[int, ParamSlot] = {}
        self.bucket_of: dict[int, int] = {}
        for bucket in layout.buckets:
            for slot in bucket.params:
                self.slots[slot.index] = slot
                self.bucket_of[slot.index] = bucket.index
        with torch.no_grad():
            for i, p in enumerate(self.params):
                view = self.param_view(i)
                view.copy_(p.detach())
                p.data = view
        self._ready = [0] * len(layout.buckets)
        self._next_bucket = [lo for lo, _ in self.chains]  # per chain, the next bucket to hand out
        self._on_ready: Callable[[int], None] | None = None
        self._armed = True  # count arrivals and hand out full buckets (the last micro-batch)
        self._on_grad: Callable[[int, torch.Tensor], torch.Tensor] | None = None

    # ---- views
    def param_view(self, index: int) -> torch.Tensor:
        s = self.slots[index]
        return self.param_buf[s.start : s.end].view(self.params[index].shape)

    def grad_view(self, index: int) -> torch.Tensor:
        s = self.slots[index]
        return self.grad_buf[s.start : s.end].view(self.params[index].shape)

    # ---- gradient hooks
    def install_hooks(
        self, on_bucket_ready: Callable[[int], None] | None, on_grad: Callable[[int, torch.Tensor], torch.Tensor] | None
    ) -> None:
        """``on_grad(i, grad)`` runs on each gradient before it lands and returns what lands (e.g.
        a TP all-reduce of a partial gradient, in fp32); ``on_bucket_ready(b)`` once bucket b may
        be reduced (None: never)."""
        self._on_ready, self._on_grad = on_bucket_ready, on_grad
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._make_hook(i))

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            grad = param.grad
            if self._on_grad is not None:
                grad = self._on_grad(index, grad)
            self.grad_view(index).add_(grad)
            param.grad = None
            if self._armed:
                b = self.bucket_of[index]
                self._ready[b] += 1
                self.launch_ready(self._chain_of[b])

        return hook

    def launch_ready(self, chain: int) -> None:
        """Hand out every full bucket of ``chain`` whose predecessors in it are out (strictly in
        order)."""
        if self._on_ready is None:
            return
        end = self.chains[chain][1]
        while self._next_bucket[chain] < end:
            b = self._next_bucket[chain]
            if self._ready[b] < len(self.layout.buckets[b].params):
                break
            self._next_bucket[chain] += 1
            self._on_ready(b)

    def arm(self, on: bool) -> None:
        """Gradient accumulation: earlier micro-batches only accumulate into the buffer; the last
        one's gradients also count towards handing out full buckets."""
        self._armed = on

    def start_step(self) -> None:
        self.grad_buf.zero_()
        self._ready = [0] * len(self.layout.buckets)
        self._next_bucket = [lo for lo, _ in self.chains]

    def check_complete(self) -> None:
        missing = [b.index for b, n in zip(self.layout.buckets, self._ready) if n < len(b.params)]
        if missing:
            raise RuntimeError(f"buckets {missing} did not receive every gradient (unused parameters?)")
