"""The update maths an optimizer module provides (`UpdateRule`); its description (`OptimizerDef`:
config options, flops, refresh cost, state size, calibration shapes) is in `canzona.optim.spec`.

An `UpdateRule` turns gradients into update directions and knows nothing about ranks or
process groups: whoever owns a parameter (a whole matrix for matrix rules, any flat slice for
elementwise rules) calls it. Keeping the maths here lets every distributed method be checked
against the same single-process arithmetic.

This module imports only `canzona.optim.spec` of the package, so optimizer modules can import
it and the registry (`canzona.optim.registry`) can name them: the import graph stays one-way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from canzona.optim.spec import OptimizerDef, Option, Settings, Shape

__all__ = ["OptimizerDef", "Option", "Settings", "Shape", "UpdateRule", "apply_update", "check_matrices",
           "equal_shape_groups"]


class UpdateRule(ABC):
    """Stateful update maths for a list of tensors.

    ``elementwise`` is True when the rule may run on any flat slice of a parameter (AdamW) and
    False when it needs whole matrices (Muon, Shampoo, SOAP).
    """

    elementwise: bool = False

    @abstractmethod
    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        """Fresh optimizer state for one tensor of ``shape``."""

    @abstractmethod
    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        """Update directions for ``grads`` at 1-based ``step``, mutating ``states`` in place.

        Each direction has its grad's shape and dtype and already includes any shape-dependent
        learning-rate scale, so the caller only does ``apply_update(param, U, lr, wd)``.
        State tensors are updated in place (never rebound), so callers may keep them as views
        into their own buffers. A tensor's direction and state never depend on the other
        tensors of the call (each is computed alone), so any owner may batch any subset. An
        opt-in batched path (Muon's ``batch_equal_shapes``) keeps the state bit for bit and the
        direction to a stated tolerance only.
        """

    def sharded_directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int,
                           shapes: Sequence[tuple[int, int]], dims: Sequence[int],
                           reduce: Callable[[Tensor], Tensor]) -> list[Tensor]:
        """Directions of *shards* of matrices (``grads[k]``: a shard cut along ``dims[k]`` of a
        matrix of ``shapes[k]``), given ``reduce``, which sums a tensor over the holders of all
        the shards. Only a rule whose update is built from such sums can (Muon: its Gram
        products and norm, `OptimizerDef.tp_sharded`); the others need the whole matrix."""
        raise NotImplementedError(f"{type(self).__name__} cannot update a matrix from its shards")

    def step(
        self,
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Tensor]],
        step: int,
        lr: float,
        weight_decay: float,
    ) -> None:
        """Update ``params`` in place: `directions`, then `apply_update` each. Elementwise rules
        override this with one fused kernel."""
        for param, direction in zip(params, self.directions(grads, states, step), strict=True):
            apply_update(param, direction, lr, weight_decay)


def apply_update(param: Tensor, direction: Tensor, lr: float, weight_decay: float) -> None:
    """Decoupled weight decay then the step, in the order torch.optim.AdamW / Muon use.

    Both kernels are slice-invariant (an element's result does not depend on where a shard
    cuts the tensor): checked under every x86 CPU capability by tests/unit/test_optim.py.
    """
    param.mul_(1 - lr * weight_decay)
    param.add_(direction, alpha=-lr)


def check_matrices(grads: Sequence[Tensor], rule: str) -> None:
    for g in grads:
        if g.ndim != 2:
            raise ValueError(f"{rule} needs 2-D matrices, got a tensor of shape {tuple(g.shape)}")


def equal_shape_groups(tensors: Sequence[Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (shape, dtype, device), groups in order of first
    appearance and indices in order within a group: what one stacked kernel can take."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((tuple(t.shape), t.dtype, t.device), []).append(i)
    return list(groups.values())
