"""The records' one writer (`canzona.records.write_records`), their one reader of old key names
(`canzona.records.read_summary`) and trace.json's one builder (`canzona.trial.trace.chrome_trace`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from canzona.config import read_config
from canzona.records import (
    RECORD_FILES,
    STEPS_FILE,
    SUMMARY_FILE,
    TRACE_FILE,
    read_jsonl,
    read_summary,
    write_records,
)
from canzona.trial.trace import chrome_trace


def _row(rank: int, step: int, it: float, events: list[dict], measured: bool = True) -> dict:
    return {"step": step, "measured": measured, "rank": rank, "dp_rank": rank // 2, "tp_rank": rank % 2,
            "iteration_ms": it, "events": events}


def _ev(name: str, cat: str, start: float, dur: float) -> dict:
    return {"name": name, "cat": cat, "phase": "compute", "start_ms": start, "dur_ms": dur}


def test_write_records(tmp_path: Path) -> None:
    rows = [_row(0, 0, 1.0, [])]
    write_records(tmp_path / "a", {"method": "canzona"}, rows, {"ok": True}, trace={"traceEvents": []})
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text()) == {"method": "canzona"}
    assert read_jsonl(tmp_path / "a" / STEPS_FILE) == rows
    assert json.loads((tmp_path / "a" / SUMMARY_FILE).read_text()) == {"ok": True}
    assert (tmp_path / "a" / TRACE_FILE).is_file()
    write_records(tmp_path / "b", {}, rows, {})  # a projection: no trace
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["config.yaml", "steps.jsonl", "summary.json"]
    assert {p.name for p in (tmp_path / "a").iterdir()} <= set(RECORD_FILES)


def test_a_summary_written_before_the_rename_reads_under_the_new_names() -> None:
    hardware = {"name": "h100", "source": "spec-derived", "fingerprint": "abc"}
    old = {"projected": True, "iteration_ms": 3.0, "profile": hardware, "profile_inputs": {"rates": {}},
           "versions": {"simulator": "canzona.sim", "profile": "h100"},
           "config": {"canzona": {"cost_profile": "a100", "measured_profile": None, "alpha": 1.0}}}
    new = read_summary(old)
    assert new == {"projected": True, "iteration_ms": 3.0, "hardware": hardware, "hardware_inputs": {"rates": {}},
                   "versions": {"simulator": "canzona.sim", "hardware": "h100"}, "config": old["config"]}
    assert read_config(new["config"]) == {"planner": {"cost_hardware": "a100", "measured_table": None, "alpha": 1.0}}
    assert "profile" in old and "cost_profile" in old["config"]["canzona"]  # the record read is not changed
    assert read_summary(new) == new  # today's summaries read as they are
    measured = {"iteration_ms_median": 1.0, "versions": {"torch": "2.13"}}  # no hardware block at all
    assert read_summary(measured) == measured


def test_trace_nests_overlapping_events_and_aligns_steps() -> None:
    comm = [_ev("gather a", "comm", 1.0, 4.0), _ev("gather b", "comm", 2.0, 1.0)]  # overlapping
    rows = [_row(0, 0, 9.0, [_ev("x", "compute", 0.0, 9.0)], measured=False),  # warm-up: left out
            _row(0, 1, 10.0, [_ev("fwd", "model", 0.0, 3.0), *comm]), _row(1, 1, 8.0, []),
            _row(0, 2, 5.0, [_ev("fwd", "model", 0.0, 3.0)]), _row(1, 2, 6.0, [_ev("fwd", "model", 0.0, 3.0)])]
    doc = chrome_trace(rows, {"trial_id": "t"})
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert doc["otherData"] == {"trial_id": "t"} and "x" not in {e["name"] for e in spans}
    steps = {(e["pid"], e["name"]): e["ts"] for e in spans if e["cat"] == "step"}
    assert steps[(0, "step 2")] == steps[(1, "step 2")] == 10.0e3  # after step 1's slowest rank
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in spans:
        if e["cat"] != "step":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for s in by_thread.values():
        s.sort()
        assert all(a[1] <= b[0] for a, b in zip(s, s[1:]))
    comm_tids = {e["tid"] for e in spans if e["cat"] == "comm"}
    assert len(comm_tids) == 2
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {names[(0, t)] for t in comm_tids} == {"comm", "comm 2"}
    procs = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert procs == ["rank 0 (dp 0, tp 0)", "rank 1 (dp 0, tp 1)"]


def test_records_of_before_the_step_barrier_read_as_run_without_it() -> None:
    """A config recorded before ``dist.step_barrier`` existed (every key is recorded) ran its
    step without a barrier: read back, it says so, and a projection of it is made the same way."""
    from canzona.config import load_config

    now = load_config([]).to_dict()
    assert now["dist"]["step_barrier"] is True
    then = {**now, "dist": {k: v for k, v in now["dist"].items() if k != "step_barrier"}}
    assert read_config(then)["dist"]["step_barrier"] is False
    assert load_config(base=read_config(then)).dist.step_barrier is False
    assert read_config(now)["dist"]["step_barrier"] is True
