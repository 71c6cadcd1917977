"""Gradient-norm clipping maths (Megatron's ``clip_grad_norm``), shared by every distributed
method and the single-process reference so that they clip identically.

The sum of squares is accumulated in float64: squares of fp32 values are exact in float64 and
the accumulation error is ~1e-16 relative, so ranks that sum their parts in a different order
than the reference get the same norm, and the same fp32 coefficient, except when the float64
value lies within that error of an fp32 rounding boundary. (On gradients of a coarse binary
grid, as the parity tests use, the float64 sum is exact in any order.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

CHUNK = 1 << 24  # elements converted to float64 at a time (bounds the transient memory)
EPS = 1.0e-6  # Megatron: clip_coeff = max_norm / (total_norm + 1.0e-6)


def sum_of_squares(tensors: Iterable[Tensor]) -> Tensor:
    """Float64 sum of squares of all elements (a 0-d tensor on the tensors' device)."""
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
