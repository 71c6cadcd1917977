"""Batched Muon (one stacked Newton–Schulz per shape) against one matrix at a time, in one run.

    python benchmarks/batched_bench.py [--div 8] [--rounds 30] [--threads 1] [--device cpu]
                                       [--out benchmarks/results/batched_bench.csv]

Cases: B = 16, 64 and 128 expert matrices of Qwen3-30B-A3B's expert shape (768 x 2048: one
rank's experts of one layer, or of several), and a dense case, Qwen3-0.6B's 28 fc2 matrices
(1024 x 3072); every side divided by ``--div`` so that a CPU finishes (``--div 1`` on a GPU).
Each round times one `Muon.directions` call over the B matrices on both paths
(``batch_equal_shapes`` off and on), in alternating order (one-at-a-time first on even
rounds, batched first on odd ones), so drift and background load hit both alike. Printed per
case: the medians and the speedup (one-at-a-time / batched) as the ratio of the medians with
the reports' 90% paired bootstrap interval over rounds (`analysis.stats.ratio_with_ci`), all measured in this run. Numbers mean something only on
an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
from bench_io import write_csv

from analysis.stats import ratio_with_ci
from canzona.optim import Muon

# (label, B, rows, cols) before --div
CASES = [
    ("experts", 16, 768, 2048),
    ("experts", 64, 768, 2048),
    ("experts", 128, 768, 2048),
    ("dense fc2", 28, 1024, 3072),
]


def timed(rule: Muon, grads: list[torch.Tensor], states: list[dict], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    rule.directions(grads, states, 2)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bench_case(count: int, rows: int, cols: int, rounds: int, device: torch.device) -> dict[str, float]:
    grads = [torch.randn(rows, cols, device=device) for _ in range(count)]
    rules = {False: Muon(), True: Muon(batch_equal_shapes=True)}
    states = {b: [r.init_state((rows, cols), device, torch.float32) for _ in grads] for b, r in rules.items()}
    for b, r in rules.items():  # warm up both paths
        r.directions(grads, states[b], 2)
    times: dict[bool, list[float]] = {False: [], True: []}
    for k in range(rounds):
        for b in ((False, True) if k % 2 == 0 else (True, False)):
            times[b].append(timed(rules[b], grads, states[b], device))
    # the report's ratio of medians with its bootstrap; each round is a pair (both paths ran in it)
    ratio, lo, hi = ratio_with_ci([np.array([t]) for t in times[False]], [np.array([t]) for t in times[True]],
                                  paired=True)
    return {"one_at_a_time_ms": 1e3 * statistics.median(times[False]),
            "batched_ms": 1e3 * statistics.median(times[True]), "speedup": ratio, "ci_low": lo, "ci_high": hi}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--div", type=int, default=8, help="divide every matrix side by this")
    ap.add_argument("--rounds", type=int, default=30, help="paired rounds per case")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cases", default="all", help="comma-separated case numbers (0-based), or all")
    ap.add_argument("--out", default="benchmarks/results/batched_bench.csv")
    args = ap.parse_args()
    if args.div < 1 or args.rounds < 2:
        ap.error("--div must be >= 1 and --rounds >= 2")
    picked = range(len(CASES)) if args.cases == "all" else [int(c) for c in args.cases.split(",")]
    if any(not 0 <= c < len(CASES) for c in picked):
        ap.error(f"--cases takes numbers 0..{len(CASES) - 1}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    rows = []
    print(f"{'case':10} {'B':>4} {'shape':>11} {'one-at-a-time':>14} {'batched':>10} {'speedup [90% CI]':>24}")
    for c in picked:
        label, count, m, n = CASES[c]
        m, n = max(1, m // args.div), max(1, n // args.div)
        r = bench_case(count, m, n, args.rounds, device)
        rows.append({"case": label, "matrices": count, "rows": m, "cols": n, "rounds": args.rounds,
                     "threads": args.threads, "device": args.device, **r})
        print(f"{label:10} {count:4} {f'{m}x{n}':>11} {r['one_at_a_time_ms']:11.2f} ms {r['batched_ms']:7.2f} ms "
              f"{r['speedup']:7.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]", flush=True)
    write_csv(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
