"""One DP strategy and one TP strategy joined into a `Plan` (pure, rank-independent).

The DP strategy offers one or more candidate layouts (`canzona.plan.types.DpLayout`: how
gradients are reduced, who owns each update, how parameters are synced); each is joined with the
TP strategy -- per DP rank, the TP-sharded matrices that rank updates are handed to the TP
strategy's ``groups`` (pipelined strategies) or left to every TP rank (duplicated, local) -- and
a DP strategy with several candidates scores the joined plans and the lowest wins.
"""

from __future__ import annotations

import time
from dataclasses import replace

from canzona.plan.registry import DP_STRATEGIES, TP_STRATEGIES, check, label
from canzona.plan.tp import MicroGroup
from canzona.plan.types import DpLayout, Plan, PlanInputs, TpMode


def compose(inputs: PlanInputs, dp: str, tp: str) -> Plan:
    """The plan of DP strategy ``dp`` with TP strategy ``tp`` on ``inputs``."""
    t0 = time.perf_counter()
    check(dp, tp, inputs.matrix_optimizer, inputs.tp)
    dps, tps = DP_STRATEGIES[dp], TP_STRATEGIES[tp]
    matrix_rule = inputs.matrix_optimizer and not dps.ELEMENTWISE_ONLY
    mode: TpMode = tps.MODE if matrix_rule and inputs.tp > 1 else "local"
    split = frozenset(i for i, p in enumerate(inputs.params) if matrix_rule and p.kind == "matrix" and p.tp_dim is not None)
    # what the TP strategy splits over TP owners (nothing unless it pipelines): a DP strategy
    # that balances DP x TP jointly counts those matrices on one TP rank, the rest on all
    tp_split = split if mode == "pipeline" else frozenset()
    plans = [_join(inputs, dp, tp, matrix_rule, mode, split, c) for c in dps.candidates(inputs, tp_split)]
    best = plans[0] if len(plans) == 1 else min(plans, key=lambda p: dps.score(p, inputs))  # min keeps the first tie
    return replace(best, plan_seconds=time.perf_counter() - t0)


def _join(inputs: PlanInputs, dp: str, tp: str, matrix_rule: bool, mode: TpMode, split: frozenset[int],
          c: DpLayout) -> Plan:
    if c.layout is not None:  # the DP strategy's own buffer
        inputs = replace(inputs, layout=c.layout)
    n = len(inputs.params)
    tp_owner: list[int | None] = [None] * n
    groups: list[tuple[MicroGroup, ...]] = []
    cache: dict[tuple[int, ...], tuple[MicroGroup, ...]] = {}  # ddp: every DP rank runs the same groups
    for d in range(inputs.dp):
        items = [i for i in sorted(split) if c.dp_owner[i] in (None, d)] if mode == "pipeline" else []
        key = tuple(items)
        if key not in cache:
            cache[key] = tuple(TP_STRATEGIES[tp].groups(items, inputs, c.tp_hint)) if items else ()
        for g in cache[key]:
            for i, o in zip(g.items, g.owners):
                tp_owner[i] = o
        groups.append(cache[key])
    return Plan(
        method=label(dp, tp), params=inputs.params, layout=inputs.layout, cost=inputs.cost,
        cost_model=inputs.cost_model, matrix_rule=matrix_rule, grad_reduce=c.grad_reduce, param_sync=c.param_sync,
        tp_mode=mode, shard_ranges=c.shard_ranges, dp_owner=c.dp_owner, tp_owner=tuple(tp_owner),
        micro_groups=tuple(groups), dp_strategy=dp, tp_strategy=tp,
    )
