"""End to end, through ``sweeps/run.py`` as a user runs it (slow):

- the whole ``paper_projection`` profile (Qwen3 0.6B-32B, up to 256 GPUs, 180 trials) projected with
  ``cluster=simulate``: every trial recorded as projected, the report path printed last, and
  the report's projected section with the paper's claims and the hardware's inputs;
- a real local sweep with a quick calibration of this machine passed as ``sim.hardware``: its
  report's predicted-vs-measured section shows the numbers of `compare_sweep`.
No timing is asserted.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.sim.claims import PAPER_CLAIMS
from canzona.sim.validate import compare_sweep

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
from test_projection import Page  # noqa: E402


def _sweep(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "sweeps" / "run.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.paper  # paper scale (180 projected trials, a few minutes on 2 cores): the CI step of its own
def test_paper_profile_projection_end_to_end(tmp_path: Path) -> None:
    r = _sweep("sweep=qwen3_scaling", "profile=paper_projection", f"results={tmp_path}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    index = Path(r.stdout.strip().splitlines()[-1])
    rd = tmp_path / "qwen3_scaling-paper_projection-sim-h100"
    assert index == rd / "report" / "index.html" and index.is_file()
    statuses = [json.loads(p.read_text()) for p in rd.glob("*/status.json")]
    assert len(statuses) == 180 and all(s["status"] == "done" and s["projected"] for s in statuses)
    worlds = {json.loads(p.read_text())["world"]["world_size"] for p in rd.glob("*/summary.json")}
    assert max(worlds) == 256
    page = Page(index.read_text())
    assert "Projected (not measured)" in page.ids["projected"]["text"] and "headline" not in page.ids
    claims = page.ids["projected-claims"]["text"]
    assert "qwen3-32b" in claims and "256 GPUs" in claims and PAPER_CLAIMS["setting"] in claims
    assert {float(c["data-paper"]) for c in page.having("data-paper")} == {
        PAPER_CLAIMS["iteration_speedup"], PAPER_CLAIMS["optimizer_step_speedup"]}
    assert page.having("data-field", **{"data-field": "hardware-source"})[0]["text"] == "spec-derived"
    assert "efficiency" in page.having("class", **{"class": "hardware-inputs"})[0]["text"]
    assert len(page.ids["projected-assumptions"]["text"].strip()) > 200
    assert len(page.having("data-proj", **{"data-baseline": "canzona", "data-metric": "iteration_ms"})) == 33
    # at 32B, DP 32 x TP 8, canzona's faster ranks wait in the forward for the gathers of peers still
    # in their step; the report keeps that wait apart from the parameter sync's communication
    big = [json.loads(p.read_text()) for p in rd.glob("*/summary.json")]
    big = [s for s in big if s["config"]["method"]["name"] == "canzona" and s["config"]["model"]["name"] == "qwen3-32b"
           and s["world"]["tp"] == 8 and s["config"]["optimizer"]["name"] == "muon"]
    assert len(big) == 1 and big[0]["param_sync_peer_ms_mean"] > 0
    assert big[0]["param_sync_transfer_ms"] < big[0]["param_sync_ms"]
    peers = page.having("class", **{"class": "peer-wait"})
    assert peers and all(float(e["text"].split()[-1]) > 0 for e in peers)
    # where canzona does not lead: every ratio below 1 of projected.csv (adamw's is an overhead), listed
    table = list(csv.DictReader((index.parent / "projected.csv").open()))
    below = sorted((r["id"], r["baseline"], r["metric"]) for r in table
                   if r["kind"] == "speedup" and float(r["value"]) < 1)
    listed = sorted((e["data-behind"], e["data-baseline"], e["data-metric"])
                    for e in page.having("data-behind") if e["data-behind"] != "none")
    assert listed == below


def test_local_sweep_report_predicts_with_a_quick_calibration(tmp_path: Path, two_trial_sweep) -> None:
    """The session's two-trial local sweep (conftest.py), run with the session's quick CPU
    calibration (tests/conftest.py) as ``sim.hardware``."""
    hw, r = two_trial_sweep.hardware, two_trial_sweep.proc
    assert hw.is_file()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    index = Path(r.stdout.strip().splitlines()[-1])
    page = Page(index.read_text())
    assert page.ids["predicted-hardware"]["data-hardware"] == "quick"
    want = compare_sweep(two_trial_sweep.dir, hw)
    sharing = want["hardware"].get("cpu_sharing")  # the quick calibration's contended and drift waits
    if sharing:
        note = page.ids["predicted-cpu-sharing"]
        assert int(note["data-peer-wait-points"]) == len(sharing["peer_wait_ms"])
        assert int(note["data-sched-wait-curve-points"]) == len(sharing.get("sched_wait_curve_ms", []))
        assert float(note["data-sched-wait-ms"]) == pytest.approx(sharing["sched_wait_ms"], rel=1e-6)
    else:
        assert "predicted-cpu-sharing" not in page.ids
    assert len(want["trials"]) == 2
    expected = {m["method"]: m for m in want["by_method"]} | {"all": want["overall"]}
    cells = page.having("data-pv-field")
    assert cells
    for cell in cells:
        v = expected[cell["data-pv-method"]].get(cell["data-pv-field"])
        if v is None:
            assert cell["data-value"] == ""
        else:
            assert float(cell["data-value"]) == pytest.approx(v, rel=1e-9)
    # rebuilt by hand with hardware=: the same section
    r = subprocess.run([sys.executable, "-m", "analysis.report", str(two_trial_sweep.dir),
                        f"out={tmp_path / 'again'}", f"hardware={hw}"], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    again = Page((tmp_path / "again" / "index.html").read_text())
    assert [(c["data-pv-method"], c["data-pv-field"], c["data-value"]) for c in again.having("data-pv-field")] == [
        (c["data-pv-method"], c["data-pv-field"], c["data-value"]) for c in cells]


def test_sigint_to_a_projecting_sweep_records_the_running_trials_interrupted(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) to ``sweeps/run.py cluster=simulate`` with two worker processes: exit 130,
    the trials in flight recorded failed ("interrupted"), none left running, and the same command
    resumes the rest."""
    import signal
    import time

    from test_trial_signals import interruptible

    args = ["sweep=qwen3_scaling", "profile=paper_projection", "size=0.6b", "sim.workers=2", f"results={tmp_path}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "sweeps" / "run.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 300
        while not any('"done"' in p.read_text() for p in tmp_path.rglob("status.json")):  # under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("[sweep] interrupted: stopped ") and last.endswith("rerun the same command to resume"), out
    stopped = int(last.split("stopped ")[1].split()[0])
    statuses = [json.loads(p.read_text()) for p in tmp_path.rglob("status.json")]
    assert "running" not in {st["status"] for st in statuses}
    failed = [st for st in statuses if st["status"] == "failed"]
    assert 1 <= stopped == len(failed) and {st["error"] for st in failed} == {"interrupted (sweep stopped by the user)"}
    done = sum(st["status"] == "done" for st in statuses)
    total = int(out.split(": ", 1)[1].split(" trials")[0])
    assert done + stopped < total  # interrupted before the end

    r = _sweep(*args)  # resume: only what is not done is projected
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{total} trials, {total - done} to project, {done} skipped" in r.stdout, r.stdout
