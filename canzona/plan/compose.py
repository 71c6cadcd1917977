"""One DP strategy and one TP strategy joined into a `Plan` (pure, rank-independent).

The DP strategy offers one or more candidate layouts (`canzona.plan.types.DpLayout`: how
gradients are reduced, who owns each update, how parameters are synced); each is joined with the
TP strategy -- per DP rank, the TP-sharded matrices that rank updates are handed to the TP
strategy's ``groups`` (pipelined strategies) or left to every TP rank (duplicated, local) -- and
a DP strategy with several candidates scores the joined plans and the lowest wins.

What the DP strategy's score counts is the optimizer's compute (its critical path,
`canzona.plan.critical_path`). Candidates that tie on it within a few per cent can still differ
in per-element work it does not see: every TP rank applies its local slice of each matrix its
DP rank updated, so a DP rank holding 12 small matrices pays more than one holding 4 large ones
of the same compute (Qwen3-14B, DP 32 x TP 8: the whole-tensor cuts' 9.8e8 elements on one DP
rank against 4.3e8 for the joint balance, 0.37 ms less compute but 0.6 ms more apply, clip and
gather in the projection). Among several candidates the score is therefore charged, as a
critical path, with that apply work (`apply_loads`), priced from the inputs' own elementwise
costs (`elementwise_price`) -- costs only, no timing inside the planner.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from canzona.plan.critical_path import critical_path
from canzona.plan.loads import owner_loads
from canzona.plan.rank_loads import plan_loads
from canzona.plan.registry import DP_STRATEGIES, TP_STRATEGIES, check, label
from canzona.plan.tp import MicroGroup
from canzona.plan.types import DpLayout, Plan, PlanInputs, TpMode


def compose(inputs: PlanInputs, dp_strategy: str, tp_strategy: str) -> Plan:
    """The plan of DP strategy ``dp_strategy`` with TP strategy ``tp_strategy`` on ``inputs``."""
    t0 = time.perf_counter()
    check(dp_strategy, tp_strategy, inputs.matrix_optimizer, inputs.tp)
    dps, tps = DP_STRATEGIES[dp_strategy], TP_STRATEGIES[tp_strategy]
    matrix_rule = inputs.matrix_optimizer and not dps.ELEMENTWISE_ONLY
    mode: TpMode = tps.MODE if matrix_rule and inputs.tp > 1 else "local"
    split = frozenset(i for i, p in enumerate(inputs.params) if matrix_rule and p.kind == "matrix" and p.tp_dim is not None)
    # what the TP strategy splits over TP owners (nothing unless it pipelines): a DP strategy
    # that balances DP x TP jointly counts those matrices on one TP rank, the rest on all
    tp_split = split if mode == "pipeline" else frozenset()
    plans = [_join(inputs, dp_strategy, tp_strategy, matrix_rule, mode, split, c)
             for c in dps.candidates(inputs, tp_split)]
    if len(plans) == 1:
        best = plans[0]
    else:  # min keeps the first tie
        price = elementwise_price(inputs)
        best = min(plans, key=lambda p: dps.score(p, inputs) + inputs.settings.alpha * _apply_excess(p, price))
    return replace(best, plan_seconds=time.perf_counter() - t0)


def _join(inputs: PlanInputs, dp_strategy: str, tp_strategy: str, matrix_rule: bool, mode: TpMode,
          split: frozenset[int], c: DpLayout) -> Plan:
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
            cache[key] = tuple(TP_STRATEGIES[tp_strategy].groups(items, inputs, c.tp_hint)) if items else ()
        for g in cache[key]:
            for i, o in zip(g.items, g.owners):
                tp_owner[i] = o
        groups.append(cache[key])
    return Plan(
        method=label(dp_strategy, tp_strategy), params=inputs.params, layout=inputs.layout, cost=inputs.cost,
        cost_model=inputs.cost_model, matrix_rule=matrix_rule, grad_reduce=c.grad_reduce, param_sync=c.param_sync,
        tp_mode=mode, shard_ranges=c.shard_ranges, dp_owner=c.dp_owner, tp_owner=tuple(tp_owner),
        micro_groups=tuple(groups), dp_strategy=dp_strategy, tp_strategy=tp_strategy,
    )


def elementwise_price(inputs: PlanInputs) -> tuple[float, float]:
    """(cost per call, cost per element) of elementwise work in ``inputs``' cost units: the line
    through the cheapest and the dearest elementwise parameter's cost against its elements
    ((0, 0) when the inputs hold fewer than two elementwise sizes)."""
    ew = sorted({(inputs.params[i].numel, c) for i, c in inputs.cost.items()
                 if inputs.params[i].kind != "matrix" or not inputs.matrix_optimizer})
    if len(ew) < 2 or ew[-1][0] == ew[0][0]:
        return 0.0, 0.0
    (n0, c0), (n1, c1) = ew[0], ew[-1]
    rate = max(0.0, (c1 - c0) / (n1 - n0))
    return max(0.0, c0 - rate * n0), rate


def apply_loads(plan: Plan, price: tuple[float, float]) -> np.ndarray:
    """[dp, tp] apply work of ``plan``'s matrix updates: every TP rank of a matrix's DP owner
    writes its local slice of the update (one call per matrix)."""
    per_call, per_elem = price
    loads = np.zeros((plan.dp, plan.tp))
    for i, spec in enumerate(plan.params):
        d = plan.dp_owner[i]
        if d is not None and plan.uses_matrix_rule(i):
            loads[d, :] += per_call + per_elem * spec.local_numel(plan.tp)
    return loads


def step_estimate(plan: Plan, price: tuple[float, float]) -> float:
    """The plan's critical-path imbalance with the apply work counted outside the groups (what
    `compose` ranks a DP strategy's candidates by, beside the strategy's own score)."""
    compute = plan_loads(plan)[0] if any(o is None for o in plan.dp_owner) else owner_loads(plan)
    return critical_path(plan, compute + apply_loads(plan, price)).imbalance


def _apply_excess(plan: Plan, price: tuple[float, float]) -> float:
    if price == (0.0, 0.0) or any(o is None for o in plan.dp_owner):
        return 0.0
    return step_estimate(plan, price) - critical_path(plan, owner_loads(plan)).imbalance
