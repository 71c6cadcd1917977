"""Elementwise AdamW through torch's fused kernel, bit-identical on any slicing of a tensor.

ZeRO-1 runs AdamW on flat shards cut anywhere inside a tensor while the single-process
reference runs it on whole tensors, so an element's result must not depend on where its tensor
or shard starts and ends. ``torch._fused_adamw_`` on CPU is not slice-invariant as it stands:
it splits each tensor into 64-byte units (from the tensor's start) processed by a vectorised
body, and the last ``numel % vector_width`` elements by a scalar tail that is compiled
differently (the body's ``v·β2 + (1-β2)·g·g`` becomes a fused multiply-add, the tail's two
statements do not). Measured here on torch 2.13 under AVX2 and AVX-512: an element updated
through the tail differs from the same element in the body in ``exp_avg_sq`` 31 % of the time
and in the parameter 0.6 % of the time after 3 steps.

`fused_adamw_step` therefore never lets an element reach a tail: each tensor's leading multiple
of `ALIGN` elements goes to the kernel as a view (every unit and every vector full), and the
remaining < `ALIGN` elements of all tensors are packed into one zero-padded scratch tensor of a
multiple of `ALIGN` elements, updated by the same kernel, and copied back. Every element then
takes the vectorised path, whose lanes are independent, so the result is the same for any cut,
any thread count and any shard. ``ALIGN = 64`` elements is a multiple of every vector width
torch uses (8 or 16 fp32 lanes, up to 32 bf16 lanes on x86) and of its 64-byte units. tests/unit/test_optim.py checks this
on many odd offsets and lengths under each x86 CPU capability (default, AVX2, AVX-512) and
thread counts, and that the result equals ``torch.optim.AdamW(fused=True)`` on tensors of a
multiple of ``ALIGN`` elements.

The arithmetic is torch.optim.AdamW's: decoupled decay ``param *= 1 - lr·wd``, then
``param -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from canzona.optim.rule import Settings, UpdateRule

ALIGN = 64
# Two moment updates, bias corrections, sqrt, division, decoupled decay and the update itself.


def _flat(t: Tensor, what: str) -> Tensor:
    if not t.is_contiguous():
        raise ValueError(f"AdamW needs contiguous tensors; {what} of shape {tuple(t.shape)} is not")
    return t.view(-1)


def fused_adamw_step(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    step: int,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW step (1-based ``step``) in place on contiguous tensors of any shape (see the
    module docstring for why the result does not depend on how the tensors were cut)."""
    lists: tuple[list[Tensor], ...] = ([], [], [], [])
    tails: tuple[list[Tensor], ...] = ([], [], [], [])
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True):
        if g.dtype != p.dtype:
            g = g.to(p.dtype)
        group = (_flat(p, "a parameter"), _flat(g, "a gradient"), _flat(m, "exp_avg"), _flat(v, "exp_avg_sq"))
        n = group[0].numel()
        body = n - n % ALIGN
        # narrow, not t[a:b]: Python slicing of fake CUDA tensors fails on a CPU-only torch (dry runs)
        for out, t in zip(lists, group):
            if body:
                out.append(t.narrow(0, 0, body))
        for out, t in zip(tails, group):
            if body < n:
                out.append(t.narrow(0, body, n - body))
    scratch: list[Tensor] = []
    if tails[0]:
        pad = -sum(t.numel() for t in tails[0]) % ALIGN
        scratch = [torch.cat([*ts, ts[0].new_zeros(pad)]) for ts in tails]
        for out, s in zip(lists, scratch):
            out.append(s)
    if not lists[0]:
        return
    # one step tensor per entry, as the kernel wants (it only reads it)
    steps = [torch.tensor(float(step), device=lists[0][0].device)] * len(lists[0])
    beta1, beta2 = betas
    torch._fused_adamw_(
        *lists, [], steps, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
        amsgrad=False, maximize=False,
    )
    if scratch:
        offset = 0
        for k, tail in enumerate(tails[0]):
            n = tail.numel()
            for which in (0, 2, 3):  # param, exp_avg, exp_avg_sq (the grad is read only)
                tails[which][k].copy_(scratch[which].narrow(0, offset, n))
            offset += n


class AdamW(UpdateRule):
    """AdamW on whole tensors or any flat slice of one."""

    elementwise = True

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.betas = tuple(betas)
        self.eps = eps

    @classmethod
    def from_config(cls, opt: Settings) -> AdamW:
        return cls(betas=opt.betas, eps=opt.eps)

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        return {
            "exp_avg": torch.zeros(shape, device=device, dtype=dtype),
            "exp_avg_sq": torch.zeros(shape, device=device, dtype=dtype),
        }

    def step(
        self,
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Tensor]],
        step: int,
        lr: float,
        weight_decay: float,
    ) -> None:
        fused_adamw_step(
            params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], step,
            lr=lr, betas=self.betas, eps=self.eps, weight_decay=weight_decay,
        )

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        """The step as a direction, ``-(step of a zero parameter at lr 1)``, with the same moment
        updates as `step` (for callers that time or test the unfused contract)."""
        zeros = [torch.zeros_like(g) for g in grads]
        self.step(zeros, grads, states, step, lr=1.0, weight_decay=0.0)
        return [z.neg_() for z in zeros]
