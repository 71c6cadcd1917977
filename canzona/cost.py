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
``auto`` (the default, `select_cost_model`) is ``measured`` when the plan's device is on this
machine and ``roofline`` otherwise. Planners only compare costs with each other, so any
positive unit works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from canzona.devices import device_here, threads_per_rank
from canzona.errors import ConfigError
from canzona.inventory import ParamSpec
from canzona.optim import registry
from canzona.optim.section import OptimizerSection
from canzona.optim.spec import OptimizerDef

if TYPE_CHECKING:
    from canzona.calibrate.cache import Calibration

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


def make_cost_model(
    kind: str,
    optimizer: str,
    *,
    ns_steps: int = 5,
    precondition_frequency: int = 10,
    table: str | None = None,
    elementwise_flops: float = ELEMENTWISE_FLOP_EQUIVALENT,
    settings: Any = None,
    calibration: Calibration | None = None,
    hardware: Any = "h100",
) -> CostModel:
    """A cost model of an explicit ``kind``. ``settings``, the whole optimizer section (so
    ``max_preconditioner_dim`` and any other option counts), wins over the ``ns_steps`` /
    ``precondition_frequency`` shorthands. ``measured`` reads ``table`` (the path of a hardware file
    that ``python -m canzona.calibrate`` wrote) or else ``calibration`` (this machine's cache, see
    `select_cost_model`); ``roofline`` runs on ``hardware`` (a `canzona.hardware.Hardware`, a
    name or a path)."""
    if settings is None:
        settings = OptimizerSection(ns_steps=ns_steps, precondition_frequency=precondition_frequency)
    flops = FlopsCost(optimizer, settings, elementwise_flops)
    if kind == "numel":
        return NumelCost()
    if kind == "flops":
        return flops
    if kind == "measured":
        if table is not None:
            return load_measured(table, optimizer, flops)
        if calibration is None:
            raise ConfigError("planner.cost=measured needs planner.measured_table=PATH or this machine's calibration")
        return from_calibration(calibration, optimizer, flops)
    if kind == "roofline":
        from canzona.roofline import RooflineCost

        return RooflineCost.on(hardware, optimizer, settings)
    raise ConfigError(f"planner.cost={kind!r} is not allowed; choose one of: {', '.join(COSTS)}")


def select_cost_model(cfg: Any, device: str, *, hardware: Any = None, threads: int | None = None,
                      log: Any = None) -> CostModel:
    """The cost model a plan of ``cfg`` for a ``device`` (cpu | cuda) uses.

    ``planner.cost=auto``: ``measured`` when this machine has such a device (a CPU always; CUDA
    when a GPU is visible), timed into this machine's calibration cache as needed (or read from
    ``planner.measured_table`` when given); otherwise ``roofline`` on ``hardware`` (the
    simulator's), else ``planner.cost_hardware``. ``threads``:
    the torch threads per rank the trial runs with (default: ``dist.threads_per_rank``, else the
    cores shared by the ranks of one local trial). ``log`` hears the cache's path.
    """
    kind = cfg.planner.cost
    from canzona.plan.registry import elementwise_only

    optimizer = "adamw" if elementwise_only(cfg.method.dp) else cfg.optimizer.name
    if kind == "auto":
        kind = "measured" if device_here(device) or cfg.planner.measured_table else "roofline"
    measured_here = kind == "measured" and not cfg.planner.measured_table
    if measured_here and not device_here(device):
        raise ConfigError(f"planner.cost=measured: this machine has no {device} device to time (dist.device="
                          f"{cfg.dist.device}); use planner.cost=roofline or planner.measured_table=PATH")
    calibration = None
    if measured_here:
        calibration = _calibration(cfg, device, optimizer, threads, log)
    return make_cost_model(kind, optimizer, table=cfg.planner.measured_table if kind == "measured" else None,
                           elementwise_flops=cfg.planner.elementwise_flops, settings=cfg.optimizer,
                           calibration=calibration, hardware=hardware or cfg.planner.cost_hardware)


def _calibration(cfg: Any, device: str, optimizer: str, threads: int | None, log: Any) -> Calibration:
    from canzona.calibrate.cache import Need, ensure
    from canzona.inventory import build_inventory

    if threads is None:
        threads = threads_per_rank(cfg)
    d = registry.get(optimizer)
    needs = []
    if d.matrix:
        params = build_inventory(cfg.model_cfg(), split_fused=cfg.model.split_fused,
                                 matrix_embeddings=cfg.model.matrix_embeddings)
        shapes = [s for p in params if p.kind == "matrix" for s in _matrix_shapes(p)]
        needs.append(Need(optimizer, cfg.optimizer, tuple(d.calibration_shapes(shapes, cfg.optimizer))))
    calibration, _ = ensure(device, threads, needs, cfg.planner.cost_cache, log)
    return calibration
