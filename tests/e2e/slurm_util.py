"""Helpers shared by the Slurm end-to-end modules: the local dev cluster script
(slurm/dev-cluster.sh) and the skip rule.

Cluster tests skip only when `sinfo` is missing and CI is not "true"; in CI they bring the
cluster up themselves (installing Slurm if needed) and fail rather than skip. The one
``slurm_cluster`` fixture lives in this folder's conftest.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "dev-cluster.sh"
STATE_DIR = Path(os.environ.get("CANZONA_SLURM_DIR", "/tmp/canzona-slurm"))
DAEMONS = ("slurmctld", "slurmd", "munged")

IN_CI = os.environ.get("CI") == "true"
needs_slurm = pytest.mark.skipif(
    shutil.which("sinfo") is None and not IN_CI,
    reason="sinfo not on PATH (run `bash slurm/dev-cluster.sh up`, or set CI=true to install it)",
)


def sinfo_ok() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        r = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def dev_cluster(cmd: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), cmd], capture_output=True, text=True, timeout=timeout)


def running_daemons() -> list[str]:
    left = []
    for name in DAEMONS:
        r = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True)
        if r.returncode == 0:
            left.append(f"{name}({' '.join(r.stdout.split())})")
    return left


def pgrep(pattern: str) -> list[str]:
    r = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [ln for ln in r.stdout.splitlines() if "pgrep" not in ln]


class Cluster:
    """What the session fixture knows: whether it started the cluster, whether it is still up."""

    def __init__(self) -> None:
        self.started_here = False
        self.running = False
        self.up_seconds: float | None = None
