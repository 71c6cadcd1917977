"""The Chrome trace (Perfetto) of a trial's measured steps: one process per rank."""

from __future__ import annotations

from typing import Any


def chrome_trace(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A trace of the measured rows' ``events``: each rank's steps laid end to end (a step
    starts where the rank's previous measured step ended), times in microseconds."""
    events = []
    offset: dict[int, float] = {}
    for r in rows:
        if not r["measured"]:
            continue
        base = offset.get(r["rank"], 0.0)
        for e in r["events"]:
            events.append({"name": e["name"], "cat": e["cat"], "ph": "X", "pid": r["rank"], "tid": 0,
                           "ts": (base + e["start_ms"]) * 1e3, "dur": e["dur_ms"] * 1e3, "args": {"step": r["step"]}})
        offset[r["rank"]] = base + r["iteration_ms"]
    meta = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}} for rank in offset]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}
