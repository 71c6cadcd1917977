"""Quintic Newton–Schulz orthogonalisation, as in Keller Jordan's Muon / torch.optim.Muon.

One matrix at a time, on purpose. A stacked ``torch.bmm`` over several matrices may give
other last bits for a matrix than a call on that matrix alone (the BLAS picks its blocking and
kernels per call; seen on an Intel Xeon), and the distributed methods rely on a matrix's
update not depending on what it is computed with: an owner updates a subset of the matrices
that the single-process reference updates. Megatron's Muon also works parameter by parameter.
"""

from __future__ import annotations

import torch
from torch import Tensor

NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # keys: definitions.NS_DTYPE_NAMES


def newton_schulz(
    x: Tensor,
    coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Approximate the orthogonal factor U Vᵀ of ``x`` (shape (m, n), or (B, m, n): each alone).

    The matrix is normalised by its Frobenius norm and, when tall, transposed so that the Gram
    matrix X Xᵀ is the small one. The same ops in the same order as torch.optim.Muon. Returns a
    tensor of ``x``'s shape in ``dtype``.
    """
    if x.ndim == 3:
        return torch.stack([newton_schulz(m, coefficients, steps, eps, dtype) for m in x])
    if x.ndim != 2:
        raise ValueError(f"newton_schulz takes (m, n) or (B, m, n), got shape {tuple(x.shape)}")
    a, b, c = coefficients
    tall = x.size(0) > x.size(1)
    X = x.to(dtype)
    if tall:
        X = X.mT
    X = X / torch.linalg.vector_norm(X).clamp(min=eps)
    for _ in range(steps):
        gram = X @ X.mT
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        X = torch.addmm(X, poly, X, beta=a)
    return X.mT if tall else X
