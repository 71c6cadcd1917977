"""canzona.model.fused: the same forward as the plain ops, bit for bit; the analytic backward
matches autograd's through the plain ops (fp32: to rounding; float64 inputs are computed in fp32
too, so the check is against autograd at the same precision, not gradcheck's finite differences);
and only the inputs are kept for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from canzona.model import fused


def _plain_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * xf).to(x.dtype)


def _plain_swiglu(h: torch.Tensor) -> torch.Tensor:
    return F.silu(h[..., 0::2]) * h[..., 1::2]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rms_norm_is_the_plain_norm_with_its_gradients(dtype: torch.dtype, tol: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 96, generator=g).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype).requires_grad_()
    gy = torch.randn(4, 6, 96, generator=g).to(dtype)
    y, ref = fused.rms_norm(x, w, 1e-6), _plain_norm(x, w, 1e-6)
    assert torch.equal(y, ref)
    for a, b in zip(torch.autograd.grad(y, (x, w), gy), torch.autograd.grad(ref, (x, w), gy)):
        assert a.dtype == b.dtype and _rel(a, b) <= tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_swiglu_is_the_plain_swiglu_with_its_gradient(dtype: torch.dtype, tol: float) -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(4, 6, 128, generator=g).to(dtype).requires_grad_()
    gz = torch.randn(4, 6, 64, generator=g).to(dtype)
    z, ref = fused.swiglu(h), _plain_swiglu(h)
    assert torch.equal(z, ref)
    a, b = torch.autograd.grad(z, h, gz)[0], torch.autograd.grad(ref, h, gz)[0]
    assert a.dtype == b.dtype and _rel(a, b) <= tol


def test_only_the_inputs_are_kept_for_backward() -> None:
    """What autograd keeps alive: the plain fp32 norm of a bf16 input keeps fp32 copies, the fused
    one the input and one fp32 scalar per row; the plain SwiGLU keeps silu(gate) too."""
    def saved_bytes(fn, *args) -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*args)
        return sum(seen.values())

    x = torch.randn(8, 32, 256).to(torch.bfloat16).requires_grad_()
    w = torch.ones(256, dtype=torch.bfloat16, requires_grad=True)
    rows = 8 * 32
    assert saved_bytes(fused.rms_norm, x, w, 1e-6) == x.nbytes + w.nbytes + 4 * rows
    assert saved_bytes(_plain_norm, x, w, 1e-6) > 2 * x.nbytes + w.nbytes + 4 * rows
    h = torch.randn(8, 32, 512).to(torch.bfloat16).requires_grad_()
    assert saved_bytes(fused.swiglu, h) == h.nbytes
    assert saved_bytes(_plain_swiglu, h) >= 1.5 * h.nbytes
