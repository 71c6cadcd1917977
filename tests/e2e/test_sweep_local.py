"""End to end: a local sweep of tiny real trials through ``python sweeps/run.py``.

Three trials (two succeed, one fails on rank 1 through ``train.fail_on_rank``): every trial is
recorded, the failure with its error while the others complete; a rerun skips the completed
trials and reruns only the failed one; ``rerun=none`` runs nothing. Plus one trial in
``cluster=debug`` (in-process).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "sweeps" / "run.py"

SWEEP = """
    description: e2e sweep of tiny trials
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 16
      model.num_layers: 1
      dist.device: cpu
      dist.threads_per_rank: 1
      dist.timeout_s: 60
      train.steps: 2
      train.warmup: 0
      train.micro_batch: 1
      train.seq_len: 16
    grid:
      trial:
        canzona-dp2: {method: canzona, parallel.dp: 2, parallel.tp: 1}
        sync-tp2: {method: sync, parallel.dp: 1, parallel.tp: 2}
        broken-dp2: {method: layerwise, parallel.dp: 2, parallel.tp: 1, train.fail_on_rank: 1, train.fail_at_step: 0}
    sweep:
      cluster: local
      local: {timeout_min: 5}
      sim: {calibrate: false}   # records and resumes are checked here, not the predictions
"""


def sweep(tmp_path: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [
            sys.executable,
            str(RUN),
            f"sweep={tmp_path / 'tiny.yaml'}",
            f"results={tmp_path / 'results'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=env,
    )


def trial_dirs(root: Path) -> dict[str, Path]:
    return {p.name: p for p in root.iterdir() if (p / "status.json").exists()}


def status(d: Path) -> dict:
    return json.loads((d / "status.json").read_text())


def check_report_line(stdout: str) -> None:
    last = stdout.rstrip().splitlines()[-1]
    try:
        import analysis.report as report

        has_report = callable(getattr(report, "build_report", None))
    except ImportError:
        has_report = False
    if has_report:
        assert Path(last).exists(), f"last line should be the report path, got {last!r}"
    else:
        assert "no report" in last


@pytest.mark.slow
def test_local_sweep_records_resumes_and_survives_a_failing_trial(tmp_path):
    (tmp_path / "tiny.yaml").write_text(textwrap.dedent(SWEEP))
    t0 = time.monotonic()
    r = sweep(tmp_path)
    first_run_s = time.monotonic() - t0
    out = r.stdout
    assert r.returncode == 1, f"one trial fails, so exit 1\n{out}\n{r.stderr}"
    root = tmp_path / "results" / "tiny"
    dirs = trial_dirs(root)
    assert len(dirs) == 3, out
    done = {k: d for k, d in dirs.items() if "layerwise" not in k}
    ((failed_id, failed),) = ((k, d) for k, d in dirs.items() if "layerwise" in k)

    for tid, d in done.items():
        st = status(d)
        assert st["status"] == "done" and st["error"] is None, st
        assert st["job_id"] and st["cluster"] == "local" and st["started"] and st["ended"]
        for name in ("config.yaml", "steps.jsonl", "summary.json", "stdout.txt", "stderr.txt"):
            assert (d / name).is_file(), (tid, name)
        summary = json.loads((d / "summary.json").read_text())
        assert summary["world"]["world_size"] == 2
        rows = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines()]
        assert len(rows) == 2 * 2  # 2 steps x 2 ranks
        assert not list(d.glob(".*.tmp"))

    st = status(failed)
    assert st["status"] == "failed"
    assert "injected failure on rank 1" in st["error"], st
    assert "injected failure" in (failed / "stderr.txt").read_text()
    assert not (failed / "summary.json").exists()

    # progress (non-TTY: plain lines), the summary table, then the report path (or a note)
    assert "[sweep] 3 run(s) to run" in out and " | ETA " in out
    assert len(re.findall(r"^\[sweep\] \d/3 finished \| ", out, re.M)) == 3, out  # one line per finished run
    assert f"FAILED {failed_id}" in out and "(2 done, 1 failed, 0 other)" in out
    check_report_line(out)
    manifest = json.loads((root / "sweep.json").read_text())
    assert sorted(t["id"] for t in manifest["trials"]) == sorted(dirs)

    # rerun: completed trials skipped, the failed one rerun -- here as one submitit task per rank
    before = {k: status(d)["started"] for k, d in done.items()}
    r = sweep(tmp_path, "local.mode=tasks")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "3 trials, 1 to run, 2 skipped" in r.stdout
    assert {k: status(d)["started"] for k, d in done.items()} == before
    st = status(failed)
    assert st["status"] == "failed" and st["error"].startswith("rank 1: RuntimeError: injected failure"), st
    assert "==> rank 1" in (failed / "stderr.txt").read_text()

    # rerun=none: nothing runs, in seconds
    t0 = time.monotonic()
    r = sweep(tmp_path, "rerun=none")
    assert "3 trials, 0 to run, 3 skipped" in r.stdout and "nothing to run" in r.stdout, r.stdout
    assert time.monotonic() - t0 < max(30.0, first_run_s / 2)
    assert r.returncode == 1  # the failed trial is still failed

    # overriding a key that the trial's axis value sets is refused (the trial would be named for
    # one config and run another), naming both, and nothing runs
    r = sweep(tmp_path, "trial=broken-dp2", "train.fail_on_rank=null", "cluster=debug")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert "train.fail_on_rank=null contradicts axis trial=broken-dp2, which sets train.fail_on_rank=1" in r.stderr
    assert set(trial_dirs(root)) == set(dirs)
    # a trial fixed in the sweep file is picked up (different config, new id)
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(sweep_file.read_text().replace("train.fail_on_rank: 1", "train.fail_on_rank: null"))
    r = sweep(tmp_path, "trial=broken-dp2", "cluster=debug")
    assert r.returncode == 0, r.stdout + r.stderr
    new = set(trial_dirs(root)) - set(dirs)
    assert len(new) == 1
    d = root / new.pop()
    assert (
        status(d)["status"] == "done" and status(d)["cluster"] == "debug" and (d / "summary.json").is_file()
    )


PAIR = """
    description: two methods at one point
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 16
      model.num_layers: 1
      dist.device: cpu
      dist.threads_per_rank: 1
      dist.timeout_s: 60
      train.steps: 2
      train.warmup: 0
      train.micro_batch: 1
      train.seq_len: 16
      parallel.dp: 2
    grid:
      method: [canzona, sync]
    sweep:
      cluster: local
      local: {timeout_min: 5}
