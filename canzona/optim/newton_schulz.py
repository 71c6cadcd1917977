"""Quintic Newton–Schulz orthogonalisation, as in Keller Jordan's Muon / torch.optim.Muon.

Two paths, and why the exact one is the default.

`newton_schulz` works one matrix at a time by default, on purpose. A stacked ``torch.bmm`` /
``baddbmm`` over several matrices may give other last bits for a matrix than a call on that
matrix alone: the BLAS picks its blocking, kernels and threading per call and per batch. On the
Xeon this was written on (torch 2.13, MKL 2024.2, AVX-512) ``baddbmm`` over 16 matrices of
96 x 96 already differs from ``addmm`` on each, while other shapes agree; nothing in torch or
any BLAS promises either way, so no bit-exactness claim for a stacked GEMM can hold on every
x86 CPU and BLAS. The distributed methods rely on a matrix's update not depending on what it
is computed with (an owner updates a subset of the matrices the single-process reference
updates), and the parity tests (tests/dist/test_parity.py) check them bit for bit in fp32, so
the default keeps one call per matrix. Megatron's Muon also works parameter by parameter.

``newton_schulz(stack, stacked=True)`` runs the same iteration on a stack of equal-shape
matrices, (B, m, n), with one ``bmm`` / ``baddbmm`` per product: the per-call overhead (Python,
dispatch, a GPU launch) is paid once for the B matrices instead of B times, which is what
decides the step of an MoE rank owning hundreds of small expert matrices. It is opt-in
(``optimizer.batch_equal_shapes=true``) and exact only up to rounding. Its tolerance, derived
rather than picked: each GEMM of inner dimension k is within γ_k·|A||B| of the exact product
(γ_k = k·u / (1 - k·u), u the unit roundoff; Higham, Thm 3.5) whatever its summation order, so
the batched and the one-at-a-time results are two evaluations of the same function with
errors of the same size. A worst-case propagation of γ_k through five quintic steps (whose
Fréchet-derivative bound, |a| + 3|b|σ² + 5|c|σ⁴ at σ <= 1.2, is about 45 per step) is too
loose to use (45⁵), so the claim tested (tests/unit/test_batched_muon.py) is relative:
measured against the same iteration in float64, the batched result is as accurate as the
one-at-a-time one (its largest error within 4x of the exact path's; about equal in practice),
hence the two differ by at most 5x the exact path's own rounding error. In fp32 that error is
about 1e-6 on entries of up to ~0.4 (measured at 64..512-wide matrices): far below anything
training can see, but not bit parity, so a parity test of a distributed method runs the
default path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # keys: definitions.NS_DTYPE_NAMES
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(
    x: Tensor,
    coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
    stacked: bool = False,
) -> Tensor:
    """Approximate the orthogonal factor U Vᵀ of ``x``: shape (m, n), or (B, m, n) for each of B.

    The matrix is normalised by its Frobenius norm and, when tall, transposed so that the Gram
    matrix X Xᵀ is the small one. The same ops in the same order as torch.optim.Muon. Returns a
    tensor of ``x``'s shape in ``dtype``. A (B, m, n) stack is orthogonalised one matrix at a
    time (exact), or with ``stacked`` by one bmm / baddbmm per product over the whole stack, each
    matrix with its own norm: equal up to rounding only (see the module docstring).
    """
    if x.ndim == 3 and not stacked:
        return torch.stack([newton_schulz(m, coefficients, steps, eps, dtype) for m in x])
    if x.ndim != (3 if stacked else 2):
        want = "(B, m, n) with stacked=True" if stacked else "(m, n) or (B, m, n)"
        raise ValueError(f"newton_schulz takes {want}, got shape {tuple(x.shape)}")
    a, b, c = coefficients
    tall = x.size(-2) > x.size(-1)
    X = x.to(dtype)
    if tall:
        X = X.mT
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True) if stacked else torch.linalg.vector_norm(X)
    X = X / norm.clamp(min=eps)
    addmm = torch.baddbmm if stacked else torch.addmm
    for _ in range(steps):
        gram = X @ X.mT
        poly = addmm(gram, gram, gram, beta=b, alpha=c)
        X = addmm(X, poly, X, beta=a)
    return X.mT if tall else X


def newton_schulz_sharded(
    x: Tensor,
    sharded_dim: int,
    reduce: Callable[[Tensor], Tensor],
    coefficients: tuple[float, float, float] = MUON_COEFFICIENTS,
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """This shard's part of `newton_schulz` of a matrix cut along ``sharded_dim`` into shards
    held apart, as Megatron's ``muon_tp_mode="distributed"`` computes it
    (emerging-optimizers 0.3.0, ``newton_schulz_tp``).

    ``reduce(t)`` sums ``t`` over every shard's copy in place and returns it; whoever holds the
    shards supplies it (the executor: an all-reduce over the TP group; a test: a sum), so this
    knows nothing of ranks. The Gram product is taken over the *unsharded* side, so that the
    shards' partial products sum to the whole matrix's Gram: a row-sharded shard (``sharded_dim``
    0, column-parallel) is transposed first, a column-sharded one (row-parallel) is not --
    whichever side is shorter (Megatron's rule: when the unsharded side is the longer one the
    iteration runs on the long side, equal in exact arithmetic since
    (X Xᵀ) X = X (Xᵀ X)). Per call: one ``reduce`` of the sum of squares for the Frobenius norm
    (one element, float32, or ``dtype`` if wider), then one of each step's Gram product
    (``dtype``, u×u with u the unsharded side). Returns the shard of the orthogonalised
    matrix, in ``dtype``.
    """
    if x.ndim != 2 or sharded_dim not in (0, 1):
        raise ValueError(f"newton_schulz_sharded takes an (m, n) shard cut along dim 0 or 1, got shape "
                         f"{tuple(x.shape)} and sharded_dim={sharded_dim}")
    a, b, c = coefficients
    X = x.to(dtype)
    if sharded_dim == 0:
        X = X.mT
    # the sum of squares at least in float32 (a bfloat16 iteration's too, as Megatron's)
    sumsq = reduce(X.to(torch.promote_types(X.dtype, torch.float32)).square().sum().reshape(1))
    X = X / sumsq.sqrt().clamp(min=eps).to(dtype)
    for _ in range(steps):
        gram = reduce(X @ X.mT)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        X = torch.addmm(X, poly, X, beta=a)
    return X.mT if sharded_dim == 0 else X
