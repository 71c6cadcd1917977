"""The accuracy goal a projection is held to against measured trials, and its verdict.

Per trial (the median of its runs), per method: the median |error| of the optimizer step and of
the iteration within ``GOAL["median_abs_error_pct"]`` and the worst within
``GOAL["worst_abs_error_pct"]`` (issue 28's goal for the README's first sweep). Shared by
`canzona.sim.validate` (one sweep) and `canzona.sim.across` (several).
"""

from __future__ import annotations

import statistics
from typing import Any

HEADLINE = ("optimizer_step_ms", "iteration_ms")
GOAL = {"median_abs_error_pct": 10.0, "worst_abs_error_pct": 25.0}  # per method, step and iteration, per trial


def error_stats(sub: list[dict[str, Any]], metrics: tuple[str, ...]) -> dict[str, Any]:
    """``trials`` and, per metric with an error figure, the median and worst |error| and the
    worst trial."""
    out: dict[str, Any] = {"trials": len(sub)}
    for m in metrics:
        errs = [(abs(r[f"{m}_error_pct"]), r) for r in sub if r.get(f"{m}_error_pct") is not None]
        if not errs:
            continue
        worst = max(errs, key=lambda e: e[0])
        out[f"{m}_median_abs_error_pct"] = statistics.median(e for e, _ in errs)
        out[f"{m}_worst_abs_error_pct"] = worst[0]
        out[f"{m}_worst_trial"] = worst[1]["trial"]
    return out


def meets_goal(by_method: list[dict[str, Any]], suffix: str = "") -> bool:
    """Whether every method's median and worst |error| of each `HEADLINE` metric (``suffix``:
    "" raw, "_sweep_speed" at the sweep's speed) are within `GOAL`."""
    return bool(by_method) and all(
        m.get(f"{h}{suffix}_median_abs_error_pct", 1e9) <= GOAL["median_abs_error_pct"]
        and m.get(f"{h}{suffix}_worst_abs_error_pct", 1e9) <= GOAL["worst_abs_error_pct"]
        for m in by_method for h in HEADLINE)
