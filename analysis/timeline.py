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
from canzona.records import TRACE_FILE, atomic_write_text
from canzona.trial.trace import chrome_trace, valid_event

ITERATION_SIDE = ("forward", "backward", "grad_reduce", "param_sync")


def _base(name: str) -> str:
    return str(name).replace("[", " ").split()[0] if str(name).strip() else ""


def is_optimizer_event(ev: dict[str, Any]) -> bool:
    """For records without a step window: not the iteration around the step."""
    kind = ev.get("phase") or _base(ev.get("name", ""))
    return ev.get("cat") != "model" and kind not in ITERATION_SIDE


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
               for ev in s.get("events") or [] if valid_event(ev)]
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


def write_trace(trial: TrialRecords, dest: Path) -> bool:
    """Copy the trial's own trace.json to `dest`, else build one from its events as the trial
    runner does (`canzona.trial.trace.chrome_trace`). False if there is nothing to trace."""
    own = trial.path / TRACE_FILE
    if own.is_file():
        atomic_write_text(dest, own.read_text())
        return True
    if not any(s.get("events") for s in trial.steps if s.get("measured")):
        return False
    doc = chrome_trace(trial.steps, {"trial_id": trial.trial_id, "method": trial.config.get("method"),
                                     "source": "steps.jsonl events (measured steps)"})
    atomic_write_text(dest, json.dumps(doc, separators=(",", ":")))
    return True
