"""DP strategy ``layerwise``: megatron-core 0.16's ``LayerWiseDistributedOptimizer``.

Gradients are all-reduced as in plain DDP; whole params are dealt to DP ranks as 0.16.1's
``LayerWiseDistributedOptimizer.shard_params`` deals them (optimizer/layer_wise_optimizer.py):
every param of every optimizer's param groups, in that order, stably sorted by TP-local ``numel``
*ascending*, then handed out in a ping-pong loop over the ranks (0, 1, .., P-1, P-1, .., 0, 0, ..),
not by the optimizer's cost nor by LPT. The groups are those ``get_megatron_muon_optimizer``
builds (optimizer/muon.py): the matrix optimizer's params, then Adam's, whose
``_get_param_groups`` puts the default group (the embedding and output layer) before the
no-weight-decay one (1-D params); within a group, registration order. Each rank updates the
params it owns; then the updated params are all-gathered, each rank's owned params packed into a
shard padded to the largest. Megatron pairs it with ``duplicated`` TP (preset ``layerwise``).
tests/unit/test_megatron_layout.py checks the owners against 0.16.1's own ``shard_params``.
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.inventory import ParamSpec
from canzona.plan.types import DpLayout, PlanInputs

NAME = "layerwise"
RUNG = None
ELEMENTWISE_ONLY = False


def optimizer_order(params: Sequence[ParamSpec]) -> list[int]:
    """Inventory indices in the order 0.16's chained optimizers hold them: the matrix optimizer's
    group, then Adam's default group (2-D and larger), then its no-weight-decay group (1-D)."""
    def group(i: int) -> int:
        if params[i].kind == "matrix":
            return 0
        return 1 if len(params[i].shape) > 1 else 2
    return sorted(range(len(params)), key=group)  # stable: registration order within a group


def ping_pong(numel: Sequence[int], ranks: int, order: Sequence[int]) -> list[int]:
    """Item -> rank: ``order`` stably sorted by ``numel`` ascending, dealt over the ranks forward
    then backward (0..P-1, P-1..0) and around again."""
    loop = list(range(ranks)) + list(range(ranks))[::-1]
    owner = [0] * len(numel)
    for k, i in enumerate(sorted(order, key=lambda i: numel[i])):
        owner[i] = loop[k % len(loop)]
    return owner


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    numel = [p.local_numel(inputs.tp) for p in inputs.params]
    owners = ping_pong(numel, inputs.dp, optimizer_order(inputs.params))
    return [DpLayout("all_reduce", "owned_params", None, tuple(owners))]
