"""The one Slurm cluster of a test session, shared by every module that needs it; and the one
two-trial local sweep that the report and projection tests check.

A single session-scoped fixture (defining it in each module would start a cluster per module,
and a module finding another's cluster up would skip its teardown test). Tests marked
``slurm_down`` stop the cluster, so they are moved after every other test.

`two_trial_sweep`: canzona and sync at dp=2 through ``sweeps/run.py`` with the session's quick
calibration as ``sim.hardware``, run once; `test_report_real_sweep.py` checks its records and
report, `test_projection_e2e.py` its predicted-vs-measured section. Neither writes into it: a
test that resumes it does so on a copy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from slurm_util import STATE_DIR, Cluster, dev_cluster, sinfo_ok


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    last = [it for it in items if it.get_closest_marker("slurm_down")]
    if last:
        items[:] = [it for it in items if not it.get_closest_marker("slurm_down")] + last
    # Under pytest-xdist (scripts/test.sh: --dist loadgroup) each worker is a session of its own:
    # the Slurm tests go to one worker, so that one session brings the cluster up, uses it and
    # stops it (``slurm_down``) with no other worker's test on it (tests/conftest.py groups the
    # tests that share a fixture).
    for it in items:
        if it.get_closest_marker("slurm") or it.get_closest_marker("slurm_down"):
            it.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session", autouse=True)
def _machine_calibration(machine_calibration: Path) -> Path:
    """Every measured local sweep of these tests predicts its trials with the session's quick
    calibration (`machine_calibration`), reused as this machine's."""
    return machine_calibration


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """A reachable Slurm controller. Brings the dev cluster up if `sinfo` fails; tears it down
    at the end only if it brought it up (and the ``slurm_down`` test has not already)."""
    c = Cluster()
    old_conf = os.environ.get("SLURM_CONF")
    if not sinfo_ok():
        t0 = time.monotonic()
        r = dev_cluster("up", timeout=900)  # includes apt-get install on a bare machine
        c.up_seconds = time.monotonic() - t0
        assert r.returncode == 0, f"dev-cluster.sh up failed:\n{r.stdout}\n{r.stderr}"
        c.started_here = True
        # /etc/slurm/slurm.conf normally points here already; set it explicitly all the same.
        os.environ["SLURM_CONF"] = str(STATE_DIR / "etc" / "slurm.conf")
        assert sinfo_ok(), "sinfo still fails after dev-cluster.sh up"
    c.running = True
    yield c
    if c.started_here and c.running:
        r = dev_cluster("down", timeout=300)
        assert r.returncode == 0, f"dev-cluster.sh down failed:\n{r.stdout}\n{r.stderr}"
    if c.started_here:
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf


REPO = Path(__file__).resolve().parents[2]

TWO_TRIALS = """
    description: two real trials for the report and projection tests, and a calibrated hardware file
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 16
      model.num_layers: 1
      parallel.dp: 2
      dist.device: cpu
      dist.threads_per_rank: 1
      train.steps: 3
      train.warmup: 1
      train.micro_batch: 1
      train.seq_len: 16
    grid:
      method: [canzona, sync]
    sweep:
      cluster: local
"""


@dataclass(frozen=True)
class SweepRun:
    """A sweep's command line (without ``results=``), its results folder and the first run's result."""

    command: list[str]
    results: Path
    proc: subprocess.CompletedProcess
    hardware: Path

    @property
    def dir(self) -> Path:
        return self.results / "two"


@pytest.fixture(scope="session")
def two_trial_sweep(tmp_path_factory: pytest.TempPathFactory, quick_calibration) -> SweepRun:
    assert quick_calibration.proc.returncode == 0, quick_calibration.proc.stderr[-2000:]
    folder = tmp_path_factory.mktemp("two-trial-sweep")
    (folder / "two.yaml").write_text(textwrap.dedent(TWO_TRIALS))
    command = [sys.executable, str(REPO / "sweeps" / "run.py"), f"sweep={folder / 'two.yaml'}",
               f"sim.hardware={quick_calibration.path}"]
    proc = subprocess.run([*command, f"results={folder / 'results'}"], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    return SweepRun(command, folder / "results", proc, quick_calibration.path)
