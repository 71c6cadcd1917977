"""Acceptance: every trial of the ``paper`` profile of sweeps/configs/qwen3_scaling.yaml passes the
dry run of its first and last rank -- its code runs on fake CUDA at full size and scale (up to
256 ranks, 4096-token sequences) and both ranks fit the device memory the trial names
(``dist.dry_run_memory_gb``, default 80 GiB) -- through the command a user runs:
``python sweeps/run.py sweep=qwen3_scaling profile=paper cluster=dryrun``.

Long (``pytest -m paper``, this and the ablation ladder, took 27 min 52 s on two cores on
2026-12-01), so it is marked ``paper``: outside the test suite of
scripts/test.sh, run by CI as a step of its own (.ci/run) and by hand with ``pytest -m paper``."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.sweep.expand import expand_sweep

pytestmark = [pytest.mark.slow, pytest.mark.paper]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(3 * 3600)
def test_every_paper_trial_passes_the_dry_run(tmp_path: Path) -> None:
    trials = expand_sweep(["sweep=qwen3_scaling", "profile=paper"]).trials
    r = subprocess.run(
        [sys.executable, str(REPO / "sweeps" / "run.py"), "sweep=qwen3_scaling", "profile=paper", "cluster=dryrun",
         f"results={tmp_path}"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    print(r.stdout[-20000:])  # the memory table, in the test log
    rows = list(csv.DictReader((tmp_path / "qwen3_scaling-paper-dryrun" / "dryrun.csv").open()))
    failed = [f"{row['trial']}: {row['error']}" for row in rows if row["error"] or not row["peak_gib"]]
    assert not failed, "\n".join(failed)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(row["trial"] for row in rows) == sorted(t.id for t in trials)
    for row in rows:
        trial = next(t for t in trials if t.id == row["trial"])
        assert float(row["peak_gib"]) <= trial.cfg.dist.dry_run_memory_gb, row
