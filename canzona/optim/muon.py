"""Muon: momentum, then Newton–Schulz orthogonalisation, with torch.optim.Muon's arithmetic.

By default matrices are updated one at a time (see `canzona.optim.newton_schulz`): a matrix's
update never depends on the other matrices of the call, bit for bit. With
``batch_equal_shapes`` (``optimizer.batch_equal_shapes=true``) the equal-shape matrices of one
call (an MoE rank's experts, a dense model's layers) are stacked and orthogonalised by one
``newton_schulz(..., stacked=True)``, equal to the one-at-a-time update up to rounding only.
The momentum buffers are updated matrix by matrix on both paths (elementwise, so
bit-identical): only the Newton–Schulz iteration differs. The price is transient memory: a
group's stack and its iteration's workspace (a few times the group's matrices) are alive at
once, where the default holds one matrix's; a dry run measures it as it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from canzona.optim.definitions import LR_ADJUSTS
from canzona.optim.definitions import muon_flops as flops  # noqa: F401  (the cost of one update)
from canzona.optim.newton_schulz import NS_DTYPES, newton_schulz, newton_schulz_sharded
from canzona.optim.rule import Settings, UpdateRule, check_matrices, equal_shape_groups


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
        batch_equal_shapes: bool = False,
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
        self.batch_equal_shapes = batch_equal_shapes

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
            batch_equal_shapes=opt.batch_equal_shapes,
        )

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        return {"momentum_buffer": torch.zeros(shape, device=device, dtype=dtype)}

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        check_matrices(grads, "Muon")
        if self.batch_equal_shapes:
            return self._batched_directions(grads, states)
        out = []
        for grad, state in zip(grads, states, strict=True):
            ortho = self._orthogonalise(self._momentum(grad, state))
            out.append(self._scaled(ortho, grad))
        return out

    def sharded_directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int,
                           shapes: Sequence[tuple[int, int]], dims: Sequence[int],
                           reduce: Callable[[Tensor], Tensor]) -> list[Tensor]:
        """Directions of shards: ``grads[k]`` is one shard, cut along ``dims[k]``, of a matrix of
        shape ``shapes[k]`` whose other shards are held elsewhere; ``reduce`` sums a tensor over
        the holders of every shard (`newton_schulz_sharded`). The momentum is elementwise, so it
        runs on the shard as on the whole; the scale is the whole matrix's."""
        check_matrices(grads, "Muon")
        out = []
        for grad, state, shape, dim in zip(grads, states, shapes, dims, strict=True):
            ortho = newton_schulz_sharded(self._momentum(grad, state), dim, reduce, self.ns_coefficients,
                                          self.ns_steps, self.ns_eps, self.ns_dtype)
            out.append(ortho.to(grad.dtype).mul_(lr_scale(tuple(shape), self.lr_adjust)))
        return out

    def _batched_directions(self, grads: list[Tensor], states: list[dict[str, Tensor]]) -> list[Tensor]:
        """One stacked Newton–Schulz per group of equal-shape matrices; a group of one takes the
        exact 2-D path, so a call without two equal shapes is the default path bit for bit."""
        out: list[Tensor | None] = [None] * len(grads)
        for group in equal_shape_groups(grads):
            if len(group) == 1:
                (i,) = group
                out[i] = self._scaled(self._orthogonalise(self._momentum(grads[i], states[i])), grads[i])
                continue
            stack = torch.stack([self._momentum(grads[i], states[i]) for i in group])
            orthos = newton_schulz(stack, self.ns_coefficients, self.ns_steps, self.ns_eps, self.ns_dtype,
                                   stacked=True)
            for i, ortho in zip(group, orthos):
                out[i] = self._scaled(ortho, grads[i])
        return out  # type: ignore[return-value]  # every index is in one group

    def _momentum(self, grad: Tensor, state: dict[str, Tensor]) -> Tensor:
        """Update the momentum buffer in place; the (Nesterov) update to orthogonalise."""
        buf = state["momentum_buffer"]
        buf.lerp_(grad, 1 - self.momentum)
        return grad.lerp(buf, self.momentum) if self.nesterov else buf

    def _orthogonalise(self, update: Tensor) -> Tensor:
        return newton_schulz(update, self.ns_coefficients, self.ns_steps, self.ns_eps, self.ns_dtype)

    def _scaled(self, ortho: Tensor, grad: Tensor) -> Tensor:
        return ortho.to(grad.dtype).mul_(lr_scale(tuple(grad.shape), self.lr_adjust))
