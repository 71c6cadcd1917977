"""Per-rank timelines from steps.jsonl ``events``: the Gantt data of one step and Chrome traces.

Events are ``{"name", "cat", "phase", "start_ms", "dur_ms"}`` relative to the iteration's start
(records.py), ``cat`` one of compute, comm, wait, model. The optimizer step of a rank is the
window its own timers recorded, ``[step_start_ms, step_start_ms + optimizer_step_ms]``: the
events inside it (clipped to it) are the step, whatever they are named, and each rank's window
starts at 0, so a rank's lane spans exactly its recorded step. Records written before the
window was recorded fall back to telling the iteration's events by their phase (or, older
still, the first word of their name).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from analysis.load import TrialRecords
from canzona.records import atomic_write_text

ITERATION_SIDE = ("forward", "backward", "grad_reduce", "param_sync")
LANES = {"model": "compute", "compute": "compute", "wait": "compute", "comm": "comm"}


def _base(name: str) -> str:
    return str(name).replace("[", " ").split()[0] if str(name).strip() else ""


def is_optimizer_event(ev: dict[str, Any]) -> bool:
    """For records without a step window: not the iteration around the step."""
    kind = ev.get("phase") or _base(ev.get("name", ""))
    return ev.get("cat") != "model" and kind not in ITERATION_SIDE


def _valid(ev: Any) -> bool:
    return (isinstance(ev, dict) and isinstance(ev.get("start_ms"), (int, float))
            and isinstance(ev.get("dur_ms"), (int, float)) and not math.isnan(ev["start_ms"]))


def representative_step(trial: TrialRecords) -> int | None:
    """The measured step (with events) whose max-over-ranks optimizer_step_ms is closest to
    the median of those values (ties: the earliest)."""
    per: dict[int, float] = {}
    for s in trial.steps:
        if s.get("measured") and s.get("events") and isinstance(s.get("optimizer_step_ms"), (int, float)):
            per[s["step"]] = max(per.get(s["step"], -math.inf), float(s["optimizer_step_ms"]))
    if not per:
        return None
    vals = sorted(per.values())
    n = len(vals)
    med = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
    return min(per, key=lambda k: (abs(per[k] - med), k))


def step_events(trial: TrialRecords, step: int, optimizer_only: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """Events of one step, one dict per event with ``rank`` added and ``start_ms`` shifted so
    the optimizer step starts at 0 (the earliest optimizer event over ranks). Returns
    (events, optimizer_only) -- the flag is False when the step had no optimizer events and the
    whole iteration is returned instead."""
    rows, windowed = [], []
    for s in trial.steps:
        if s.get("step") != step:
            continue
        evs = [{**ev, "rank": s.get("rank"), "dp_rank": s.get("dp_rank"), "tp_rank": s.get("tp_rank")}
               for ev in s.get("events") or [] if _valid(ev)]
        rows.extend(evs)
        start, length = s.get("step_start_ms"), s.get("optimizer_step_ms")
        if optimizer_only and isinstance(start, (int, float)) and isinstance(length, (int, float)):
            windowed.extend(_in_window(evs, float(start), float(length)))
    if windowed:
        return windowed, True
    opt = [e for e in rows if is_optimizer_event(e)] if optimizer_only else []
    chosen, flag = (opt, True) if opt else (rows, False)
    if not chosen:
        return [], flag
    t0 = min(e["start_ms"] for e in chosen)
    return [{**e, "start_ms": e["start_ms"] - t0} for e in chosen], flag


def _in_window(events: list[dict[str, Any]], start: float, length: float) -> list[dict[str, Any]]:
    """The events overlapping [start, start + length], clipped to it and shifted to start at 0."""
    end = start + length
    out = []
    for e in events:
        a, b = max(e["start_ms"], start), min(e["start_ms"] + e["dur_ms"], end)
        if b > a or (e["dur_ms"] == 0 and start <= e["start_ms"] <= end):
            out.append({**e, "start_ms": a - start, "dur_ms": max(0.0, b - a)})
    return out


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


def chrome_trace(trial: TrialRecords) -> dict[str, Any] | None:
    """A Chrome-trace (Perfetto) document of the trial's measured steps: one process per rank,
    a ``step`` thread with one span per step, a ``compute`` thread (model/compute/wait) and
    ``comm`` threads (overlapping collectives get extra threads). Step starts are the
    cumulative max-over-ranks iteration_ms of the preceding measured steps (steps are
    synchronous), unless a step record carries its own ``start_ms``."""
    measured = [s for s in trial.steps if s.get("measured")]
    if not any(s.get("events") for s in measured):
        return None
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
                if not _valid(ev):
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
    return {"traceEvents": meta + trace, "displayTimeUnit": "ms",
            "otherData": {"trial_id": trial.trial_id, "method": trial.config.get("method"),
                          "source": "steps.jsonl events (measured steps)"}}


def write_trace(trial: TrialRecords, dest: Path) -> bool:
    """Copy the trial's own trace.json to `dest`, else build one from its events. False if
    there is nothing to trace."""
    own = trial.path / "trace.json"
    if own.is_file():
        atomic_write_text(dest, own.read_text())
        return True
    doc = chrome_trace(trial)
    if doc is None:
        return False
    atomic_write_text(dest, json.dumps(doc, separators=(",", ":")))
    return True
