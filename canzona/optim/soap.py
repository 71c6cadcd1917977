"""SOAP (Vyas et al. 2024): Adam run in the eigenbasis of Shampoo's factors.

Per matrix: L, R are EMAs (beta2) of G Gᵀ and Gᵀ G; the bases Q_L, Q_R come from eigh on
step 1 and are refreshed on steps 1+f, 1+2f, ... (f = ``precondition_frequency``) by one power
iteration plus QR, as in the paper's reference code. As there, the second moment lives in the
rotated basis (reordered with the eigenvalue estimates on refresh) and the first moment in the
original basis, projected each step, which equals rotating it on every basis change. Factors are
updated after the step so the projection never uses the current gradient, except on step 1,
which seeds them first so that it already takes a step (the reference code skips step 1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from canzona.config import OptimizerSection
from canzona.optim.base import UpdateRule, check_matrices, group_by_shape
from canzona.optim.shampoo import is_refresh_step, kronecker_state


def eigenbasis(mats: Tensor) -> Tensor:
    """Batched eigenvectors of symmetric matrices, columns by descending eigenvalue (eigh in >= float32)."""
    return torch.linalg.eigh(mats.float()).eigenvectors.flip(-1).to(mats.dtype)


def power_qr(mats: Tensor, basis: Tensor) -> tuple[Tensor, Tensor]:
    """One power iteration + QR from ``basis``; returns the new basis and the column order used.

    Columns are first sorted by their Rayleigh quotients (descending) so the new basis keeps
    the eigenvalue order and the second moment can be permuted to match.
    """
    estimates = (basis * (mats @ basis)).sum(-2)
    order = torch.argsort(estimates, dim=-1, descending=True, stable=True)
    basis = basis.gather(-1, order.unsqueeze(-2).expand_as(basis))
    return torch.linalg.qr((mats @ basis).float()).Q.to(mats.dtype), order


class SOAP(UpdateRule):
    elementwise = False

    def __init__(
        self,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        precondition_frequency: int = 10,
    ) -> None:
        if precondition_frequency < 1:
            raise ValueError(f"precondition_frequency={precondition_frequency} must be >= 1")
        self.betas = betas
        self.eps = eps
        self.precondition_frequency = precondition_frequency

    @classmethod
    def from_config(cls, opt: OptimizerSection) -> SOAP:
        return cls(opt.betas, opt.eps, opt.precondition_frequency)

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        return kronecker_state(shape, device, dtype, "Q_L", "Q_R")

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        check_matrices(grads, "SOAP")
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        refresh = is_refresh_step(step, self.precondition_frequency)
        out: list[Tensor] = [torch.empty(0)] * len(grads)
        for idx in group_by_shape(grads):
            st = [states[i] for i in idx]
            G = torch.stack([grads[i] for i in idx])
            s = {k: torch.stack([x[k] for x in st]) for k in st[0]}
            if step == 1:
                self._update_factors(s, G)
                s["Q_L"], s["Q_R"] = eigenbasis(s["L"]), eigenbasis(s["R"])
            elif refresh:
                s["Q_L"], rows = power_qr(s["L"], s["Q_L"])
                s["Q_R"], cols = power_qr(s["R"], s["Q_R"])
                v = s["exp_avg_sq"]
                v = v.gather(-2, rows.unsqueeze(-1).expand_as(v)).gather(-1, cols.unsqueeze(-2).expand_as(v))
                s["exp_avg_sq"] = v
            Q_L, Q_R = s["Q_L"], s["Q_R"]
            s["exp_avg"].lerp_(G, 1 - beta1)
            G_rot = Q_L.mT @ G @ Q_R
            s["exp_avg_sq"].mul_(beta2).addcmul_(G_rot, G_rot, value=1 - beta2)
            m_rot = (Q_L.mT @ s["exp_avg"] @ Q_R).div_(bias_correction1)
            N = m_rot / s["exp_avg_sq"].div(bias_correction2).sqrt_().add_(self.eps)
            U = Q_L @ N @ Q_R.mT
            if step > 1:
                self._update_factors(s, G)
            changed = ["exp_avg", "exp_avg_sq", "L", "R"] + (["Q_L", "Q_R"] if refresh else [])
            for j, x in enumerate(st):
                for k in changed:
                    x[k].copy_(s[k][j])
                out[idx[j]] = U[j].to(grads[idx[j]].dtype)
        return out

    def _update_factors(self, s: dict[str, Tensor], G: Tensor) -> None:
        beta2 = self.betas[1]
        s["L"].lerp_(G @ G.mT, 1 - beta2)
        s["R"].lerp_(G.mT @ G, 1 - beta2)
