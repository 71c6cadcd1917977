"""End to end against a real slurmctld/slurmd (slurm/dev-cluster.sh): ``sweep=smoke
cluster=slurm`` submits 2 trials of 2 ranks each (gloo), as one job array, records them, and
leaves no job step or rank process behind; a peer, which starts its own ranks, runs as one task
(through submitit and by hand); then the cluster is torn down with no daemon left.

Uses the session's ``slurm_cluster`` fixture (tests/e2e/conftest.py) (same skip rules: skipped only when
``sinfo`` is missing and CI is not "true").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from slurm_util import IN_CI, dev_cluster, needs_slurm, pgrep, running_daemons

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "sweeps" / "run.py"

pytestmark = [pytest.mark.slurm, pytest.mark.slow, needs_slurm]


def test_slurm_sweep_two_trials_two_ranks(slurm_cluster, tmp_path):
    results = tmp_path / "results"
    r = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "sweep=smoke",
            "cluster=slurm",
            "slurm.partition=debug",
            "slurm.time=00:10:00",
            f"results={results}",
            "poll_s=0.5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    out = r.stdout + r.stderr
    root = results / "smoke"
    if r.returncode != 0:  # show the jobs' own logs before failing
        for p in sorted(root.glob("*/stderr.txt")):
            out += f"\n--- {p}\n{p.read_text()[-3000:]}"
    assert r.returncode == 0, out
    dirs = [p for p in root.iterdir() if (p / "status.json").exists()]
    assert len(dirs) == 2, out
    job_ids = set()
    for d in dirs:
        st = json.loads((d / "status.json").read_text())
        assert st["status"] == "done" and st["cluster"] == "slurm" and st["error"] is None, st
        job_ids.add(st["job_id"])
        summary = json.loads((d / "summary.json").read_text())
        assert summary["world"]["world_size"] == 2 and summary["world"]["backend"] == "gloo"
        assert (d / "steps.jsonl").is_file() and (d / "config.yaml").is_file()
        assert (d / "stdout.txt").is_file() and (d / "stderr.txt").is_file()
    # one job array of two tasks: ids <array>_0 and <array>_1
    assert len(job_ids) == 2 and len({j.split("_")[0] for j in job_ids}) == 1, job_ids

    # nothing left: none of our jobs queued, no step daemon, no process running from our folders
    # (the sweep itself waits for squeue to drop its jobs before it exits)
    array = next(iter(job_ids)).split("_")[0]

    def ours_queued() -> list[str]:
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
        return [j for j in queue if j.split("_")[0] == array]

    assert ours_queued() == []
    deadline = time.monotonic() + 30
    while (pgrep(str(results)) or pgrep("slurmstepd")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pgrep(str(results)) == []
    assert pgrep("slurmstepd") == []

    # rerun: both recorded, nothing submitted
    r = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "sweep=smoke",
            "cluster=slurm",
            "slurm.partition=debug",
            f"results={results}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "2 trials, 0 to run, 2 skipped" in r.stdout, r.stdout + r.stderr


def test_slurm_list_scripts_accepted_by_sbatch(slurm_cluster, tmp_path):
    results = tmp_path / "results"
    r = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "sweep=smoke",
            "cluster=slurm",
            "list=true",
            "slurm.partition=debug",
            f"results={results}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    scripts = sorted((results / "smoke" / "sbatch").glob("*-*.sh"))
    assert len(scripts) == 2
    for s in scripts:
        t = subprocess.run(["sbatch", "--test-only", str(s)], capture_output=True, text=True, timeout=60)
        assert t.returncode == 0 and "to start at" in t.stdout + t.stderr, t.stdout + t.stderr


LONG = """
    description: one 2-rank trial that runs for minutes unless cancelled
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 16
      model.num_layers: 1
      dist.device: cpu
      dist.threads_per_rank: 1
      dist.timeout_s: 120
      train.steps: 100000
      train.warmup: 0
      train.micro_batch: 1
      train.seq_len: 16
      parallel.dp: 2
      method: canzona