"""


def pair_sweep(tmp_path: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN), f"sweep={tmp_path / 'pair.yaml'}", f"results={tmp_path / 'results'}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


@pytest.mark.slow
def test_repeats_run_interleaved_and_resume_per_repetition(tmp_path):
    (tmp_path / "pair.yaml").write_text(textwrap.dedent(PAIR))
    r = pair_sweep(tmp_path, "repeats=2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 trials x 2 repeats = 4 runs, 4 to run" in r.stdout
    root = tmp_path / "results" / "pair"
    dirs = trial_dirs(root)
    assert len(dirs) == 4
    by_trial: dict[str, list[int]] = {}
    for name, d in dirs.items():
        st = status(d)
        assert st["status"] == "done" and st["repeats"] == 2, st
        assert name == (st["trial_id"] if st["repeat"] == 1 else f"{st['trial_id']}-r{st['repeat']}")
        by_trial.setdefault(st["trial_id"], []).append(st["repeat"])
    assert sorted(map(sorted, by_trial.values())) == [[1, 2], [1, 2]]
    # launched in the manifest's order: both methods once, then both again, the other one first
    order = json.loads((root / "sweep.json").read_text())["order"]
    assert sorted(order, key=lambda n: status(dirs[n])["started"]) == order
    first = [status(dirs[n])["trial_id"] for n in order]
    assert first[0] != first[2] and set(first[:2]) == set(first[2:]) and len(set(first[:2])) == 2
    # the report pools the two repetitions of each method and pairs them
    speedups = (root / "report" / "speedups.csv").read_text().splitlines()
    header = speedups[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in speedups[1:]]
    vs_sync = [x for x in rows if x["baseline"] == "sync"]
    assert vs_sync and all(x["paired"] == "True" and x["n_trials_canzona"] == "2" for x in vs_sync)
    html = (root / "report" / "index.html").read_text()
    assert html.count("] paired") >= len(vs_sync)  # the report says which intervals are paired
    # the provenance box shows what the sweep wrote of itself (sweep.json), not a file it never writes
    box = html[html.index('id="sweep-config"'):]
    assert "cluster: local" in box[:box.index("</pre>")] and "runs: 4" in box[:box.index("</pre>")]
    # no hardware given: the report predicts the measured trials with this machine's calibration
    # (the session's, placed where canzona.calibrate.machine keeps it), reused, not taken anew
    from canzona.calibrate.machine import machine_hardware_path

    assert "[calibrate] reused this machine's calibration" in r.stdout
    assert 'id="predicted-errors"' in html and str(machine_hardware_path(1)) in html

    # resumed with repeats raised (one invocation, to start one worker): of the recorded runs only
    # the failed repetition runs again, the others are skipped; the new repetitions run once each
    victim = order[1]
    bk_status = status(dirs[victim])
    (dirs[victim] / "status.json").write_text(json.dumps({**bk_status, "status": "failed", "error": "x"}))
    before = {n: status(d)["started"] for n, d in dirs.items() if n != victim}
    r = pair_sweep(tmp_path, "repeats=3")
    assert r.returncode == 0 and "2 trials x 3 repeats = 6 runs, 3 to run, 3 skipped" in r.stdout, r.stdout + r.stderr
    assert {n: status(d)["started"] for n, d in dirs.items() if n != victim} == before
    assert status(dirs[victim])["status"] == "done" and status(dirs[victim])["started"] != bk_status["started"]
    now = trial_dirs(root)
    assert sorted(n for n in now if n not in dirs) == sorted(f"{t}-r3" for t in by_trial)
    assert all(status(now[n])["status"] == "done" and status(now[n])["repeat"] == 3 for n in now if n not in dirs)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_sweep_calibrates_in_slices_between_its_runs(tmp_path):
    """With no calibration of this machine (a cache folder of its own), the sweep takes it in
    slices while no run is in flight -- one before the first run, one after the last (two quick
    slices here) -- and its report predicts the trials with their median."""
    from canzona.calibrate.cache import ENV

    (tmp_path / "pair.yaml").write_text(textwrap.dedent(PAIR))
    cache = tmp_path / "cache"
    r = subprocess.run(
        [sys.executable, str(RUN), f"sweep={tmp_path / 'pair.yaml'}", f"results={tmp_path / 'results'}",
         "sim.calibrate_slices=2", "sim.calibrate_quick=true"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **{ENV: str(cache)}),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    first = next(i for i, x in enumerate(lines) if "slice 1 of 2 (before run 1 of 2" in x)
    last = next(i for i, x in enumerate(lines) if "slice 2 of 2 (after the runs" in x)
    finished = [i for i, x in enumerate(lines) if re.search(r"\[sweep\] \d/2 finished", x)]
    assert len(finished) == 2 and first < finished[0] and finished[-1] < last, r.stdout
    # the ETA after the first run counts the slice still to come, at the first one's duration
    took = int(re.search(r"\[calibrate\] slice 1 of 2 took (\d+) s", r.stdout).group(1))
    eta = re.search(r"ETA (?:(\d+)m)?(\d+)s", lines[finished[0]])
    assert eta is not None and 60 * int(eta.group(1) or 0) + int(eta.group(2)) >= took, (took, lines[finished[0]])
    hardware = next(cache.glob("hardware/*.yaml"))
    calibration = yaml.safe_load(hardware.read_text())["calibration"]
    assert calibration["repeats"] == 2 and calibration["slices"] == {"before_run": [0, 2], "of_runs": 2}
    assert calibration["quick"] is True and "spread" in calibration
    html = (tmp_path / "results" / "pair" / "report" / "index.html").read_text()
    assert 'id="predicted-errors"' in html and str(hardware) in html
    assert "the median of 2 calibrations taken in slices between the sweep's runs" in html
    # the report keeps the calibration it predicted with: the cache's is replaced by the next one
    assert (tmp_path / "results" / "pair" / "report" / "hardware.yaml").read_text() == hardware.read_text()


@pytest.mark.slow
def test_a_second_sweep_on_the_same_results_exits_2_naming_the_first(tmp_path):
    (tmp_path / "pair.yaml").write_text(textwrap.dedent(PAIR))
    root = tmp_path / "results" / "pair"
    cmd = [sys.executable, str(RUN), f"sweep={tmp_path / 'pair.yaml'}", f"results={tmp_path / 'results'}"]
    # its own process group, so that the test can freeze the first sweep with its jobs and ranks
    first = subprocess.Popen(
        [*cmd, "method=canzona"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=tmp_path, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (root / ".sweep.holder.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first sweep never took the lock"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGSTOP)  # holds the lock while the second one tries
        try:
            before = _snapshot(root)
            second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
            after = _snapshot(root)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stdout == "" and second.stderr.count("\n") == 1 and second.stderr.startswith("error: ")
        assert f"pid {first.pid} on " in second.stderr and "method=canzona" in second.stderr
        assert after == before  # nothing written, nothing run
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, out
    assert "1 trials, 1 to run" in out and not (root / ".sweep.holder.json").exists()
    (d,) = trial_dirs(root).values()
    assert status(d)["status"] == "done" and (d / "summary.json").is_file()


@pytest.mark.slow
def test_a_run_past_its_timeout_is_killed_with_its_ranks(tmp_path):
    """local.mode=worker: a run over local.timeout_min is recorded as timed out, its worker,
    forkserver and ranks are killed, and the next run gets a fresh worker and succeeds."""
    (tmp_path / "pair.yaml").write_text(textwrap.dedent(PAIR))
    long = textwrap.dedent(PAIR).replace("train.steps: 2", "train.steps: 100000") + "include:\n  - {method: sync, train.steps: 2}\n"
    (tmp_path / "pair.yaml").write_text(long.replace("method: [canzona, sync]", "method: [canzona]"))
    # 30 s: the short run's fresh worker imports torch and megatron-core and starts a forkserver
    # first (15 s was not enough on a loaded 2-core machine); the long one never ends in time
    r = pair_sweep(tmp_path, "local.timeout_min=0.5", "sim.calibrate=false")
    assert r.returncode == 1, r.stdout + r.stderr
    root = tmp_path / "results" / "pair"
    runs = {status(d)["trial_id"].split("-")[1]: status(d) for d in trial_dirs(root).values()}
    assert runs["canzona"]["status"] == "failed", runs
    assert runs["canzona"]["error"].startswith("TimeoutError: the run took more than local.timeout_min=0.5"), runs
    assert runs["sync"]["status"] == "done", runs
    assert runs["canzona"]["job_id"].split(".")[0] != runs["sync"]["job_id"].split(".")[0]  # a new worker
    for job in (runs["canzona"]["job_id"], runs["sync"]["job_id"]):  # both workers gone, and all below them
        assert not Path(f"/proc/{job.split('.')[0]}").exists()
    assert _running_in(tmp_path) == []  # the sweep ran there: its workers, forkservers and ranks too


def _running_in(folder: Path) -> list[str]:
    """Processes whose working directory is ``folder``."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == folder:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                out.append(f"{proc.name}: {cmd[:200]}")
        except OSError:
            pass
    return out
