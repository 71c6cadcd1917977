"""What the harness knows about an optimizer besides its maths (`OptimizerDef`: config options,
flops, refresh cost, state size, calibration shapes), and the config keys it reads (`Option`).

This module imports neither torch nor anything else of the package: the config schema, the
command lines and the planner are built from optimizer descriptions without loading the update
maths, which `OptimizerDef.make_rule` imports when a rank first needs it.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Shape = tuple[int, int]
# The optimizer section of a trial config (`canzona.config.OptimizerSection`): any object with
# an attribute per registered `Option`. Typed loosely so that this package never imports the
# config module, which is built from it.
Settings = Any
# A `canzona.optim.rule.UpdateRule`; not imported here, since that module (torch) imports this one.
UpdateRule = Any


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
            return self.name, self.type, dataclasses.field(default_factory=lambda: copy.deepcopy(value),
                                                           metadata=self.metadata())
        return self.name, self.type, dataclasses.field(default=self.default, metadata=self.metadata())

    def metadata(self) -> dict[str, Any]:
        """What `canzona.schema_doc` reads: the meaning and the allowed values."""
        return {"help": self.help, "choices": self.choices}

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

    - ``rule``: makes the `UpdateRule` for given settings: a callable, or the import path of one
      (``"package.module:Class.from_config"``), imported only when `make_rule` is first called.
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
    - ``tp_sharded``: its rule can update a TP shard of a matrix from sums over the TP group
      (`UpdateRule.sharded_directions`: Muon's Gram products and norm), which the TP strategy
      ``gram_allreduce`` needs.
    """

    name: str
    rule: Callable[[Settings], UpdateRule] | str
    steady_flops: Callable[[Shape, Settings], float]
    state_numel: Callable[[tuple[int, ...], Settings], int]
    options: tuple[Option, ...] = ()
    matrix: bool = True
    refresh_flops: Callable[[Shape, Settings], float] = _no_refresh
    refresh_every: Callable[[Settings], int] | None = None
    kernels: Callable[[Shape, Settings], list[Shape]] = _whole
    elementwise_passes: float = 0.0
    matmul_dtype: Callable[[Settings], str] = _float32
    tp_sharded: bool = False

    def make_rule(self, settings: Settings) -> UpdateRule:
        """The `UpdateRule` for ``settings`` (importing the rule's module if ``rule`` is a path)."""
        return _resolve(self.rule)(settings)

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


def _resolve(rule: Callable[[Settings], UpdateRule] | str) -> Callable[[Settings], UpdateRule]:
    if callable(rule):
        return rule
    module, _, attr = rule.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target