"""


def _job_state(job_id: str) -> str:
    r = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return r.stdout.strip()


def test_scancelled_trial_is_recorded_as_cancelled(slurm_cluster, tmp_path):
    """scancel a running trial's job: the sweep notices although the dev cluster has no
    accounting (submitit alone would wait forever for the result), records Slurm's state as
    the trial's error, goes on to its summary and report, and leaves nothing running."""
    (tmp_path / "long.yaml").write_text(textwrap.dedent(LONG))
    results = tmp_path / "results"
    sweep = subprocess.Popen(
        [sys.executable, str(RUN), f"sweep={tmp_path / 'long.yaml'}", "cluster=slurm", "slurm.partition=debug",
         "slurm.time=00:10:00", f"results={results}", "poll_s=0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        root = results / "long"
        deadline = time.monotonic() + 300
        job_id = None
        while job_id is None or _job_state(job_id) != "RUNNING":  # cancel it mid-trial
            assert sweep.poll() is None and time.monotonic() < deadline, "the trial never started running"
            st = [json.loads(p.read_text()) for p in root.glob("*/status.json")]
            job_id = st[0].get("job_id") if st else None
            time.sleep(0.5)
        subprocess.run(["scancel", job_id], check=True, timeout=60)
        out, _ = sweep.communicate(timeout=300)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    assert sweep.returncode == 1, out
    (st_path,) = root.glob("*/status.json")
    st = json.loads(st_path.read_text())
    assert st["status"] == "failed" and st["job_id"] == job_id, st
    assert st["error"] == f"Slurm ended job {job_id}: CANCELLED", st
    assert f"Slurm ended job {job_id}: CANCELLED" in out and "(0 done, 1 failed, 0 other)" in out
    assert _job_state(job_id) == "CANCELLED"
    deadline = time.monotonic() + 30
    while (pgrep(str(results)) or pgrep("slurmstepd")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pgrep(str(results)) == [] and pgrep("slurmstepd") == []


PEER = """
    description: one peer trial (torchtitan's DistMuon on FSDP2), which starts its own 2 ranks
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 16
      model.num_layers: 1
      dist.device: cpu
      dist.threads_per_rank: 1
      dist.timeout_s: 120
      train.steps: 2
      train.warmup: 1
      train.micro_batch: 1
      train.seq_len: 16
      parallel.dp: 2
      method: torchtitan_distmuon
      optimizer.ns_dtype: bfloat16  # DistMuon orthogonalises in bf16 only
"""


def test_a_peer_runs_on_slurm_through_submitit_and_by_hand(slurm_cluster, tmp_path):
    """A peer starts its own ranks, so its Slurm job is one task on one node (not one task per
    rank): through the sweep (submitit) and through the ``list=true`` script submitted by hand
    (``sbatch --wait``), both record the trial done with its two ranks."""
    (tmp_path / "peer.yaml").write_text(textwrap.dedent(PEER))
    args = [sys.executable, str(RUN), f"sweep={tmp_path / 'peer.yaml'}", "cluster=slurm", "slurm.partition=debug",
            "slurm.time=00:10:00", "poll_s=0.5"]
    r = subprocess.run([*args, f"results={tmp_path / 'submitit'}"], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (st_path,) = (tmp_path / "submitit" / "peer").glob("*/status.json")
    st = json.loads(st_path.read_text())
    assert st["status"] == "done" and st["cluster"] == "slurm", st
    summary = json.loads((st_path.parent / "summary.json").read_text())
    assert summary["world"]["world_size"] == 2 and summary["peer"]["name"] == "torchtitan_distmuon"

    r = subprocess.run([*args, "list=true", f"results={tmp_path / 'by_hand'}"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (script,) = (tmp_path / "by_hand" / "peer" / "sbatch").glob("*-*.sh")
    assert "--ntasks-per-node=1" in script.read_text()
    job = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text()[-3000:] for p in script.parent.glob("*.err"))
    assert job.returncode == 0, job.stdout + job.stderr + logs
    rows = (tmp_path / "by_hand" / "peer" / script.stem / "steps.jsonl").read_text().splitlines()
    assert {json.loads(row)["rank"] for row in rows} == {0, 1}


# Marked slurm_down: tests/e2e/conftest.py runs it after every other test of the session.
@pytest.mark.slurm_down
def test_dev_cluster_down_leaves_no_processes(slurm_cluster):
    """`dev-cluster.sh down` stops every daemon and step, fast, and `status` says so. Where the
    cluster was up before the session (someone else's), it is left alone: there is nothing of
    ours to check, and CI always starts its own."""
    if not slurm_cluster.started_here:
        assert not IN_CI, "in CI the session must start its own Slurm cluster"
        pytest.skip("Slurm was already up before the tests; not stopping someone else's cluster")
    t0 = time.monotonic()
    r = dev_cluster("down", timeout=300)
    slurm_cluster.running = False
    assert r.returncode == 0, f"dev-cluster.sh down failed:\n{r.stdout}\n{r.stderr}"
    assert running_daemons() == []
    assert pgrep("slurmstepd") == []
    assert time.monotonic() - t0 < 120
    s = dev_cluster("status", timeout=60)
    assert s.returncode == 0 and s.stdout.strip() == "down", s.stdout + s.stderr
