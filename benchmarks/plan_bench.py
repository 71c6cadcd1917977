"""Planner benchmark: planning time and compute imbalance of every method across Qwen3.

    python benchmarks/plan_bench.py [--out benchmarks/results/plan_bench.csv] [key=value ...]

For every model of the family, DP ∈ {8, 16, 32, 64, 128, 256} and TP ∈ {1, 2, 4, 8}, plans each
method (Muon, flops cost, default buckets unless overridden) and records ``plan_seconds``, the
compute and memory imbalance, the lower bound, and plain LPT over the same work on DP×TP ranks
with no layout constraint (the reference canzona is measured against). Prints a summary table
of compute imbalance and the slowest planning time per model.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from bench_io import write_csv

from canzona.config import load_config
from canzona.inventory import QWEN3
from canzona.plan.dp import lpt
from canzona.plan.methods import make_plan
from canzona.plan.types import Plan
from canzona.program.count import compute_metrics

DPS = (8, 16, 32, 64, 128, 256)
TPS = (1, 2, 4, 8)
METHODS = ("canzona", "layerwise", "sync", "adamw")


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/plan_bench.csv")
    args, overrides = ap.parse_known_args()
    rows = []
    for model in QWEN3:
        for tp in TPS:
            for dp in DPS:
                lpt_ref = None
                for method in METHODS:
                    plan = make_plan(load_config([f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}",
                                                  f"method={method}", *overrides]))
                    m = compute_metrics(plan)
                    if lpt_ref is None:
                        lpt_ref = unconstrained_lpt(plan)
                    rows.append({"model": model, "dp": dp, "tp": tp, "method": method,
                                 "plan_seconds": round(plan.plan_seconds, 4),
                                 "compute_imbalance": round(m.compute_imbalance, 4),
                                 "memory_imbalance": round(m.memory_imbalance, 4),
                                 "lower_bound": round(m.lower_bound, 4), "lpt_reference": round(lpt_ref, 4)})
        print(f"{model}: slowest canzona plan {max(r['plan_seconds'] for r in rows if r['model'] == model and r['method'] == 'canzona'):.3f} s",
              flush=True)
    write_csv(rows, args.out)
    print("\ncompute imbalance (canzona / layerwise / sync / lpt reference), TP=1 and TP=8:")
    print(f"{'model':11} {'tp':>2} " + " ".join(f"{'dp=' + str(d):>26}" for d in DPS))
    for model in QWEN3:
        for tp in (1, 8):
            cells = []
            for dp in DPS:
                by = {r["method"]: r for r in rows if (r["model"], r["tp"], r["dp"]) == (model, tp, dp)}
                cells.append(f"{by['canzona']['compute_imbalance']:.2f}/{by['layerwise']['compute_imbalance']:.2f}/"
                             f"{by['sync']['compute_imbalance']:.0f}/{by['canzona']['lpt_reference']:.2f}")
            print(f"{model:11} {tp:>2} " + " ".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
