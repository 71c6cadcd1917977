"""What the sweep's run loop (`canzona.sweep.loop`) needs of a cluster: the `Backend` interface.

A backend takes runs and gives back one `canzona.sweep.handles.RunHandle` per run; the loop
polls the handles and does everything else once, whatever the cluster: the run folders and
their status.json, progress, failures, Ctrl-C and the closing line. The backends are
`canzona.sweep.backends` (local processes, submitit in-process, Slurm),
`canzona.sweep.project.SimulateBackend` (``cluster=simulate``) and
`canzona.sweep.dryrun.DryRunBackend` (``cluster=dryrun``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from canzona.sweep.handles import RunHandle
from canzona.sweep.settings import SweepSettings
from canzona.sweep.trials import ExpandedSweep, TrialRun

Submitted = tuple[list[RunHandle], list[tuple[TrialRun, str]]]  # handles, (run, error) refused


class Backend:
    """One cluster's way to run runs. The loop calls `open` once with the number of runs to
    go, then `submit` while fewer than `capacity` run, `wait` between polls, `close` at the
    end (also after an error or Ctrl-C). The class attributes name what the loop prints."""

    capacity: int = 1 << 30  # runs at once
    cluster = ""
    verb, past, noun = "run", "ran", "run"  # "N to run", "ran N run(s)"
    tails = True  # the loop writes stdout.txt / stderr.txt from the handle's logs
    redraw_s = 0.0  # the terminal's status line is redrawn at most this often

    def __init__(self, sweep: ExpandedSweep, log_root: Path) -> None:
        self.sweep = sweep
        self.settings: SweepSettings = sweep.settings
        self.log_root = log_root

    def open(self, total: int) -> None:
        """Before the first `submit`: `total` runs are to go."""

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        raise NotImplementedError

    def wait(self, running: list[RunHandle], timeout_s: float) -> None:
        """Block until a running run may have ended, at most `timeout_s`."""
        time.sleep(timeout_s)

    def status_fields(self) -> dict[str, Any]:
        """What every run's status.json records of this backend beside the loop's own fields."""
        return {}

    def describe(self) -> str:
        """How the runs ran, for the closing line (e.g. ``, 2 at a time``)."""
        return ""

    def close(self, handles: list[RunHandle]) -> None:
        pass
