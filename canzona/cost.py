"""Cost models: the work of one parameter's optimizer update, on the FULL (unsharded) tensor.

Three interchangeable models (DESIGN.md §2):
- ``numel``: the linear proxy every ZeRO implementation balances on.
- ``flops``: analytic floating-point operation counts per optimizer.
- ``measured``: seconds per shape timed on a device (``python -m canzona.calibrate``), loaded
  from a YAML profile. Shapes missing from the profile are extrapolated from the nearest
  measured shape by the flops ratio, and counted in ``missing`` so callers can warn.

All planners only ever compare costs with each other, so any positive unit works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from canzona.errors import ConfigError
from canzona.inventory import ParamSpec

# Elementwise AdamW: ~12 flops per element (two moment updates, bias corrections, sqrt, div,
# decoupled decay, the update itself).
ADAMW_FLOPS_PER_ELEMENT = 12.0
# ...but those flops are memory-bound: AdamW reads and writes param, grad and two moments
# (~32 bytes per fp32 element). For *planning*, the flops model charges each elementwise update
# the matmul flops that take the same time (``canzona.elementwise_flops``, default 512: 32 bytes
# at a machine balance of 16 flops/byte; measured here: ~440 on one CPU core, GPUs are far
# higher). Counting 12 would make a rank holding the embedding look idle; the `measured` cost
# model replaces the guess with timings from `python -m canzona.calibrate`.
ELEMENTWISE_FLOP_EQUIVALENT = 512.0
# A dense symmetric eigendecomposition (tridiagonalisation + QR iterations + back-transform)
# costs about 9 n^3 flops; one power iteration + QR of an n x n basis about 2 n^3 + 4/3 n^3.
EIGH_FLOPS_FACTOR = 9.0
POWER_QR_FLOPS_FACTOR = 2.0 + 4.0 / 3.0


def muon_flops(m: int, n: int, ns_steps: int = 5) -> float:
    """Newton-Schulz with k steps on an m x n matrix (m <= n after transposing).

    Per step: A = X Xᵀ (2 m² n), B = b A + c A A (2 m³), X' = a X + B X (2 m² n), i.e.
    k (4 m² n + 2 m³) (DESIGN.md §2), plus O(m n) momentum and scaling.
    """
    m, n = min(m, n), max(m, n)
    return ns_steps * (4.0 * m * m * n + 2.0 * m**3) + 10.0 * m * n


def shampoo_flops(m: int, n: int, precondition_frequency: int) -> float:
    """Factor updates L += G Gᵀ, R += Gᵀ G; preconditioning L^-1/4 G R^-1/4; Adam grafting;
    plus both eigendecompositions amortised over the refresh interval."""
    per_step = 2.0 * m * m * n + 2.0 * m * n * n  # factor updates
    per_step += 2.0 * m * m * n + 2.0 * m * n * n  # preconditioning
    per_step += ADAMW_FLOPS_PER_ELEMENT * m * n  # grafting
    refresh = EIGH_FLOPS_FACTOR * (m**3 + n**3) + 2.0 * (m**3 + n**3)  # eigh + rebuild roots
    return per_step + refresh / precondition_frequency


def soap_flops(m: int, n: int, precondition_frequency: int) -> float:
    """Factor EMAs; rotating the gradient into the eigenbasis and the update back; Adam in the
    rotated basis; power iteration + QR refresh of both bases amortised."""
    per_step = 2.0 * m * m * n + 2.0 * m * n * n  # factor updates
    per_step += 2.0 * (2.0 * m * m * n + 2.0 * m * n * n)  # rotate in and out
    per_step += ADAMW_FLOPS_PER_ELEMENT * m * n
    refresh = POWER_QR_FLOPS_FACTOR * (m**3 + n**3)
    return per_step + refresh / precondition_frequency


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
    optimizer: str
    ns_steps: int = 5
    precondition_frequency: int = 10
    elementwise_flops: float = ELEMENTWISE_FLOP_EQUIVALENT
    name: str = "flops"

    def matrix_flops(self, m: int, n: int) -> float:
        if self.optimizer == "muon":
            return muon_flops(m, n, self.ns_steps)
        if self.optimizer == "shampoo":
            return shampoo_flops(m, n, self.precondition_frequency)
        if self.optimizer == "soap":
            return soap_flops(m, n, self.precondition_frequency)
        return self.elementwise_flops * m * n

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
        self.missing.add(key)
        # Extrapolate from the measured shape whose flops are closest.
        target = self.flops.matrix_flops(m, n)
        best = min(self.table, key=lambda k: abs(self.flops.matrix_flops(*_parse(k)) - target))
        return self.table[best] * target / self.flops.matrix_flops(*_parse(best))

    def cost(self, spec: ParamSpec) -> float:
        if spec.kind != "matrix" or self.optimizer == "adamw":
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
    if optimizer != "adamw" and not updates.get(optimizer):
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
) -> CostModel:
    flops = FlopsCost(optimizer, ns_steps, precondition_frequency, elementwise_flops)
    if kind == "numel":
        return NumelCost()
    if kind == "flops":
        return flops
    if kind == "measured":
        if profile is None:
            raise ConfigError("canzona.cost=measured needs canzona.measured_profile=PATH")
        return load_measured(profile, optimizer, flops)
    raise ConfigError(f"canzona.cost={kind!r} is not allowed; choose one of: numel, flops, measured")
