"""Which uneven reduce-scatter / all-gather to use for Canzona's shards (docs/design.md §3.1).

    python benchmarks/collective_bench.py [--out benchmarks/results/collective_bench.csv] [key=value ...]

Runs the same canzona trial with each ``dist.dp_collective`` (auto, padded, reduce_loop,
coalesced, all_to_all) at dp=2 and dp=4 and prints the exposed gradient reduction, the exposed
parameter sync and the iteration time (medians of the max over ranks), as measured in this run.
All are bit-identical in results (tests/dist/test_parity.py); only their cost differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench_io import write_csv

from canzona.config import DP_COLLECTIVES, load_config
from canzona.run import run_trial

BASE = [
    "model=qwen3-0.6b", "model.width_div=8", "model.num_layers=4", "train.steps=8", "train.warmup=2",
    "train.micro_batch=1", "train.seq_len=32", "dist.threads_per_rank=1", "method=canzona",
    "dist.overlap_grad_reduce=false",  # expose the whole reduction so it can be compared
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/collective_bench.csv")
    ap.add_argument("--dps", default="2,4")
    args, overrides = ap.parse_known_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dp in map(int, args.dps.split(",")):
            for how in DP_COLLECTIVES:
                cfg = load_config([*BASE, f"parallel.dp={dp}", f"dist.dp_collective={how}", *overrides])
                s = run_trial(cfg, Path(tmp) / f"{dp}-{how}")
                rows.append({"dp": dp, "dp_collective": how, "grad_reduce_ms": s["grad_reduce_ms_median"],
                             "param_sync_ms": s["param_sync_ms_median"], "iteration_ms": s["iteration_ms_median"]})
                r = rows[-1]
                print(f"dp={dp} {how:12} grad reduce {r['grad_reduce_ms']:7.1f} ms  param sync {r['param_sync_ms']:7.1f} ms"
                      f"  iteration {r['iteration_ms']:7.1f} ms", flush=True)
    write_csv(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
