"""The report on a real sweep's records: its numbers are the raw steps' numbers.

Takes the session's two-trial local sweep (canzona and sync, dp=2, through ``sweeps/run.py``:
`two_trial_sweep` in conftest.py, also checked by test_projection_e2e.py), then checks
that the sweep printed the report's path last, that ``trials.csv`` holds the medians computed
here straight from ``steps.jsonl`` (max over ranks per measured step), that ``speedups.csv``'s
canzona-vs-sync ratio is the ratio of those medians, that the HTML shows them, and that every
rank's recorded bytes per action equal its program's (``summary.json``'s ``program_check``).
Also that the sweep's progress without a terminal is one start line and one line per finished
run, and that after a resume (one run removed from a copy of its results, the command again on
the copy) the report says its runs come from two invocations.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from browser_util import CHROMIUM, IN_CI, need_chromium, open_report

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

def _median_of_max(steps: Path, key: str) -> float:
    per_step: dict[int, float] = {}
    for line in steps.read_text().splitlines():
        r = json.loads(line)
        if r["measured"]:
            per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r[key])
    return statistics.median(per_step.values())


def test_report_numbers_come_from_the_records(tmp_path: Path, two_trial_sweep) -> None:
    r = two_trial_sweep.proc
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    results = two_trial_sweep.results
    # progress without a terminal: the start line, exactly one line per finished run, the closing line
    progress = [line for line in r.stdout.splitlines() if line.startswith("[sweep] ")]
    assert progress[0].startswith("[sweep] 2 run(s) to run; none skipped"), r.stdout
    assert [line.split(" | ")[0] for line in progress[1:3]] == ["[sweep] 1/2 finished", "[sweep] 2/2 finished"], r.stdout
    assert len(progress) == 4 and progress[3].startswith("[sweep] ran 2 run(s) in ") and progress[3].endswith("; 0 failed"), r.stdout
    assert " | ETA " in progress[1] and progress[2].split(" | ")[-1].startswith("done "), r.stdout
    report = Path(r.stdout.strip().splitlines()[-1])
    assert report.name == "index.html" and report.exists()
    trials = pd.read_csv(report.parent / "trials.csv")
    medians = {}
    for _, row in trials.iterrows():
        steps = results / "two" / row["trial_id"] / "steps.jsonl"
        for key in ("iteration_ms", "optimizer_step_ms"):
            want = _median_of_max(steps, key)
            assert row[f"summary.{key}_median"] == pytest.approx(want, rel=1e-9)
            medians[(row["method"], key)] = want
    speedups = pd.read_csv(report.parent / "speedups.csv")
    opt = speedups[(speedups.baseline == "sync") & (speedups.metric == "optimizer_step_ms")].iloc[0]
    assert opt["value"] == pytest.approx(
        medians[("sync", "optimizer_step_ms")] / medians[("canzona", "optimizer_step_ms")], rel=1e-9
    )
    html = report.read_text()
    assert f"{medians[('canzona', 'optimizer_step_ms')]:.2f}" in html
    # every rank of every trial handed torch.distributed exactly the bytes its program lists
    for _, row in trials.iterrows():
        summary = json.loads((results / "two" / row["trial_id"] / "summary.json").read_text())
        check = summary["program_check"]
        assert check["ok"] and check["rows_checked"] > 0, check["mismatches"]
    # the per-rank timeline of the drawn step is that step: on every rank its events lie inside
    # the rank's recorded optimizer step, and the forward's gather waits and the bucket reductions
    # (before step_start, or in the next forward) are not among them
    from analysis.load import load_sweep
    from analysis.timeline import representative_step, step_events

    sweep = load_sweep(results / "two")
    for t in sweep.trials:
        step = representative_step(t)
        events, optimizer_only = step_events(t, step)
        assert optimizer_only and events
        rows = {s["rank"]: s for s in t.steps if s["step"] == step}
        for rank, s in rows.items():
            mine = [e for e in events if e["rank"] == rank]
            end = max(e["start_ms"] + e["dur_ms"] for e in mine)
            assert min(e["start_ms"] for e in mine) >= 0 and end <= s["optimizer_step_ms"] + 1e-6
            assert end >= 0.5 * s["optimizer_step_ms"], (t.trial_id, rank, end, s["optimizer_step_ms"])
            assert not {e.get("phase") for e in mine} & {"forward", "backward", "grad_reduce", "param_sync"}

    # the same report in headless Chromium at 1400 px: the provenance box holds the sweep's
    # manifest, the headline opens with a verdict, the Gantt is drawn, no table scrolls sideways
    if CHROMIUM is not None or IN_CI:
        need_chromium()
        info = open_report(report, tmp_path / "real.png")
        assert info["errors"] == [] and info["sweepConfig"], info
        assert any(v.startswith("canzona's optimizer step against sync") for v in info["verdicts"]), info["verdicts"]
        assert "fig-gantt" in {i["id"] for i in info["imgs"]}
        assert all(i["complete"] and i["w"] > 0 for i in info["imgs"]), info["imgs"]
        assert all(t["width"] <= t["box"] for t in info["tables"]), info["tables"]

    # resumed (on a copy of the results: the session's sweep stays as it is for the other tests):
    # one run removed, the same command again runs it alone; the report says that its runs come
    # from two invocations (each run's status.json records the invocation that ran it)
    assert "invocations of this sweep" not in html
    results = tmp_path / "results"
    shutil.copytree(two_trial_sweep.results, results)
    report = results / "two" / "report" / "index.html"
    victim = trials.iloc[0]["trial_id"]
    shutil.rmtree(results / "two" / victim)
    r = subprocess.run([*two_trial_sweep.command, f"results={results}"], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[sweep] 1 run(s) to run; 1 skipped (already recorded: resumed)" in r.stdout, r.stdout
    assert "runs from 2 invocations of this sweep (resumed)" in report.read_text()
    again = pd.read_csv(report.parent / "trials.csv").set_index("trial_id")
    assert again["invocation"].nunique() == 2 and again["invocation"].notna().all()
    manifest = json.loads((results / "two" / "sweep.json").read_text())
    statuses = {json.loads((results / "two" / t / "status.json").read_text())["invocation"]
                for t in trials["trial_id"]}
    assert len(manifest["invocations"]) == 2 and manifest["invocation"] == manifest["invocations"][-1]
    assert statuses == set(manifest["invocations"])
