"""Muon: momentum, then Newton–Schulz orthogonalisation, with torch.optim.Muon's arithmetic.

Matrices are updated one at a time (see `canzona.optim.newton_schulz`): a matrix's update never
depends on the other matrices of the call, and no call stacks all equal-shape matrices at once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from canzona.optim.newton_schulz import NS_DTYPES, newton_schulz
from canzona.optim.rule import OptimizerDef, Option, Settings, Shape, UpdateRule, check_matrices

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


def flops(m: int, n: int, ns_steps: int = 5) -> float:
    """Newton-Schulz with k steps on an m x n matrix (m <= n after transposing).

    Per step: A = X Xᵀ (2 m² n), B = b A + c A A (2 m³), X' = a X + B X (2 m² n), i.e.
    k (4 m² n + 2 m³), plus O(m n) momentum and scaling.
    """
    m, n = min(m, n), max(m, n)
    return ns_steps * (4.0 * m * m * n + 2.0 * m**3) + 10.0 * m * n


def _steady_flops(shape: Shape, s: Settings) -> float:
    return flops(shape[0], shape[1], s.ns_steps)


def _state_numel(shape: tuple[int, ...], s: Settings) -> int:
    return math.prod(shape)  # the momentum buffer


OPTIONS = (
    Option("momentum", float, 0.95, "momentum coefficient"),
    Option("nesterov", bool, True, "Nesterov momentum"),
    Option("ns_steps", int, 5, "Newton-Schulz iterations", minimum=1),
    Option("ns_coefficients", tuple[float, float, float], (3.4445, -4.7750, 2.0315), "quintic coefficients"),
    Option("ns_eps", float, 1e-7, "floor of the normalising Frobenius norm"),
    # float32 for parity tests, bfloat16 as torch.optim.Muon does.
    Option("ns_dtype", str, "float32", "Newton-Schulz matmul dtype", choices=tuple(NS_DTYPES)),
    Option("lr_adjust", str, "original", "shape-dependent lr scale (torch.optim.Muon)", choices=LR_ADJUSTS),
)

OPTIMIZER = OptimizerDef(
    name="muon",
    rule=Muon.from_config,
    options=OPTIONS,
    steady_flops=_steady_flops,
    state_numel=_state_numel,
    # momentum lerp, Nesterov lerp, normalisation, scale, casts
    elementwise_passes=8.0,
    matmul_dtype=lambda s: s.ns_dtype,
)
