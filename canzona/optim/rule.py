"""What an optimizer module provides: the update maths (`UpdateRule`) and its description
(`OptimizerDef`: config options, flops, refresh cost, state size, calibration shapes).

An `UpdateRule` turns gradients into update directions and knows nothing about ranks or
process groups: whoever owns a parameter (a whole matrix for matrix rules, any flat slice for
elementwise rules) calls it. Keeping the maths here lets every distributed method be checked
against the same single-process arithmetic.

This module imports nothing else of the package, so optimizer modules can import it and the
registry (`canzona.optim.registry`) can import them: the import graph stays one-way.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Shape = tuple[int, int]
# The optimizer section of a trial config (`canzona.config.OptimizerSection`): any object with
# an attribute per registered `Option`. Typed loosely so that this package never imports the
# config module, which is built from it.
Settings = Any


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
        tensors of the call (each is computed alone), so any owner may batch any subset.
        """

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


@dataclass(frozen=True)
class Option:
    """One flat ``optimizer.<name>`` config key that an optimizer reads.

    Two optimizers may declare the same key (Shampoo and SOAP share ``precondition_frequency``)
    only with the same type and default; the registry checks that.
    """

    name: str
    type: Any
    default: Any
    help: str = ""
    choices: tuple[str, ...] | None = None
    minimum: float | None = None

    def dataclass_field(self) -> tuple[str, Any, Any]:
        """``(name, type, field)`` as `dataclasses.make_dataclass` takes it."""
        if isinstance(self.default, (list, dict, set)):
            value = self.default
            return self.name, self.type, dataclasses.field(default_factory=lambda: copy.deepcopy(value))
        return self.name, self.type, dataclasses.field(default=self.default)

    def problem(self, value: Any) -> str | None:
        """A one-line complaint about ``value``, or None when it is allowed."""
        if self.choices is not None and value not in self.choices:
            return f"optimizer.{self.name}={value!r} is not allowed; choose one of: {', '.join(self.choices)}"
        if self.minimum is not None and value < self.minimum:
            return f"optimizer.{self.name}={value} must be >= {self.minimum:g}"
        return None


def _whole(shape: Shape, settings: Settings) -> list[Shape]:
    return [shape]


def _no_refresh(shape: Shape, settings: Settings) -> float:
    return 0.0


def _float32(settings: Settings) -> str:
    return "float32"


@dataclass(frozen=True)
class OptimizerDef:
    """Everything the harness needs to know about one optimizer, kept in its own module.

    - ``rule(settings)``: the `UpdateRule` for these settings.
    - ``options``: its config keys (``optimizer.<name>``), merged into the flat config section.
    - ``matrix``: False for elementwise optimizers (AdamW), which run on any flat shard.
    - ``steady_flops(shape, settings)``: flops of one update of one matrix (a tensor's
      ``(rows, cols)``; elementwise optimizers get ``(1, numel)``) on a step without refresh.
    - ``refresh_flops(shape, settings)``: the extra flops of a refresh step (eigendecompositions,
      power iteration + QR); ``refresh_every(settings)`` how many steps apart refreshes are
      (None: never).
    - ``state_numel(shape, settings)``: optimizer-state elements kept for one tensor (its bytes
      are that times the state dtype's size): what the memory accounting of a dry run needs.
    - ``kernels(shape, settings)``: the matrices one update runs its kernels on, one entry per
      kernel (the blocks of a blocked preconditioner; ``[shape]`` otherwise). A matrix's update
      costs the sum of its kernels' updates and every kernel runs on one matrix (no batching),
      so a calibration needs to time only ``calibration_shapes`` of the shapes it cares about,
      one matrix at a time (a call over c matrices costs c single updates plus call overhead).
    - ``elementwise_passes``: fp32 passes over the matrix besides the matmuls (memory-bound).
    - ``matmul_dtype(settings)``: the dtype its matmuls run in (Newton-Schulz may be bf16).
    """

    name: str
    rule: Callable[[Settings], UpdateRule]
    steady_flops: Callable[[Shape, Settings], float]
    state_numel: Callable[[tuple[int, ...], Settings], int]
    options: tuple[Option, ...] = ()
    matrix: bool = True
    refresh_flops: Callable[[Shape, Settings], float] = _no_refresh
    refresh_every: Callable[[Settings], int] | None = None
    kernels: Callable[[Shape, Settings], list[Shape]] = _whole
    elementwise_passes: float = 0.0
    matmul_dtype: Callable[[Settings], str] = _float32

    def flops(self, shape: Shape, settings: Settings) -> float:
        """Flops of one update with refreshes amortised over their interval."""
        steady = self.steady_flops(shape, settings)
        every = self.refresh_every(settings) if self.refresh_every is not None else None
        return steady + self.refresh_flops(shape, settings) / every if every else steady

    def calibration_shapes(self, shapes: Sequence[Shape], settings: Settings) -> list[Shape]:
        """The distinct kernel shapes to time for these matrix shapes, in order of first use."""
        out: dict[Shape, None] = {}
        for shape in shapes:
            for k in self.kernels(tuple(shape), settings):
                out.setdefault(tuple(k), None)
        return list(out)
