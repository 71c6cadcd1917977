"""Cost models: the work of one parameter's optimizer update, on the FULL (unsharded) tensor.

Three interchangeable models (DESIGN.md §2):
- ``numel``: the linear proxy every ZeRO implementation balances on.
- ``flops``: analytic floating-point operation counts, from each optimizer's module
  (`canzona.optim.registry`), refreshes amortised over their interval, preconditioner blocking
  included.
- ``measured``: seconds per shape timed on a device (``python -m canzona.calibrate``), loaded
  from a YAML profile. A shape missing from the profile is the sum of its kernels' (the blocks
  of a blocked preconditioner) when those are all measured, else extrapolated from the nearest
  measured shape by the flops ratio, and counted in ``missing`` so callers can warn.

All planners only ever compare costs with each other, so any positive unit works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from canzona.errors import ConfigError
from canzona.inventory import ParamSpec
from canzona.optim import registry
from canzona.optim.section import OptimizerSection

# Elementwise AdamW's flops are memory-bound: it reads and writes param, grad and two moments
# (~32 bytes per fp32 element). For *planning*, the flops model charges each elementwise update
# the matmul flops that take the same time (``canzona.elementwise_flops``, default 512: 32 bytes
# at a machine balance of 16 flops/byte; measured here: ~440 on one CPU core, GPUs are far
# higher). Counting its ~12 flops would make a rank holding the embedding look idle; the
# `measured` cost model replaces the guess with timings from `python -m canzona.calibrate`.
ELEMENTWISE_FLOP_EQUIVALENT = 512.0


class CostModel(Protocol):
    name: str

    def cost(self, spec: ParamSpec) -> float: ...


def _matrix_shapes(spec: ParamSpec) -> list[tuple[int, int]]:
    return [shape for _, shape in spec.matrices]


@dataclass
class NumelCost:
    name: str = "numel"

    def cost(self, spec: ParamSpec) -> float:
        return float(spec.numel)


@dataclass
class FlopsCost:
    """Flops of ``optimizer``'s update under ``settings`` (an optimizer section; its own
    ``name`` is ignored: ``optimizer`` says which rule, e.g. adamw for the adamw method)."""

    optimizer: str
    settings: Any = field(default_factory=OptimizerSection)
    elementwise_flops: float = ELEMENTWISE_FLOP_EQUIVALENT
    name: str = "flops"

    def __post_init__(self) -> None:
        self.definition = registry.get(self.optimizer)

    def matrix_flops(self, m: int, n: int) -> float:
        if not self.definition.matrix:
            return self.elementwise_flops * m * n
        return self.definition.flops((m, n), self.settings)

    def cost(self, spec: ParamSpec) -> float:
        if spec.kind != "matrix":
            return self.elementwise_flops * spec.numel
        return sum(self.matrix_flops(m, n) for m, n in _matrix_shapes(spec))


@dataclass
class MeasuredCost:
    """Seconds per update, keyed by optimizer then ``"MxN"`` (adamw keyed per element)."""

    optimizer: str
    table: dict[str, float]
    adamw_seconds_per_element: float
    flops: FlopsCost
    name: str = "measured"
    missing: set[str] = field(default_factory=set)

    def _matrix_seconds(self, m: int, n: int) -> float:
        key = f"{m}x{n}"
        if key in self.table:
            return self.table[key]
        kernels = self.flops.definition.kernels((m, n), self.flops.settings)
        if len(kernels) > 1 and all(f"{a}x{b}" in self.table for a, b in kernels):
            return sum(self.table[f"{a}x{b}"] for a, b in kernels)
        self.missing.add(key)
        # Extrapolate from the measured shape whose flops are closest.
        target = self.flops.matrix_flops(m, n)
        best = min(self.table, key=lambda k: abs(self.flops.matrix_flops(*_parse(k)) - target))
        return self.table[best] * target / self.flops.matrix_flops(*_parse(best))

    def cost(self, spec: ParamSpec) -> float:
        if spec.kind != "matrix" or not self.flops.definition.matrix:
            return self.adamw_seconds_per_element * spec.numel
        return sum(self._matrix_seconds(m, n) for m, n in _matrix_shapes(spec))


def _parse(key: str) -> tuple[int, int]:
    m, n = key.split("x")
    return int(m), int(n)


def load_measured(path: str | Path, optimizer: str, flops: FlopsCost) -> MeasuredCost:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"canzona.measured_profile={str(path)!r} cannot be read: {e.strerror}") from None
    updates = (data or {}).get("updates", {})
    if flops.definition.matrix and not updates.get(optimizer):
        have = ", ".join(sorted(updates)) or "none"
        raise ConfigError(f"profile {path} has no measured {optimizer} updates; it has: {have}")
    adamw = float((data or {}).get("adamw_seconds_per_element", 0.0)) or 1e-9
    return MeasuredCost(optimizer, {k: float(v) for k, v in updates.get(optimizer, {}).items()}, adamw, flops)


def make_cost_model(
    kind: str,
    optimizer: str,
    *,
    ns_steps: int = 5,
    precondition_frequency: int = 10,
    profile: str | None = None,
    elementwise_flops: float = ELEMENTWISE_FLOP_EQUIVALENT,
    settings: Any = None,
) -> CostModel:
    """``settings``, the whole optimizer section (so ``max_preconditioner_dim`` and any other
    option counts), wins over the ``ns_steps`` / ``precondition_frequency`` shorthands."""
    if settings is None:
        settings = OptimizerSection(ns_steps=ns_steps, precondition_frequency=precondition_frequency)
    flops = FlopsCost(optimizer, settings, elementwise_flops)
    if kind == "numel":
        return NumelCost()
    if kind == "flops":
        return flops
    if kind == "measured":
        if profile is None:
            raise ConfigError("canzona.cost=measured needs canzona.measured_profile=PATH")
        return load_measured(profile, optimizer, flops)
    raise ConfigError(f"canzona.cost={kind!r} is not allowed; choose one of: numel, flops, measured")
