"""Shampoo with Adam grafting: P = L^{-1/4} M R^{-1/4}, rescaled to the Adam update's norm.

L and R accumulate G Gᵀ and Gᵀ G (a plain sum, as in the original Shampoo); their inverse 4th
roots come from a symmetric eigendecomposition recomputed on steps 1, 1+f, 1+2f, ... where f is
``precondition_frequency``. M is the bias-corrected first moment of the gradient. Grafting
borrows the step size of Adam (same moments), so Shampoo only chooses the direction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from canzona.config import OptimizerSection
from canzona.optim.base import UpdateRule, check_matrices, group_by_shape


def is_refresh_step(step: int, frequency: int) -> bool:
    """Steps 1, 1+f, 1+2f, ...: the first step always has a preconditioner."""
    return (step - 1) % frequency == 0


def inverse_root(mats: Tensor, root: int, eps: float) -> Tensor:
    """Batched ``(A + eps I)^{-1/root}`` of symmetric PSD matrices via eigh (negative eigenvalues clamped to 0).

    eigh has no half-precision kernels, so low-precision factors are decomposed in float32.
    """
    eigvals, eigvecs = torch.linalg.eigh(mats.float())
    scale = (eigvals.clamp(min=0) + eps).pow(-1.0 / root)
    return ((eigvecs * scale.unsqueeze(-2)) @ eigvecs.mT).to(mats.dtype)


def kronecker_state(
    shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype, left: str, right: str
) -> dict[str, Tensor]:
    """Zero state shared by Shampoo and SOAP: Adam moments, the factors L (rows²) and R (cols²),
    and one rows² and one cols² matrix named `left` / `right` (inverse roots, or eigenbases)."""
    rows, cols = shape
    shapes = {"exp_avg": (rows, cols), "exp_avg_sq": (rows, cols), "L": (rows, rows), "R": (cols, cols),
              left: (rows, rows), right: (cols, cols)}
    return {k: torch.zeros(s, device=device, dtype=dtype) for k, s in shapes.items()}


class Shampoo(UpdateRule):
    elementwise = False

    def __init__(
        self,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        precondition_frequency: int = 10,
        shampoo_eps: float = 1e-12,
    ) -> None:
        if precondition_frequency < 1:
            raise ValueError(f"precondition_frequency={precondition_frequency} must be >= 1")
        self.betas = betas
        self.eps = eps
        self.precondition_frequency = precondition_frequency
        self.shampoo_eps = shampoo_eps

    @classmethod
    def from_config(cls, opt: OptimizerSection) -> Shampoo:
        return cls(opt.betas, opt.eps, opt.precondition_frequency, opt.shampoo_eps)

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        return kronecker_state(shape, device, dtype, "L_inv_root", "R_inv_root")

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        check_matrices(grads, "Shampoo")
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        refresh = is_refresh_step(step, self.precondition_frequency)
        out: list[Tensor] = [torch.empty(0)] * len(grads)
        for idx in group_by_shape(grads):
            st = [states[i] for i in idx]
            G = torch.stack([grads[i] for i in idx])
            stacked = {k: torch.stack([s[k] for s in st]) for k in st[0]}
            stacked["exp_avg"].lerp_(G, 1 - beta1)
            stacked["exp_avg_sq"].mul_(beta2).addcmul_(G, G, value=1 - beta2)
            stacked["L"].baddbmm_(G, G.mT)
            stacked["R"].baddbmm_(G.mT, G)
            changed = ["exp_avg", "exp_avg_sq", "L", "R"]
            if refresh:
                stacked["L_inv_root"] = inverse_root(stacked["L"], 4, self.shampoo_eps)
                stacked["R_inv_root"] = inverse_root(stacked["R"], 4, self.shampoo_eps)
                changed += ["L_inv_root", "R_inv_root"]
            m_hat = stacked["exp_avg"] / bias_correction1
            adam = m_hat / stacked["exp_avg_sq"].div(bias_correction2).sqrt_().add_(self.eps)
            P = stacked["L_inv_root"] @ m_hat @ stacked["R_inv_root"]
            P.mul_(_frobenius(adam) / _frobenius(P).clamp(min=torch.finfo(P.dtype).tiny))
            for j, s in enumerate(st):
                for k in changed:
                    s[k].copy_(stacked[k][j])
                out[idx[j]] = P[j].to(grads[idx[j]].dtype)
        return out


def _frobenius(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
