"""Batched quintic Newton–Schulz orthogonalisation, as in Keller Jordan's Muon / torch.optim.Muon."""

from __future__ import annotations

import torch
from torch import Tensor

NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def newton_schulz(
    x: Tensor,
    coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Approximate the orthogonal factor U Vᵀ of each matrix in ``x`` (shape (m, n) or (B, m, n)).

    Each matrix is normalised by its own Frobenius norm, so results are per-matrix: a matrix
    gives the same answer alone or stacked with others. Tall matrices are transposed so the Gram
    matrix X Xᵀ is the small one. Returns a tensor of ``x``'s shape in ``dtype``.
    """
    if x.ndim == 2:
        return newton_schulz(x.unsqueeze(0), coefficients, steps, eps, dtype).squeeze(0)
    if x.ndim != 3:
        raise ValueError(f"newton_schulz takes (m, n) or (B, m, n), got shape {tuple(x.shape)}")
    a, b, c = coefficients
    tall = x.size(-2) > x.size(-1)
    X = x.to(dtype)
    if tall:
        X = X.mT
    X = X / torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = torch.bmm(X, X.mT)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        X = torch.baddbmm(X, poly, X, beta=a)
    return X.mT if tall else X
