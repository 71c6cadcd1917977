"""Planner benchmark: planning time, per-rank and critical-path imbalance across Qwen3.

    python benchmarks/plan_bench.py [--out benchmarks/results/plan_bench.csv] [key=value ...]

For every model of the family, DP ∈ {8, 16, 32, 64, 128, 256} and TP ∈ {1, 2, 4, 8}, plans each
method (Muon, flops cost, default buckets unless overridden) and records ``plan_seconds``, the
per-rank compute and memory imbalance and their lower bound, the critical-path imbalance (each
TP micro-group counted at its slowest TP rank) and its lower bound, the most micro-groups a DP
rank runs, and plain LPT over the same work on DP×TP ranks with no layout constraint (the
reference canzona is measured against). For TP > 1 canzona is also planned with the ablation
groupings ``global`` (the paper's greedy rollback) and ``single`` (chunks of T), recorded in the
``grouping`` column.

Prints: compute imbalance of every method at TP 1 and 8; canzona's critical path against the
issue-10 target max(1.10, 1.02 × lower bound) for Qwen3-8B/14B/32B, TP 2-8, DP 8-64, beside the
ablation groupings; and the planning time of Qwen3-32B on 256 ranks (median of 5 plans).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
from bench_io import write_csv

from canzona.config import load_config
from canzona.errors import ConfigError
from canzona.inventory import QWEN3
from canzona.plan.critical_path import critical_path
from canzona.plan.dp import lpt
from canzona.plan.from_config import make_plan
from canzona.plan.types import Plan
from canzona.program.count import compute_metrics

DPS = (8, 16, 32, 64, 128, 256)
TPS = (1, 2, 4, 8)
METHODS = ("canzona", "layerwise", "sync", "adamw")
ABLATIONS = ("global", "single")  # planner.grouping, TP > 1 only
TARGET_MODELS = ("qwen3-8b", "qwen3-14b", "qwen3-32b")
TARGET_TPS = (2, 4, 8)
TARGET_DPS = (8, 16, 32, 64)


def unconstrained_lpt(plan: Plan) -> float:
    """Imbalance of LPT over the same work on dp*tp bins, ignoring buckets and the DP/TP split."""
    tp = plan.tp
    items: list[float] = []
    for i, spec in enumerate(plan.params):
        if plan.uses_matrix_rule(i):
            items.append(plan.cost[i])
        elif spec.tp_dim is not None:
            items += [plan.cost[i] / tp] * tp
        else:
            items += [plan.cost[i]] * tp
    loads = np.zeros(plan.dp * tp)
    for w, o in zip(items, lpt(items, plan.dp * tp)):
        loads[o] += w
    return float(loads.max() / (sum(plan.cost.values()) / (plan.dp * tp)))


def target(row: dict) -> float:
    """Issue 10's bound on the critical-path imbalance."""
    return max(1.10, 1.02 * row["critical_path_lower_bound"])


def bench_row(model: str, dp: int, tp: int, method: str, grouping: str, overrides: list[str]) -> tuple[dict, Plan]:
    extra = [f"planner.grouping={grouping}"] if grouping else []
    plan = make_plan(load_config([f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}",
                                  "planner.cost=flops", *extra, *overrides]))
    m = compute_metrics(plan)
    path = critical_path(plan, m.compute)
    return {"model": model, "dp": dp, "tp": tp, "method": method, "grouping": grouping,
            "plan_seconds": round(plan.plan_seconds, 4),
            "compute_imbalance": round(m.compute_imbalance, 4),
            "memory_imbalance": round(m.memory_imbalance, 4),
            "lower_bound": round(m.lower_bound, 4),
            "critical_path": round(path.imbalance, 4),
            "critical_path_lower_bound": round(path.lower_bound, 4),
            "micro_groups": max((len(g) for g in plan.micro_groups), default=0)}, plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/plan_bench.csv")
    args, overrides = ap.parse_known_args()
    try:
        load_config(overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    for model in QWEN3:
        for tp in TPS:
            for dp in DPS:
                lpt_ref = None
                runs = [(m, "") for m in METHODS] + ([("canzona", g) for g in ABLATIONS] if tp > 1 else [])
                for method, grouping in runs:
                    row, plan = bench_row(model, dp, tp, method, grouping, overrides)
                    if lpt_ref is None:
                        lpt_ref = unconstrained_lpt(plan)
                    row["lpt_reference"] = round(lpt_ref, 4)
                    rows.append(row)
        slowest = max(r["plan_seconds"] for r in rows if r["model"] == model and r["method"] == "canzona"
                      and not r["grouping"])
        print(f"{model}: slowest canzona plan {slowest:.3f} s", flush=True)
    write_csv(rows, args.out)

    def cell(model: str, tp: int, dp: int, method: str = "canzona", grouping: str = "") -> dict:
        return next(r for r in rows if (r["model"], r["tp"], r["dp"], r["method"], r["grouping"])
                    == (model, tp, dp, method, grouping))

    print("\ncompute imbalance (canzona / layerwise / sync / lpt reference), TP=1 and TP=8:")
    print(f"{'model':11} {'tp':>2} " + " ".join(f"{'dp=' + str(d):>26}" for d in DPS))
    for model in QWEN3:
        for tp in (1, 8):
            cells = []
            for dp in DPS:
                c, lw, sy = (cell(model, tp, dp, m) for m in ("canzona", "layerwise", "sync"))
                cells.append(f"{c['compute_imbalance']:.2f}/{lw['compute_imbalance']:.2f}/"
                             f"{sy['compute_imbalance']:.0f}/{c['lpt_reference']:.2f}")
            print(f"{model:11} {tp:>2} " + " ".join(f"{c:>26}" for c in cells))

    print("\ncanzona critical path / per-rank compute / lower bound [global / single critical path];"
          " '!' marks a cell above max(1.10, 1.02 x lower bound):")
    print(f"{'model':11} {'tp':>2} " + " ".join(f"{'dp=' + str(d):>32}" for d in TARGET_DPS))
    above = 0
    for model in TARGET_MODELS:
        for tp in TARGET_TPS:
            cells = []
            for dp in TARGET_DPS:
                r = cell(model, tp, dp)
                flag = "!" if r["critical_path"] > target(r) + 1e-9 else " "
                above += flag == "!"
                ab = "/".join(f"{cell(model, tp, dp, 'canzona', g)['critical_path']:.2f}" for g in ABLATIONS)
                cells.append(f"{r['critical_path']:.2f}/{r['compute_imbalance']:.2f}/"
                             f"{r['critical_path_lower_bound']:.2f}{flag}[{ab}]")
            print(f"{model:11} {tp:>2} " + " ".join(f"{c:>32}" for c in cells))
    print(f"cells above the target: {above}")

    print("\nplanning Qwen3-32B on 256 ranks (median / max of 5 plans):")
    for dp, tp in ((32, 8), (64, 4), (128, 2), (256, 1)):
        times = [bench_row("qwen3-32b", dp, tp, "canzona", "", overrides)[1].plan_seconds for _ in range(5)]
        print(f"  dp={dp:>3} tp={tp}: {statistics.median(times):.3f} s / {max(times):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
