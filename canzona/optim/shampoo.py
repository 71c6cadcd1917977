"""Shampoo with Adam grafting: P = L^{-1/4} M R^{-1/4}, rescaled to the Adam update's norm.

L and R accumulate G Gᵀ and Gᵀ G (a plain sum, as in the original Shampoo); their inverse 4th
roots come from a symmetric eigendecomposition recomputed on steps 1, 1+f, 1+2f, ... where f is
``precondition_frequency``. M is the bias-corrected first moment of the gradient. Grafting
borrows the step size of Adam (same moments), so Shampoo only chooses the direction. Matrices
(and the blocks of a matrix with a side over ``max_preconditioner_dim``, see
`canzona.optim.kronecker`) are updated one at a time, so an update never depends on the other
matrices of the call: a stacked ``torch.bmm`` or batched ``eigh`` may round a matrix
differently from a call on it alone, depending on the BLAS and the CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from canzona.optim.definitions import MAX_PRECONDITIONER_DIM
from canzona.optim.kronecker import KroneckerRule, is_refresh_step
from canzona.optim.rule import Settings


def inverse_root(mat: Tensor, root: int, eps: float) -> Tensor:
    """``(A + eps I)^{-1/root}`` of a symmetric PSD matrix via eigh (negative eigenvalues clamped to 0).

    eigh has no half-precision kernels, so low-precision factors are decomposed in float32.
    """
    eigvals, eigvecs = torch.linalg.eigh(mat.float())
    scale = (eigvals.clamp(min=0) + eps).pow(-1.0 / root)
    return ((eigvecs * scale.unsqueeze(-2)) @ eigvecs.mT).to(mat.dtype)


class Shampoo(KroneckerRule):
    name = "Shampoo"
    left = "L_inv_root"
    right = "R_inv_root"

    def __init__(
        self,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        precondition_frequency: int = 10,
        shampoo_eps: float = 1e-12,
        max_preconditioner_dim: int = MAX_PRECONDITIONER_DIM,
    ) -> None:
        super().__init__(betas, eps, precondition_frequency, max_preconditioner_dim)
        self.shampoo_eps = shampoo_eps

    @classmethod
    def from_config(cls, opt: Settings) -> Shampoo:
        return cls(opt.betas, opt.eps, opt.precondition_frequency, opt.shampoo_eps, opt.max_preconditioner_dim)

    def block_update(self, G: Tensor, s: dict[str, Tensor], step: int) -> Tensor:
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        s["exp_avg"].lerp_(G, 1 - beta1)
        s["exp_avg_sq"].mul_(beta2).addcmul_(G, G, value=1 - beta2)
        s["L"].addmm_(G, G.mT)
        s["R"].addmm_(G.mT, G)
        if is_refresh_step(step, self.precondition_frequency):
            s["L_inv_root"].copy_(inverse_root(s["L"], 4, self.shampoo_eps))
            s["R_inv_root"].copy_(inverse_root(s["R"], 4, self.shampoo_eps))
        m_hat = s["exp_avg"] / bias_correction1
        adam = m_hat / s["exp_avg_sq"].div(bias_correction2).sqrt_().add_(self.eps)
        P = s["L_inv_root"] @ m_hat @ s["R_inv_root"]
        return P.mul_(_frobenius(adam) / _frobenius(P).clamp(min=torch.finfo(P.dtype).tiny))


def _frobenius(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x)
