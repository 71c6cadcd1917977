"""SOAP (Vyas et al. 2024): Adam run in the eigenbasis of Shampoo's factors.

Per matrix: L, R are EMAs (beta2) of G Gᵀ and Gᵀ G; the bases Q_L, Q_R come from eigh on
step 1 and are refreshed on steps 1+f, 1+2f, ... (f = ``precondition_frequency``) by one power
iteration plus QR, as in the paper's reference code. As there, the second moment lives in the
rotated basis (reordered with the eigenvalue estimates on refresh) and the first moment in the
original basis, projected each step, which equals rotating it on every basis change. Factors are
updated after the step so the projection never uses the current gradient, except on step 1,
which seeds them first so that it already takes a step (the reference code skips step 1).

Matrices (and the blocks of a matrix with a side over ``max_preconditioner_dim``, see
`canzona.optim.kronecker`) are updated one at a time, so an update never depends on the other
matrices of the call (batched eigh / QR / matmuls may round differently per batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from canzona.optim.definitions import MAX_PRECONDITIONER_DIM
from canzona.optim.kronecker import KroneckerRule, is_refresh_step
from canzona.optim.rule import Settings


def eigenbasis(mat: Tensor) -> Tensor:
    """Eigenvectors of a symmetric matrix, columns by descending eigenvalue (eigh in >= float32)."""
    return torch.linalg.eigh(mat.float()).eigenvectors.flip(-1).to(mat.dtype)


def power_qr(mat: Tensor, basis: Tensor) -> tuple[Tensor, Tensor]:
    """One power iteration + QR from ``basis``; returns the new basis and the column order used.

    Columns are first sorted by their Rayleigh quotients (descending) so the new basis keeps
    the eigenvalue order and the second moment can be permuted to match.
    """
    estimates = (basis * (mat @ basis)).sum(-2)
    order = torch.argsort(estimates, dim=-1, descending=True, stable=True)
    basis = basis[:, order]
    return torch.linalg.qr((mat @ basis).float()).Q.to(mat.dtype), order


class SOAP(KroneckerRule):
    name = "SOAP"
    left = "Q_L"
    right = "Q_R"

    def __init__(
        self,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        precondition_frequency: int = 10,
        max_preconditioner_dim: int = MAX_PRECONDITIONER_DIM,
    ) -> None:
        super().__init__(betas, eps, precondition_frequency, max_preconditioner_dim)

    @classmethod
    def from_config(cls, opt: Settings) -> SOAP:
        return cls(opt.betas, opt.eps, opt.precondition_frequency, opt.max_preconditioner_dim)

    def block_update(self, G: Tensor, s: dict[str, Tensor], step: int) -> Tensor:
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        if step == 1:
            self._update_factors(s, G)
            s["Q_L"].copy_(eigenbasis(s["L"]))
            s["Q_R"].copy_(eigenbasis(s["R"]))
        elif is_refresh_step(step, self.precondition_frequency):
            Q_L, rows = power_qr(s["L"], s["Q_L"])
            Q_R, cols = power_qr(s["R"], s["Q_R"])
            s["Q_L"].copy_(Q_L)
            s["Q_R"].copy_(Q_R)
            v = s["exp_avg_sq"]
            v.copy_(v[rows][:, cols])
        Q_L, Q_R = s["Q_L"], s["Q_R"]
        s["exp_avg"].lerp_(G, 1 - beta1)
        G_rot = Q_L.mT @ G @ Q_R
        s["exp_avg_sq"].mul_(beta2).addcmul_(G_rot, G_rot, value=1 - beta2)
        m_rot = (Q_L.mT @ s["exp_avg"] @ Q_R).div_(bias_correction1)
        N = m_rot / s["exp_avg_sq"].div(bias_correction2).sqrt_().add_(self.eps)
        U = Q_L @ N @ Q_R.mT
        if step > 1:
            self._update_factors(s, G)
        return U

    def _update_factors(self, s: dict[str, Tensor], G: Tensor) -> None:
        beta2 = self.betas[1]
        s["L"].lerp_(G @ G.mT, 1 - beta2)
        s["R"].lerp_(G.mT @ G, 1 - beta2)
