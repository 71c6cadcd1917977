"""Muon: momentum, then Newton–Schulz orthogonalisation, with torch.optim.Muon's arithmetic."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from canzona.config import OptimizerSection
from canzona.optim.base import UpdateRule, check_matrices, group_by_shape
from canzona.optim.newton_schulz import NS_DTYPES, newton_schulz

LR_ADJUSTS = ("original", "match_rms_adamw", "none")


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
    """Muon on whole 2-D matrices; equal shapes share one batched Newton–Schulz."""

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
    def from_config(cls, opt: OptimizerSection) -> Muon:
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
        updates = []
        for grad, state in zip(grads, states, strict=True):
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - self.momentum)
            updates.append(grad.lerp(buf, self.momentum) if self.nesterov else buf)
        out: list[Tensor] = [torch.empty(0)] * len(grads)
        for idx in group_by_shape(grads):
            ortho = newton_schulz(
                torch.stack([updates[i] for i in idx]),
                self.ns_coefficients,
                self.ns_steps,
                self.ns_eps,
                self.ns_dtype,
            )
            scale = lr_scale(tuple(grads[idx[0]].shape), self.lr_adjust)
            for j, i in enumerate(idx):
                out[i] = ortho[j].to(grads[i].dtype).mul_(scale)
        return out
