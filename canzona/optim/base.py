"""The contract between optimizer maths and the code that owns parameters.

An `UpdateRule` turns gradients into update directions and knows nothing about ranks or
process groups: whoever owns a parameter (a whole matrix for matrix rules, any flat slice for
elementwise rules) calls `directions` and then `apply_update`. Keeping the maths here lets every
distributed method be checked against the same single-process arithmetic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from canzona.config import OptimizerSection


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
        into their own buffers.
        """


def apply_update(param: Tensor, direction: Tensor, lr: float, weight_decay: float) -> None:
    """Decoupled weight decay then the step, in the order torch.optim.AdamW / Muon use."""
    param.mul_(1 - lr * weight_decay)
    param.add_(direction, alpha=-lr)


def group_by_shape(tensors: Sequence[Tensor]) -> list[list[int]]:
    """Indices of equal-shape tensors, groups in order of first appearance (for batching)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(tuple(t.shape), []).append(i)
    return list(groups.values())


def check_matrices(grads: Sequence[Tensor], rule: str) -> None:
    for g in grads:
        if g.ndim != 2:
            raise ValueError(f"{rule} needs 2-D matrices, got a tensor of shape {tuple(g.shape)}")


def learning_rate(opt: OptimizerSection, kind: str) -> float:
    """The lr the caller passes to `apply_update`: ``opt.lr`` for matrix rules, else ``opt.adamw_lr``."""
    if kind not in ("matrix", "adamw"):
        raise ValueError(f"kind={kind!r}; expected 'matrix' or 'adamw'")
    return opt.lr if kind == "matrix" and opt.name != "adamw" else opt.adamw_lr


def make_rule(opt: OptimizerSection, kind: str) -> UpdateRule:
    """The rule for parameters of ``kind``: "matrix" follows ``opt.name``, "adamw" is always AdamW."""
    from canzona.optim.adamw import AdamW
    from canzona.optim.muon import Muon
    from canzona.optim.shampoo import Shampoo
    from canzona.optim.soap import SOAP

    if kind not in ("matrix", "adamw"):
        raise ValueError(f"kind={kind!r}; expected 'matrix' or 'adamw'")
    if kind == "adamw" or opt.name == "adamw":
        return AdamW(betas=opt.betas, eps=opt.eps)
    if opt.name == "muon":
        return Muon.from_config(opt)
    if opt.name == "shampoo":
        return Shampoo.from_config(opt)
    if opt.name == "soap":
        return SOAP.from_config(opt)
    raise ValueError(f"optimizer.name={opt.name!r} is not one of muon, shampoo, soap, adamw")
