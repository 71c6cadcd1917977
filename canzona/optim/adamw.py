"""Elementwise AdamW direction: works on whole tensors or any flat slice of one."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from canzona.optim.base import UpdateRule


class AdamW(UpdateRule):
    """Bias-corrected Adam direction m̂ / (sqrt(v̂) + eps); weight decay is `apply_update`'s job.

    The arithmetic follows torch.optim.AdamW (single-tensor path) except that torch folds the
    1/(1 - beta1^t) correction into the step size, while here it is part of the direction.
    """

    elementwise = True

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.betas = betas
        self.eps = eps

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        return {
            "exp_avg": torch.zeros(shape, device=device, dtype=dtype),
            "exp_avg_sq": torch.zeros(shape, device=device, dtype=dtype),
        }

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = math.sqrt(1 - beta2**step)
        out = []
        for grad, state in zip(grads, states, strict=True):
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            out.append(torch.div(exp_avg, denom).div_(bias_correction1))
        return out
