"""``sweeps/run.py ... cluster=dryrun``: every trial's first and last rank dry-run on fake CUDA, the
memory table and dryrun.csv, a failing trial recorded with its error while the sweep goes on, and
a rerun that dry-runs only what did not pass."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SWEEP = """
    description: two small CUDA trials for the dry run; one does not fit its memory limit
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 8
      model.num_layers: 2
      dist.device: cuda
      train.micro_batch: 1
      train.seq_len: 128
      parallel.dp: 2
      parallel.tp: 2
    grid:
      trial:
        fits: {method: canzona}
        too-big: {method: sync, dist.dry_run_memory_gb: 0.001}
"""


def _sweep(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "sweeps" / "run.py"), f"sweep={tmp_path / 'small.yaml'}", "cluster=dryrun",
         f"results={tmp_path / 'results'}", *extra],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )


def test_dryrun_sweep_records_each_trial_and_resumes(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text(textwrap.dedent(SWEEP))
    r = _sweep(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out  # one trial failed its dry run
    root = tmp_path / "results" / "small-dryrun"
    rows = {row["trial"]: row for row in csv.DictReader((root / "dryrun.csv").open())}
    assert len(rows) == 2, rows
    (fits,) = [t for t in rows if "canzona" in t]
    (big,) = [t for t in rows if "sync" in t]

    st = json.loads((root / fits / "status.json").read_text())
    assert st["status"] == "done" and st["cluster"] == "dryrun" and st["error"] is None, st
    report = json.loads((root / fits / "dryrun.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0, 3] and report["errors"] == []
    peak = max(r["memory"]["peak_bytes"] for r in report["ranks"]) / 2**30
    assert 0 < peak and float(rows[fits]["peak_gib"]) == pytest.approx(peak, abs=0.01)
    assert rows[fits]["fits_80gib"] == "True" and rows[fits]["fits_141gib"] == "True"

    st = json.loads((root / big / "status.json").read_text())
    assert st["status"] == "failed" and "0.001" in st["error"], st  # the limit it exceeded, named
    assert rows[big]["peak_gib"] == "" and rows[big]["error"] == st["error"]
    assert not (root / big / "dryrun.json").exists()  # nothing partial
    assert f"FAILED {big}" in out and "peak GiB/rank" in out and str(root / "dryrun.csv") in out

    again = _sweep(tmp_path)  # rerun: only the failed trial runs again (and fails again)
    assert again.returncode == 1 and "2 trials, 1 to dry-run, 1 skipped" in again.stdout, again.stdout + again.stderr
