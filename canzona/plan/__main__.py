"""``python -m canzona.plan key=value ... [--json]``: plan one layout and print who computes what.

Example: ``python -m canzona.plan model=qwen3-32b parallel.dp=64 parallel.tp=8 method=canzona``
"""

from __future__ import annotations

import json
import sys

from canzona.cli import run_command
from canzona.config import TrialConfig, parse_cli
from canzona.errors import ConfigError
from canzona.inventory import ParamSpec
from canzona.plan.critical_path import CriticalPath, critical_path
from canzona.plan.from_config import make_plan
from canzona.plan.types import Plan
from canzona.program.count import PlanMetrics, compute_metrics
from canzona.program.lower import lower_rank
from canzona.program.render import render_program


def plan_json(plan: Plan, metrics: PlanMetrics, path: CriticalPath) -> dict:
    """The --json document: every parameter once (sub-matrices when split_fused), ranks,
    imbalance (per-rank and critical path), and each DP rank's micro-groups in execution order
    as lists of ``[param name, TP owner]`` (names as in ``params``: a fused matrix's sub-matrices
    with ``model.split_fused``, which share its owner)."""
    params = []
    for i, spec in enumerate(plan.params):
        is_matrix = plan.uses_matrix_rule(i)
        dp_owner = plan.dp_owner[i]
        tp_owner = plan.tp_owner[i] if is_matrix else None
        entries = spec.subs or (None,)
        for sub in entries:
            name, shape = (sub.name, sub.shape) if sub else (spec.name, spec.shape)
            share = plan.cost[i] if sub is None else plan.cost[i] * _numel(sub.shape) / spec.numel
            params.append(
                {
                    "name": name,
                    "shape": list(shape),
                    "kind": spec.kind if plan.matrix_rule else "adamw",
                    "tp_partition_dim": spec.tp_dim,
                    "dp_owner": dp_owner,
                    "tp_owner": tp_owner,
                    "cost": share,
                }
            )
    from canzona.plan.registry import rung

    doc = {
        "method": plan.method,
        "method_dp": plan.dp_strategy,
        "method_tp": plan.tp_strategy,
        "rung": rung(plan.dp_strategy, plan.tp_strategy),
        "cost_model": plan.cost_model,
        "cost_source": plan.cost_source,
        "dp": plan.dp,
        "tp": plan.tp,
        "params": params,
        "ranks": metrics.ranks(),
        "imbalance": {
            **metrics.imbalance(),
            "critical_path": path.imbalance,
            "critical_path_lower_bound": path.lower_bound,
        },
        "collectives_per_step": metrics.collectives,
        "buckets": len(plan.layout.buckets),
        "micro_groups": [
            [[[name, o] for i, o in zip(g.items, g.owners) for name in _names(plan.params[i])] for g in groups]
            for groups in plan.micro_groups
        ],
        "plan_seconds": plan.plan_seconds,
    }
    if plan.experts is not None:
        # an MoE model's expert matrices join ``params`` (with ``expert``, ``ep_rank``, ``dp_owner``
        # as the expert-DP rank and ``ranks``, the global ranks computing it); the ``experts``
        # section gives the grid, the expert buckets and their imbalance
        from canzona.plan.expert_report import expert_params, expert_summary

        params.extend(expert_params(plan.experts))
        doc["experts"] = expert_summary(plan)
        doc["plan_seconds"] = plan.plan_seconds + plan.experts.plan_seconds
    return doc


def _names(spec: ParamSpec) -> list[str]:
    return [s.name for s in spec.subs] if spec.subs else [spec.name]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def render_table(cfg: TrialConfig, plan: Plan, m: PlanMetrics, path: CriticalPath) -> str:
    groups = sorted(len(g) for g in plan.micro_groups)
    lines = [
        f"{cfg.model_cfg().name}  method={plan.method} (dp {plan.dp_strategy}, tp {plan.tp_strategy}"
        + (f", the authors' {cfg.method.rung}" if cfg.method.rung else "") + f")  optimizer={cfg.optimizer.name}  dp={plan.dp} tp={plan.tp}  "
        f"cost={plan.cost_model}  buckets={len(plan.layout.buckets)}  planned in {plan.plan_seconds * 1e3:.1f} ms",
        f"costs: {plan.cost_source}",
        f"imbalance: compute {m.compute_imbalance:.3f}  memory {m.memory_imbalance:.3f}  "
        f"lower bound {m.lower_bound:.3f}  collectives/step {m.collectives}",
        f"critical path (each micro-group at its slowest TP rank): {path.imbalance:.3f}  "
        f"lower bound {path.lower_bound:.3f}  micro-groups per DP rank "
        + (f"{groups[0]}-{groups[-1]}" if groups and groups[0] != groups[-1] else f"{groups[0] if groups else 0}"),
        "",
        f"{'dp':>4} {'tp':>3} {'compute':>12} {'share':>7} {'state numel':>13} {'send MB':>9} {'recv MB':>9}",
    ]
    total = m.compute.sum() or 1.0
    rows = m.ranks()
    shown = rows if len(rows) <= 32 else rows[:16] + rows[-16:]
    for k, r in enumerate(shown):
        if len(rows) > 32 and k == 16:
            lines.append(f"{'...':>4} ({len(rows) - 32} more ranks)")
        lines.append(
            f"{r['dp_rank']:>4} {r['tp_rank']:>3} {r['compute']:>12.4g} {r['compute'] / total:>7.2%} "
            f"{r['numel']:>13,} {r['send_bytes'] / 1e6:>9.1f} {r['recv_bytes'] / 1e6:>9.1f}"
        )
    if plan.experts is not None:
        from canzona.plan.expert_report import render_experts

        lines.insert(2, "dense and expert params in the imbalance and the rank table below (counted programs); the "
                        "expert buffer's buckets after them")
        lines += render_experts(plan)
    return "\n".join(lines)


def _program_rank(value: str | None, world: int) -> int | None:
    if value is None:
        return None
    try:
        rank = int(value)
    except ValueError:
        rank = -1
    if not 0 <= rank < world:
        raise ConfigError(f"--program {value!r}: a rank from 0 to {world - 1} (world size {world})")
    return rank


def main(argv: list[str] | None = None) -> int:
    return run_command("canzona.plan", _plan, argv)


def _plan(argv: list[str]) -> int:
    cfg, args = parse_cli(argv, flags=("--json",), options=("--program",))
    plan = make_plan(cfg)
    rank = _program_rank(args.options.get("--program"), plan.rank_layout.world)
    if rank is not None:
        print(render_program(plan, lower_rank(plan, rank)))
        return 0
    metrics = compute_metrics(plan)
    path = critical_path(plan, metrics.compute)
    if "--json" in args.flags:
        print(json.dumps(plan_json(plan, metrics, path)))
    else:
        print(render_table(cfg, plan, metrics, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
