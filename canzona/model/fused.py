"""RMSNorm and SwiGLU keeping for backward what Megatron's fused kernels keep.

Written as plain torch ops, autograd would save every intermediate: an fp32 RMSNorm keeps the
upcast input, the normalised input and the product (several fp32 copies of a bf16 activation),
and SwiGLU keeps ``silu(gate)`` beside its input. Transformer Engine's RMSNorm saves only the
input and the fp32 reciprocal RMS, Megatron's fused ``bias_swiglu`` only its input; both
recompute the rest in backward (in fp32). These autograd functions do the same, so activation memory (and
the dry run's count of it) is a Megatron run's. The forward is the same arithmetic as the plain
ops, bit for bit; the backward is the analytic gradient, computed in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (weight.float() * (xf * rstd)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        grad_weight = (g * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        gxhat = g * weight.float()
        grad_x = rstd * (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight · x / rms(x)`` in fp32, returned in ``x``'s dtype; saves ``x`` and the fp32 1/rms."""
    return _RMSNorm.apply(x, weight, eps)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        return F.silu(h[..., 0::2]) * h[..., 1::2]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (h,) = ctx.saved_tensors
        gate, up, g = h[..., 0::2].float(), h[..., 1::2].float(), grad.float()
        sig = torch.sigmoid(gate)
        grad_h = torch.empty_like(h)
        grad_h[..., 0::2] = g * up * sig * (1 + gate * (1 - sig))
        grad_h[..., 1::2] = g * gate * sig
        return grad_h


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """``silu(gate) · up`` of fc1's interleaved output (row 2i gate_i, 2i+1 up_i); saves only ``h``."""
    return _SwiGLU.apply(h)
