"""Muon: momentum, then Newton–Schulz orthogonalisation, with torch.optim.Muon's arithmetic.

Matrices are updated one at a time (see `canzona.optim.newton_schulz`): a matrix's update never
depends on the other matrices of the call, and no call stacks all equal-shape matrices at once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from canzona.optim.definitions import LR_ADJUSTS
from canzona.optim.definitions import muon_flops as flops  # noqa: F401  (the cost of one update)
from canzona.optim.newton_schulz import NS_DTYPES, newton_schulz
from canzona.optim.rule import Settings, UpdateRule, check_matrices


def lr_scale(shape: tuple[int, ...], lr_adjust: str) -> float:
    """Shape-dependent lr factor (torch.optim.Muon's ``adjust_lr_fn``) so update RMS is shape-independent."""
    rows, cols = shape[:2]
    if lr_adjust == "original":
        return math.sqrt(max(1, rows / cols))
    if lr_adjust == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if lr_adjust == "none":
        return 1.0
    raise ValueError(f"lr_adjust={lr_adjust!r}; choose one of {', '.join(LR_ADJUSTS)}")


class Muon(UpdateRule):
    """Muon on whole 2-D matrices."""

    elementwise = False

    def __init__(
        self,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
        ns_steps: int = 5,
        ns_eps: float = 1e-7,
        ns_dtype: str = "float32",
        lr_adjust: str = "original",
    ) -> None:
        if ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype={ns_dtype!r}; choose one of {', '.join(NS_DTYPES)}")
        lr_scale((1, 1), lr_adjust)  # validates the name early
        self.momentum = momentum
        self.nesterov = nesterov
        self.ns_coefficients = tuple(ns_coefficients)
        self.ns_steps = ns_steps
        self.ns_eps = ns_eps
        self.ns_dtype = NS_DTYPES[ns_dtype]
        self.lr_adjust = lr_adjust

    @classmethod
    def from_config(cls, opt: Settings) -> Muon:
        return cls(
            momentum=opt.momentum,
            nesterov=opt.nesterov,
            ns_coefficients=opt.ns_coefficients,
            ns_steps=opt.ns_steps,
            ns_eps=opt.ns_eps,
            ns_dtype=opt.ns_dtype,
            lr_adjust=opt.lr_adjust,
        )

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        return {"momentum_buffer": torch.zeros(shape, device=device, dtype=dtype)}

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        check_matrices(grads, "Muon")
        out = []
        for grad, state in zip(grads, states, strict=True):
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - self.momentum)
            update = grad.lerp(buf, self.momentum) if self.nesterov else buf
            ortho = newton_schulz(update, self.ns_coefficients, self.ns_steps, self.ns_eps, self.ns_dtype)
            out.append(ortho.to(grad.dtype).mul_(lr_scale(tuple(grad.shape), self.lr_adjust)))
        return out
