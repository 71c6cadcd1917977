"""DP strategy ``zero1_atomic``: the authors' distributed optimizer with whole-tensor ownership.

The authors' default Muon run (Megatron-Canzona's train.sh with USE_DP_ASYNC_OPT=1 and
USE_DP_BALANCED_OPT=0): ZeRO-1 reduce-scatter and parameter all-gather, but each matrix belongs
whole to the DP rank whose *equal* shard holds its first element, and each rank's shard end is
stretched to the end of the last tensor it owns (`canzona.plan.dp.atomic_cuts`). No balance:
a rank owns what the layout happens to put at the start of its equal shard.

**Whose layout.** The authors' fork (liangyuwang/Megatron-Canzona, megatron-core 0.12/0.13
era: its ``DistributedDataParallel`` and ``_build_model_gbuf_param_range_map_whole_tensor``)
gives the params its matrix optimizer updates a gradient buffer of their own, laid out by the
same ``_ParamAndGradBuffer`` rule as megatron-core 0.16's (`canzona.plan.buckets.build_layout`
on those params alone, with the run's bucket size), and the equal shards of *that* buffer's
buckets decide the owners. The other params (norms; the embedding and output layer unless
``model.matrix_embeddings``) go to Megatron's ordinary buffer, which its distributed optimizer
shards elementwise; here they are owned whole by the same first-element rule on their own
buffer, because the lowering needs whole owners for every param once matrices have them (their
AdamW step is a few per cent of the step's work). Both buffers become one harness buffer
(`canzona.plan.buckets.join_buffers`); with no matrix optimizer (``optimizer=adamw``) there is
one buffer, the shared one every method reduces. tests/unit/test_megatron_layout.py holds the
owners to the authors' rule on megatron-core's own buffer code.
"""

from __future__ import annotations

from canzona.plan import dp as dpmod
from canzona.plan.buckets import bucket_size_of, join_buffers
from canzona.plan.types import DpLayout, PlanInputs

NAME = "zero1_atomic"
RUNG = "1_0"  # the authors' USE_DP_ASYNC_OPT=1, USE_DP_BALANCED_OPT=0
ELEMENTWISE_ONLY = False


def matrix_buffer(inputs: PlanInputs) -> list[int]:
    """The params the authors' fork lays into its matrix buffer: those its matrix optimizer
    updates (``is_param_use_matrix_based_optim``: 2-D, not the embedding, output layer or
    router), here the inventory's ``matrix`` params when the run has a matrix optimizer."""
    if not inputs.matrix_optimizer:
        return []
    return [i for i, p in enumerate(inputs.params) if p.kind == "matrix"]


def candidates(inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
    matrices = matrix_buffer(inputs)
    if not matrices:  # one buffer: the shared one
        ranges = dpmod.ranges_from_cuts(dpmod.atomic_cuts(inputs.layout))
        owners = dpmod.owners_from_ranges(inputs.layout, ranges)
        return [DpLayout("reduce_scatter", "shards", tuple(ranges), tuple(owners[i] for i in range(len(inputs.params))))]
    chosen = set(matrices)
    rest = [i for i in range(len(inputs.params)) if i not in chosen]
    size = bucket_size_of(inputs.layout, inputs.params)
    parts, owners = [], {}
    for indices in (matrices, rest):
        more, whose = dpmod.subset_buffer(inputs.params, indices, dp=inputs.dp, tp=inputs.tp, bucket_size=size,
                                          cuts=dpmod.atomic_cuts)
        parts += more
        owners.update(whose)
    layout, ranges = join_buffers(parts, inputs.dp, inputs.tp)
    return [DpLayout("reduce_scatter", "shards", ranges, tuple(owners[i] for i in range(len(inputs.params))),
                     layout=layout)]
