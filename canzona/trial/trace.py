"""The Chrome trace (Perfetto) of a trial's measured steps, one process per rank: the one builder
of trace.json, which the trial runner writes and the report draws for records that have none
(`analysis.timeline.write_trace`: a projected trial, older records).

Per rank: a ``step`` thread with one span per measured step, a ``compute`` thread (the ``model``,
``compute`` and ``wait`` events) and ``comm`` threads. Perfetto needs the spans of one thread to
nest, and a rank's collectives overlap its compute and each other, so overlapping events of a
lane are dealt to extra threads of that lane (``comm 2``, ...). Steps are synchronous: a step
starts where the previous one ended on its slowest rank (the cumulative max-over-ranks
``iteration_ms`` of the preceding measured steps), unless its rows carry their own ``start_ms``.
Times in microseconds.
"""

from __future__ import annotations

import math
from typing import Any

# Event category -> the lane (thread family) it is drawn in.
LANES = {"model": "compute", "compute": "compute", "wait": "compute", "comm": "comm"}


def chrome_trace(rows: list[dict[str, Any]], other: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace of the measured rows (`canzona.records.STEP_FIELDS` and ``events``); ``other``:
    the document's ``otherData`` (what the trace is of), when given."""
    measured = [s for s in rows if s.get("measured")]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for s in measured:
        by_step.setdefault(s["step"], []).append(s)
    offsets: dict[int, float] = {}
    t = 0.0
    for step in sorted(by_step):
        own = [r.get("start_ms") for r in by_step[step] if isinstance(r.get("start_ms"), (int, float))]
        offsets[step] = float(min(own)) if own else t
        its = [r.get("iteration_ms") for r in by_step[step] if isinstance(r.get("iteration_ms"), (int, float))]
        t = offsets[step] + (max(its) if its else 0.0)
    trace: list[dict[str, Any]] = []
    ranks: dict[int, dict[str, Any]] = {}
    per_rank_lane: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for step in sorted(by_step):
        for r in by_step[step]:
            rank = int(r.get("rank", 0))
            ranks.setdefault(rank, r)
            if isinstance(r.get("iteration_ms"), (int, float)):
                trace.append({"name": f"step {step}", "cat": "step", "ph": "X", "pid": rank, "tid": 0,
                              "ts": offsets[step] * 1e3, "dur": float(r["iteration_ms"]) * 1e3,
                              "args": {k: r.get(k) for k in r if k.endswith("_ms") or k in ("step", "loss")}})
            for ev in r.get("events") or []:
                if not valid_event(ev):
                    continue
                lane = LANES.get(ev.get("cat"), "compute")
                per_rank_lane.setdefault((rank, lane), []).append(
                    {"name": str(ev.get("name")), "cat": str(ev.get("cat")), "step": step,
                     "start_ms": offsets[step] + float(ev["start_ms"]), "dur_ms": max(0.0, float(ev["dur_ms"]))})
    thread_names: dict[tuple[int, int], str] = {}
    for (rank, lane), evs in sorted(per_rank_lane.items()):
        base_tid = 1 if lane == "compute" else 100
        for ev, k in zip(evs, _tracks(evs)):
            tid = base_tid + k
            thread_names[(rank, tid)] = lane if k == 0 else f"{lane} {k + 1}"
            trace.append({"name": ev["name"], "cat": ev["cat"], "ph": "X", "pid": rank, "tid": tid,
                          "ts": ev["start_ms"] * 1e3, "dur": ev["dur_ms"] * 1e3, "args": {"step": ev["step"]}})
    meta: list[dict[str, Any]] = []
    for rank, r in sorted(ranks.items()):
        meta.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                     "args": {"name": f"rank {rank} (dp {r.get('dp_rank')}, tp {r.get('tp_rank')})"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "step"}})
    for (rank, tid), name in sorted(thread_names.items()):
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    doc: dict[str, Any] = {"traceEvents": meta + trace, "displayTimeUnit": "ms"}
    if other is not None:
        doc["otherData"] = other
    return doc


def valid_event(ev: Any) -> bool:
    """An event with a numeric start and duration (records may hold anything)."""
    return (isinstance(ev, dict) and isinstance(ev.get("start_ms"), (int, float))
            and isinstance(ev.get("dur_ms"), (int, float)) and not math.isnan(ev["start_ms"]))


def _tracks(events: list[dict[str, Any]]) -> list[int]:
    """Greedy interval partitioning: index of a sub-track per event so none overlap in a track."""
    order = sorted(range(len(events)), key=lambda i: (events[i]["start_ms"], -events[i]["dur_ms"]))
    ends: list[float] = []
    out = [0] * len(events)
    for i in order:
        s, e = events[i]["start_ms"], events[i]["start_ms"] + events[i]["dur_ms"]
        for k, end in enumerate(ends):
            if end <= s + 1e-9:
                ends[k] = e
                out[i] = k
                break
        else:
            ends.append(e)
            out[i] = len(ends) - 1
    return out
