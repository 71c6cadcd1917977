"""Projection benchmark: the paper-scale communication of canzona against ZeRO-1 (adamw) and sync.

    python benchmarks/projection_bench.py [hardware=h100] [--sweep-profile paper_projection|paper_authors]
                                          [--out CSV]

For every point (size × layout) of ``sweep=qwen3_scaling profile=paper_projection`` (micro-batch
1 × 4096 tokens, Megatron's default buckets) or ``profile=paper_authors`` (the authors' launch
settings: 2048 tokens, the global batch of 128, buckets of 4e8 elements) projects the
Muon trials of canzona, adamw and sync on the hardware file (``canzona.sim``; canzona twice,
with and without ``dist.overlap_param_gather``) and records:

- ``comm_max``: exposed gradient reduction + exposed parameter sync, each the max over ranks (the
  figures the report shows), canzona ÷ adamw. A rank that finishes its optimizer step early waits
  in the next forward for the gathers its slower peers have not issued yet, so this counts the
  step's imbalance as parameter sync;
- ``comm_transfer``: as ``comm_max`` with the parameter sync less those waits for peers still in
  their step (``param_sync_transfer_ms``, max over ranks): the communication the overlap leaves
  exposed, without the step's imbalance;
- ``comm_critical``: the same as ``comm_max`` on the rank whose iteration ends last (the one that sets the
  iteration time), canzona ÷ adamw;
- ``wire``: the DP collectives' own durations (every bucket's reduction and gather, start to
  end), canzona ÷ adamw: the cost of uneven rooted calls (busiest member: every piece but its
  own) against even reduce-scatter / all-gather, without overlap;
- ``exposed_sync``: canzona's exposed parameter sync ÷ its value without the overlap;
- ``iteration_vs_sync``: sync's iteration ÷ canzona's.

Prints the table and the points where canzona's communication exceeds 1.2× adamw's.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from bench_io import write_csv

from canzona.config import load_config
from canzona.errors import ConfigError
from canzona.overrides import refuse_renamed
from canzona.sim.simulate import RENAMED, project
from canzona.sweep.expand import expand_sweep

METHODS = ("canzona", "adamw", "sync")
LIMIT = 1.2  # issue 12: canzona's gradient reduction + parameter sync at most 1.2x adamw's


def _own_ms(row: dict, prefix: str) -> float:
    """Milliseconds of a rank's comm-stream events whose name starts with `prefix`."""
    return sum(e["dur_ms"] for e in row["events"] if e.get("lane") and e["name"].startswith(prefix))


def _exposed(row: dict) -> float:
    """Exposed gradient reduction + exposed parameter sync of a summary or a rank's row."""
    return row["grad_reduce_ms"] + row["param_sync_ms"]


def _exposed_transfer(summary: dict) -> float:
    """Exposed gradient reduction + exposed parameter sync less waits for peers (max over ranks)."""
    return summary["grad_reduce_ms"] + summary["param_sync_transfer_ms"]


def point(trials: dict[str, object], hardware: str) -> dict[str, float]:
    res = {m: project(cfg, hardware, events="auto") for m, cfg in trials.items()}
    c, a = res["canzona"], res["adamw"]
    crit = {m: max(r["steps"], key=lambda r: r["iteration_ms"]) for m, r in res.items()}
    ev = {m: next(row for row in r["steps"] if row["events"]) for m, r in res.items()}
    wire = {m: _own_ms(ev[m], "grad_reduce") + _own_ms(ev[m], "param_sync") for m in ("canzona", "adamw")}
    no_overlap = project(load_config(["dist.overlap_param_gather=false"], base=trials["canzona"].to_dict()), hardware,
                         events="none")
    out = {
        "canzona_comm_ms": _exposed(c),
        "adamw_comm_ms": _exposed(a),
        "comm_max": _exposed(c) / _exposed(a),
        "comm_transfer": _exposed_transfer(c) / _exposed_transfer(a),
        "comm_critical": _exposed(crit["canzona"]) / _exposed(crit["adamw"]),
        "wire": wire["canzona"] / wire["adamw"],
        "exposed_sync": c["param_sync_ms"] / no_overlap["param_sync_ms"] if no_overlap["param_sync_ms"] else 0.0,
        "canzona_step_ms": c["optimizer_step_ms"],
        "iteration_vs_sync": res["sync"]["iteration_ms"] / c["iteration_ms"] if "sync" in res else float("nan"),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hardware", nargs="?", default="hardware=h100", help="hardware=NAME|PATH (default h100)")
    ap.add_argument("--sweep-profile", default="paper_projection", choices=("paper_projection", "paper_authors"),
                    help="the qwen3_scaling sweep profile whose points are projected (default paper_projection)")
    ap.add_argument("--out", help="CSV path (default benchmarks/results/projection_bench[_authors].csv)")
    args = ap.parse_args(argv)
    suffix = "" if args.sweep_profile == "paper_projection" else "_authors"
    out = args.out or f"benchmarks/results/projection_bench{suffix}.csv"
    key, _, hardware = args.hardware.partition("=")
    try:
        refuse_renamed(RENAMED, [(key, hardware)])  # profile=: the simulator's old key
        if key != "hardware":
            raise ConfigError(f"expected hardware=NAME|PATH, got {args.hardware!r}")
        plan = expand_sweep(["sweep=qwen3_scaling", f"profile={args.sweep_profile}"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    points: dict[tuple[str, str], dict[str, object]] = defaultdict(dict)
    for t in plan.trials:
        if t.cfg.method.label in METHODS and t.cfg.optimizer.name in ("muon", "adamw"):
            points[(t.axes["size"], t.axes["layout"])][t.cfg.method.label] = t.cfg
    rows = []
    print(f"{'point':22s} {'comm max':>9s} {'transfer':>9s} {'critical':>9s} {'wire':>6s} {'exposed sync':>13s} {'iter vs sync':>13s}")
    for (size, layout), trials in points.items():
        try:
            r = {"size": size, "layout": layout, **point(trials, hardware)}
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        rows.append(r)
        print(f"{size + ' ' + layout:22s} {r['comm_max']:9.2f} {r['comm_transfer']:9.2f} {r['comm_critical']:9.2f} {r['wire']:6.3f} "
              f"{r['exposed_sync']:13.0%} {r['iteration_vs_sync']:13.2f}")
    def names(key: str) -> str:
        return ", ".join(f"{r['size']} {r['layout']}" for r in rows if r[key] > LIMIT) or "none"

    print(f"canzona comm > {LIMIT}x adamw on the critical rank: {names('comm_critical')}; max over ranks: "
          f"{names('comm_max')}; max over ranks without waits for peers: {names('comm_transfer')}")
    write_csv(rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
