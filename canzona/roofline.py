"""The roofline cost model: seconds of each update on a device profile this machine need not have.

Used where nothing can be timed -- a GPU cluster planned from a laptop (``dist.device=cuda``
without a GPU, the simulator's projections) -- or when asked for (``canzona.cost=roofline``).
Per kernel (`canzona.optim.spec.OptimizerDef.kernels`: the matrix, or each block of a blocked
preconditioner) an update costs

    steady flops / matmul peak (in the optimizer's matmul dtype)
  + refresh flops / eigendecomposition rate / refresh interval
  + elementwise passes × 4 bytes × elements / memory bandwidth
  + one per-kernel overhead (the profile's per-update overhead: launches, Python),

and an elementwise AdamW parameter costs its per-tensor overhead plus its elements at the
profile's AdamW seconds per element (its bytes per element over the memory bandwidth in a
spec-derived profile). The rates are the profile's (`canzona.sim.profile`): peaks times the
stated efficiencies for spec-derived profiles, measured ones for calibrated profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from canzona.inventory import ParamSpec
from canzona.optim import registry
from canzona.optim.spec import OptimizerDef
from canzona.sim.profile import Profile, load_profile


@dataclass
class RooflineCost:
    optimizer: str
    settings: Any
    profile: Profile
    name: str = "roofline"

    @classmethod
    def on(cls, profile: Any, optimizer: str, settings: Any) -> RooflineCost:
        """On ``profile``: a `Profile`, a profile dict, a name under profiles/ or a YAML path."""
        return cls(optimizer, settings, load_profile(profile))

    @property
    def definition(self) -> OptimizerDef:  # looked up, not kept: the model is pickled to other ranks
        return registry.get(self.optimizer)

    def __post_init__(self) -> None:
        p = self.profile
        self.source = f"roofline: {_where(p)}"
        self.kernel_overhead_s = p.update_overhead.get(self.optimizer, p.call_overhead_s)

    def kernel_seconds(self, m: int, n: int) -> float:
        """One update of one m×n kernel (see the module docstring)."""
        d, s, p = self.definition, self.settings, self.profile
        rate = p.matmul_flops.get(d.matmul_dtype(s), p.matmul_flops["float32"])
        every = d.refresh_every(s) if d.refresh_every is not None else None
        refresh = d.refresh_flops((m, n), s) / p.eigh_flops / every if every else 0.0
        return (d.steady_flops((m, n), s) / rate + refresh + d.elementwise_passes * 4.0 * m * n / p.memory_Bps
                + self.kernel_overhead_s)

    def cost(self, spec: ParamSpec) -> float:
        if spec.kind != "matrix" or not self.definition.matrix:
            return self.profile.adamw_tensor_overhead_s + spec.numel * self.profile.adamw_s_per_elem
        return sum(self.kernel_seconds(a, b) for _, shape in spec.matrices
                   for a, b in self.definition.kernels(shape, self.settings))


def _where(p: Profile) -> str:
    if p.path:
        from canzona import CHECKOUT

        path = str(p.path)
        return path[len(str(CHECKOUT)) + 1:] if path.startswith(str(CHECKOUT) + "/") else path
    return f"profile {p.name} ({p.source})"
