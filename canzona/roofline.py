"""The roofline cost model: seconds of each update on hardware this machine need not have.

Used where nothing can be timed -- a GPU cluster planned from a laptop (``dist.device=cuda``
without a GPU, the simulator's projections) -- or when asked for (``planner.cost=roofline``).
Per kernel (`canzona.optim.spec.OptimizerDef.kernels`: the matrix, or each block of a blocked
preconditioner) an update costs `Hardware.update_seconds` with its refresh amortised,

    steady flops / matmul peak (in the optimizer's matmul dtype)
  + refresh flops / eigendecomposition rate / refresh interval
  + elementwise passes × 4 bytes × elements / memory bandwidth

plus one per-kernel overhead (the hardware file's per-update overhead: launches, Python), and an
elementwise AdamW parameter costs its per-tensor overhead plus its elements at the hardware's
AdamW seconds per element (its bytes per element over the memory bandwidth in a spec-derived
file). The rates are the hardware description's (`canzona.hardware`): peaks times the stated
efficiencies for spec-derived files, measured ones for calibrated files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from canzona.hardware import Hardware, load_hardware
from canzona.inventory import ParamSpec
from canzona.optim import registry
from canzona.optim.spec import OptimizerDef


@dataclass
class RooflineCost:
    optimizer: str
    settings: Any
    hardware: Hardware
    name: str = "roofline"

    @classmethod
    def on(cls, hardware: Any, optimizer: str, settings: Any) -> RooflineCost:
        """On ``hardware``: a `Hardware`, its dict, a name under hardware/ or a YAML path."""
        return cls(optimizer, settings, load_hardware(hardware))

    @property
    def definition(self) -> OptimizerDef:  # looked up, not kept: the model is pickled to other ranks
        return registry.get(self.optimizer)

    def __post_init__(self) -> None:
        p = self.hardware
        self.source = f"roofline: {_where(p)}"
        self.kernel_overhead_s = p.update_overhead.get(self.optimizer, p.call_overhead_s)

    def kernel_seconds(self, m: int, n: int) -> float:
        """One update of one m×n kernel (see the module docstring)."""
        return self.hardware.update_seconds(self.optimizer, m, n, self.settings, refresh=True) + self.kernel_overhead_s

    def cost(self, spec: ParamSpec) -> float:
        if spec.kind != "matrix" or not self.definition.matrix:
            return self.hardware.adamw_tensor_overhead_s + spec.numel * self.hardware.adamw_s_per_elem
        return sum(self.kernel_seconds(a, b) for _, shape in spec.matrices
                   for a, b in self.definition.kernels(shape, self.settings))


def _where(p: Hardware) -> str:
    if p.path:
        from canzona import CHECKOUT

        path = str(p.path)
        return path[len(str(CHECKOUT)) + 1:] if path.startswith(str(CHECKOUT) + "/") else path
    return f"hardware {p.name} ({p.source})"
