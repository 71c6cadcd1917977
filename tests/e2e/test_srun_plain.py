"""A plain ``srun python -m canzona.run ...`` on the real Slurm controller (slurm/dev-cluster.sh),
with none of torch's launch variables exported: every rank finds its rank, world, local rank,
``MASTER_ADDR`` (the job's first node) and ``MASTER_PORT`` (from the job id) in Slurm's own
environment (`canzona.launch_env`).

Uses the session's ``slurm_cluster`` fixture (tests/e2e/conftest.py) (same skip rules).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_util import needs_slurm

REPO = Path(__file__).resolve().parents[2]
TORCH_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

pytestmark = [pytest.mark.slurm, pytest.mark.slow, needs_slurm]


def _srun(*cmd: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in TORCH_LAUNCH_VARS and not k.startswith("SLURM_JOB")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(["srun", "-p", "debug", "-N", "1", "-n", "2", "--cpus-per-task", "1", "-t", "5", *cmd],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_srun_tasks_derive_their_launch_env(slurm_cluster) -> None:
    probe = ("import json, os; from canzona.launch_env import launch_env; e = launch_env(); "
             "print(json.dumps({**e.__dict__, 'job': os.environ['SLURM_JOB_ID'], "
             "'nodes': os.environ['SLURM_JOB_NODELIST']}))")
    r = _srun(sys.executable, "-c", probe, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    got = sorted((json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")), key=lambda e: e["rank"])
    assert [e["rank"] for e in got] == [0, 1] and [e["local_rank"] for e in got] == [0, 1]
    for e in got:
        assert e["world"] == 2 and e["local_world"] == 2
        first = subprocess.run(["scontrol", "show", "hostnames", e["nodes"]], capture_output=True, text=True).stdout.split()[0]
        assert e["master_addr"] == first
        assert e["master_port"] == 20000 + int(e["job"]) % 20000


def test_plain_srun_runs_a_trial(slurm_cluster, tmp_path) -> None:
    r = _srun(sys.executable, "-m", "canzona.run", "model=qwen3-8b", "model.width_div=64", "model.num_layers=2",
              "parallel.dp=2", "train.steps=1", "train.warmup=0", "dist.timeout_s=60", f"out={tmp_path}",
              timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world"]["world_size"] == 2 and summary["matrix_owner_counts"] == {"min": 1, "max": 1}
