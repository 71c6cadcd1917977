"""TP strategy ``gram_allreduce``: every TP rank orthogonalises its own shard; Newton–Schulz's
Gram products and norm are all-reduced over TP (megatron-core 0.19.2's ``muon_tp_mode=distributed``).

As emerging-optimizers 0.3.0's ``newton_schulz_tp(..., tp_mode="distributed")``, which
megatron-core 0.19.2's ``TensorParallelMuon`` calls: no TP rank ever holds a whole matrix. Each
keeps the momentum of its shard, and per matrix (per sub-matrix with ``model.split_fused``, as
Megatron's ``split_qkv`` splits each rank's query groups) it all-reduces the shard's sum of
squares for the Frobenius norm, then at every Newton–Schulz step the shard's partial Gram
product over the *unsharded* side (column-parallel, rows sharded: Xᵀ X; row-parallel, columns
sharded: X Xᵀ), whose sum over TP is the whole matrix's Gram; the polynomial of the Gram is
computed whole on every rank, the update of the shard locally. Per matrix: 1 + ``ns_steps``
blocking all-reduces over TP, u² elements each (u the unsharded side) in the Newton–Schulz
dtype; compute about 1/TP of the matrix's but the u³ polynomial, which every TP rank repeats.
One matrix at a time, in the DP strategy's order, as Megatron's optimizer loops over its
parameters. Only an optimizer whose update is built from such sums can run so: Muon
(`canzona.optim.spec.OptimizerDef.tp_sharded`); Shampoo and SOAP are refused.
"""

from __future__ import annotations

from canzona.plan.tp import MicroGroup
from canzona.plan.types import PlanInputs

NAME = "gram_allreduce"
RUNG = None
MODE = "gram"


def groups(items: list[int], inputs: PlanInputs, hint: dict[int, int] | None) -> list[MicroGroup]:
    return []
