"""``cluster=simulate``: project every trial with `canzona.sim` instead of running it.

Each trial is written by `canzona.sim.simulate.write_trial` into its folder (config.yaml,
steps.jsonl, summary.json with ``projected: true``, the hardware and the assumptions) and gets a
status.json like any other cluster's (``cluster: simulate``, ``projected: true``, the hardware
file's name, source and fingerprint). Trials run in ``sim.workers`` processes (default one per
core); a trial that raises is recorded as failed and the sweep goes on.

Resume and rerun work as for the other clusters, and a trial projected with a different
*content* of the hardware file (its fingerprint) counts as stale, so editing or recalibrating a
hardware file and running the same command again re-projects what changed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from canzona.hardware import Hardware
from canzona.records import STDERR_FILE
from canzona.sweep import bookkeeping as bk
from canzona.sweep.backend import Backend, Submitted
from canzona.sweep.handles import FutureHandle, InlineFuture, RunHandle, wait_any
from canzona.sweep.trials import ExpandedSweep, TrialRun

_HARDWARE: Hardware | None = None  # the worker's hardware (set once per process)


def _init(hardware: Hardware) -> None:
    global _HARDWARE
    _HARDWARE = hardware
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _project_one(config: dict[str, Any], out: str) -> str | None:
    """Project one trial into `out`; its error as one line, None if it was written."""
    from canzona.config import load_config
    from canzona.sim.simulate import write_trial

    assert _HARDWARE is not None
    try:
        cfg = load_config(base={k: v for k, v in config.items() if k != "out"})
        write_trial(cfg, _HARDWARE, out)
        return None
    except Exception as e:  # noqa: BLE001 - recorded on the trial, the sweep goes on
        tb = traceback.format_exc()
        try:
            Path(out, STDERR_FILE).write_text(tb)
        except OSError:
            pass
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:2000]


def stale_trials(sweep: ExpandedSweep, hardware: Hardware, states: dict[str, str]) -> list[str]:
    """Runs recorded done whose projection came from another content of the hardware file
    (summaries of any age: `canzona.records.read_summary`)."""
    out = []
    for t in sweep.runs():
        if states.get(t.id) != bk.DONE:
            continue
        summary = bk.load_summary(sweep.results_dir / t.id) or {}
        if (
            summary.get("projected")
            and (summary.get("hardware") or {}).get("fingerprint") != hardware.fingerprint
        ):
            out.append(t.id)
    return out


def _workers(sweep: ExpandedSweep, n: int) -> int:
    w = sweep.settings.sim.workers or (os.cpu_count() or 1)
    return max(1, min(w, n))


def _context() -> mp.context.BaseContext:
    # fork: the workers inherit the imported planner and simulator (no re-import per worker)
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


class SimulateBackend(Backend):
    """``cluster=simulate``: every run a projection, in `_workers` worker processes forked once
    for the sweep (in this process when that is one)."""

    cluster = "simulate"
    verb, past, noun = "project", "projected", "trial"
    tails = False  # no launcher logs: a failed projection leaves its traceback in stderr.txt itself
    redraw_s = 2.0  # a projection is 100+ trials in seconds

    def __init__(self, sweep: ExpandedSweep, log_root: Path, hardware: Hardware) -> None:
        super().__init__(sweep, log_root)
        self.hardware = hardware
        self._pool: ProcessPoolExecutor | None = None

    def open(self, total: int) -> None:
        self.capacity = _workers(self.sweep, total)
        if self.capacity == 1:
            _init(self.hardware)
        else:
            self._pool = ProcessPoolExecutor(self.capacity, mp_context=_context(), initializer=_init,
                                             initargs=(self.hardware,))

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        handles: list[RunHandle] = []
        for run, rdir in runs:
            args = (run.cfg.to_dict(), str(rdir))
            future = InlineFuture(_project_one, *args) if self._pool is None else self._pool.submit(_project_one, *args)
            handles.append(FutureHandle(run, rdir, future, self.cluster, "projection worker failed"))
        return handles, []

    def wait(self, running: list[RunHandle], timeout_s: float) -> None:
        wait_any(running, timeout_s)

    def status_fields(self) -> dict[str, Any]:
        h = self.hardware
        return {"projected": True, "sim_hardware": h.name, "sim_hardware_source": h.source, "sim_hardware_path": h.path,
                "hardware_fingerprint": h.fingerprint}

    def describe(self) -> str:
        return f" with {self.capacity} worker(s) on {self.hardware.name} ({self.hardware.source})"

    def close(self, handles: list[RunHandle]) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
