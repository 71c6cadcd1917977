"""Gradient-norm clipping maths (Megatron's ``clip_grad_norm``), shared by every distributed
method and the single-process reference so that they clip alike.

Two accumulations (``optimizer.clip_norm_dtype``):

- ``float32`` (default): what Megatron does -- per-tensor fp32 L2 norms in one multi-tensor
  kernel (``torch._foreach_norm``, as apex's ``multi_tensor_l2norm``), squared and summed in
  fp32, the per-rank sums all-reduced in fp32. Ranks that split the buffer differently from the
  single process sum in another order, so the norm (and the clip coefficient) can differ from
  the reference's in the last bits: parity with the reference then holds to a relative
  tolerance, not bit for bit.
- ``float64``: the sum of squares in float64, which is exact for the coarse binary-grid
  gradients of the step-parity tests in any order (squares of fp32 values are exact in float64)
  -- their bit-for-bit mode. About 30x slower on a CPU (an fp64 pass over a copy of the
  gradient), so it is not what a measurement should time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

CHUNK = 1 << 24  # elements converted to float64 at a time (bounds the transient memory)
EPS = 1.0e-6  # Megatron: clip_coeff = max_norm / (total_norm + 1.0e-6)


def sum_of_squares(tensors: Iterable[Tensor], dtype: str = "float64") -> Tensor:
    """Sum of squares of all elements in ``dtype`` (``float32``: Megatron's multi-tensor norm;
    ``float64``: exact accumulation), a 0-d tensor on the tensors' device."""
    if dtype == "float32":
        ts = [t.reshape(-1) for t in tensors if t.numel()]
        if not ts:
            return torch.zeros((), dtype=torch.float32)
        norms = torch._foreach_norm([t if t.dtype == torch.float32 else t.float() for t in ts])
        return torch.stack(norms).square().sum()
    total: Tensor | None = None
    for t in tensors:
        flat = t.reshape(-1)
        for k in range(0, flat.numel(), CHUNK):
            part = flat[k : k + CHUNK].double().square().sum()
            total = part if total is None else total + part
    return total if total is not None else torch.zeros((), dtype=torch.float64)


def clip_coefficient(sumsq: float, max_norm: float) -> float | None:
    """The factor to scale gradients by, or None when the norm is within ``max_norm`` (or
    clipping is off: ``max_norm <= 0``)."""
    if max_norm <= 0:
        return None
    coef = max_norm / (math.sqrt(sumsq) + EPS)
    return coef if coef < 1.0 else None
