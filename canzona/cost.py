"""Cost models: the work of one parameter's optimizer update, on the FULL (unsharded) tensor.

Interchangeable models (docs/design.md §2); every one has a ``name`` and a ``source`` (where its
numbers come from), which the plan carries:
- ``measured``: seconds timed on the device the plan runs on. By default from this machine's
  calibration cache (`canzona.calibrate.cache`: taken the first time a plan needs it, extended
  when a plan needs new shapes), with ``planner.measured_table=PATH`` from the ``updates``
  table of a hardware file written by ``python -m canzona.calibrate`` instead (a shape missing there
  is the sum of its kernels when those are measured, else extrapolated from the nearest
  measured shape by the flops ratio, and counted in ``missing``).
- ``roofline``: seconds on a hardware description (`canzona.roofline`): flops at the matmul peak,
  bytes at the memory bandwidth, a per-kernel overhead. What a plan for a device this machine
  does not have (a GPU cluster planned from a laptop) uses.
- ``flops``: analytic floating-point operation counts, from each optimizer's module
  (`canzona.optim.registry`), refreshes amortised over their interval, preconditioner blocking
  included; elementwise updates charged a fixed flop equivalent per element.
- ``numel``: the linear proxy every ZeRO implementation balances on.
``auto`` (the default) is ``measured`` when the plan's device is on this machine and
``roofline`` otherwise. The choice, and the calibration a measured model is handed, are made
from a trial's config by `canzona.plan.from_config.select_cost_model`: the models here are pure
(no config, no cache, no clock). Planners only compare costs with each other, so any positive
unit works.
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
from canzona.optim.spec import OptimizerDef

COSTS = ("auto", "measured", "roofline", "flops", "numel")
# Elementwise AdamW's flops are memory-bound: it reads and writes param, grad and two moments
# (~32 bytes per fp32 element). For *planning*, the flops model charges each elementwise update
# the matmul flops that take the same time (``planner.elementwise_flops``, default 512: 32 bytes
# at a machine balance of 16 flops/byte; measured here: ~440 on one CPU core, GPUs are far
# higher). Counting its ~12 flops would make a rank holding the embedding look idle; the
# measured and roofline models need no such guess.
ELEMENTWISE_FLOP_EQUIVALENT = 512.0


class CostModel(Protocol):
    name: str
    source: str

    def cost(self, spec: ParamSpec) -> float: ...


class Calibration(Protocol):
    """What the measured model reads of a calibration (`canzona.calibrate.cache.Calibration`,
    which the caller loads or takes: a cost model is handed one, it does not decide to time)."""

    elementwise: dict[str, float]

    def table(self, optimizer: str, settings: Any) -> dict[str, dict[str, Any]]: ...

    def describe(self) -> str: ...


def _matrix_shapes(spec: ParamSpec) -> list[tuple[int, int]]:
    return [shape for _, shape in spec.matrices]


@dataclass
class NumelCost:
    name: str = "numel"
    source: str = "numel: elements per parameter"

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

    @property
    def definition(self) -> OptimizerDef:  # looked up, not kept: the model is pickled to other ranks
        return registry.get(self.optimizer)

    def __post_init__(self) -> None:
        registry.get(self.optimizer)  # an unknown name fails here
        self.source = f"flops: {self.optimizer} flop counts, elementwise {self.elementwise_flops:g} per element"

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
    """Seconds per update: ``table`` maps ``"MxN"`` to one matrix's (or kernel's) update with
    refreshes amortised; elementwise parameters cost ``adamw_tensor_overhead_s`` plus
    ``adamw_seconds_per_element`` per element."""

    optimizer: str
    table: dict[str, float]
    adamw_seconds_per_element: float
    flops: FlopsCost
    adamw_tensor_overhead_s: float = 0.0
    source: str = "measured"
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
            return self.adamw_tensor_overhead_s + self.adamw_seconds_per_element * spec.numel
        return sum(self._matrix_seconds(m, n) for m, n in _matrix_shapes(spec))


def _parse(key: str) -> tuple[int, int]:
    m, n = key.split("x")
    return int(m), int(n)


def load_measured(path: str | Path, optimizer: str, flops: FlopsCost) -> MeasuredCost:
    """The measured model of a hardware file written by ``python -m canzona.calibrate``: its
    ``updates`` table."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"planner.measured_table={str(path)!r} cannot be read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"planner.measured_table={str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"planner.measured_table={str(path)!r} is not a calibrated hardware file (a mapping "
                          "with an updates table)")
    updates = (data or {}).get("updates", {})
    if flops.definition.matrix and not updates.get(optimizer):
        have = ", ".join(sorted(updates)) or "none"
        raise ConfigError(f"planner.measured_table={str(path)!r} has no measured {optimizer} updates; it has: {have}")
    adamw = float((data or {}).get("adamw_seconds_per_element", 0.0)) or 1e-9
    device = (data or {}).get("device") or {}
    where = ", ".join(str(device[k]) for k in ("host", "name", "torch", "date") if device.get(k))
    return MeasuredCost(optimizer, {k: float(v) for k, v in updates.get(optimizer, {}).items()}, adamw, flops,
                        float((data or {}).get("adamw_tensor_overhead_s", 0.0)),
                        source=f"measured: {path}" + (f" ({where})" if where else ""))


def from_calibration(calibration: Calibration, optimizer: str, flops: FlopsCost) -> MeasuredCost:
    """The measured model of this machine's calibration cache: kernel seconds with refreshes
    amortised over the optimizer's interval."""
    d = flops.definition
    every = d.refresh_every(flops.settings) if d.refresh_every is not None else None
    table = {shape: float(e["step_s"]) + (float(e.get("refresh_s", 0.0)) / every if every else 0.0)
             for shape, e in (calibration.table(optimizer, flops.settings) if d.matrix else {}).items()}
    ew = calibration.elementwise
    return MeasuredCost(optimizer, table, float(ew["seconds_per_element"]), flops, float(ew["tensor_overhead_s"]),
                        source=calibration.describe())
