"""Optimizer step latency and iteration time of every method on this machine, in one run.

    python benchmarks/method_bench.py [--out benchmarks/results/method_bench.csv] [key=value ...]

Runs each method (canzona, sync, layerwise, adamw) at dp=2, tp=2 and dp=2×tp=2 on a scaled
Qwen3 whose optimizer step is compute-bound, one thread per rank, and prints canzona's speedup
over sync and layerwise and its overhead over adamw as ratios of medians measured in this run.
Extra ``key=value`` overrides apply to every trial (e.g. ``optimizer=shampoo``).
``--rounds R`` runs the four methods R times in interleaved order and takes the median over
rounds, so background load on a shared machine hits every method alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_io import write_csv

from canzona.config import load_config
from canzona.run import run_trial

BASE = [
    "model=qwen3-8b", "model.width_div=16", "model.num_layers=4", "train.steps=8", "train.warmup=2",
    "train.micro_batch=1", "train.seq_len=32", "dist.threads_per_rank=1",
]
LAYOUTS = {"dp2": (2, 1), "tp2": (1, 2), "dp2tp2": (2, 2)}
METHODS = ("canzona", "sync", "layerwise", "adamw")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/method_bench.csv")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--rounds", type=int, default=1)
    args, overrides = ap.parse_known_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.layouts.split(","):
            dp, tp = LAYOUTS[layout]
            runs: dict[str, list[dict]] = {m: [] for m in METHODS}
            for k in range(args.rounds):
                for method in METHODS:
                    cfg = load_config([*BASE, f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}", *overrides])
                    runs[method].append(run_trial(cfg, Path(tmp) / f"{layout}-{method}-{k}"))
            for method in METHODS:
                def med(key: str, done: list[dict] = runs[method]) -> float:
                    return statistics.median(s[key] for s in done)

                rows.append({"layout": layout, "method": method, "optimizer": cfg.optimizer.name, "rounds": args.rounds,
                             "optimizer_step_ms": med("optimizer_step_ms_median"), "iteration_ms": med("iteration_ms_median"),
                             "opt_p10": med("optimizer_step_ms_p10"), "opt_p90": med("optimizer_step_ms_p90")})
                print(f"{layout:7} {method:10} optimizer step {rows[-1]['optimizer_step_ms']:8.1f} ms "
                      f"(p10 {rows[-1]['opt_p10']:.1f}, p90 {rows[-1]['opt_p90']:.1f})  iteration {rows[-1]['iteration_ms']:8.1f} ms",
                      flush=True)
    print()
    print(f"{'layout':7} {'opt: vs sync':>13} {'vs layerwise':>13} {'over adamw':>11} {'iter: vs sync':>14} {'vs layerwise':>13}")
    for layout in args.layouts.split(","):
        by = {r["method"]: r for r in rows if r["layout"] == layout}
        c = by["canzona"]
        print(f"{layout:7} {by['sync']['optimizer_step_ms'] / c['optimizer_step_ms']:12.2f}x "
              f"{by['layerwise']['optimizer_step_ms'] / c['optimizer_step_ms']:12.2f}x "
              f"{c['optimizer_step_ms'] / by['adamw']['optimizer_step_ms']:10.2f}x "
              f"{by['sync']['iteration_ms'] / c['iteration_ms']:13.2f}x "
              f"{by['layerwise']['iteration_ms'] / c['iteration_ms']:12.2f}x")
    write_csv(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
