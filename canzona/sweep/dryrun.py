"""``cluster=dryrun``: dry-run every trial (its first and last rank) instead of running it.

Each trial's ranks run the real code of a GPU rank at full size on fake CUDA tensors and torch's
fake process group (`canzona.trial.dryrun`), here on this CPU. A trial is done when its ranks
ran, their collectives lined up with their programs and every rank's peak memory fits the
device (``dist.dry_run_memory_gb``); its folder then holds ``dryrun.json`` and ``dryrun.txt``
and a ``summary.json`` (the report's per-rank peaks, with ``dry_run: true``). A trial whose
dry run fails is recorded failed with the error and the sweep goes on. Trials overlap: a few
are in flight at once and their ranks share one rank per core (`rank_slots`), so that one
trial's work in this process (planning, the check of all its ranks' programs, the report)
and the ends of its ranks do not leave cores idle. At the end a table says,
per trial, the largest per-rank peak and whether it fits 80 GiB and 141 GiB of device memory; the same rows
go to ``dryrun.csv`` in the results folder. Results live in ``results/<sweep>[-<profile>]-dryrun``,
never beside measurements.
"""

from __future__ import annotations

import csv
import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from canzona.records import DRYRUN_CSV, DRYRUN_JSON, SUMMARY_FILE, atomic_write_json, atomic_write_text
from canzona.sweep import bookkeeping as bk
from canzona.sweep.backend import Backend, Submitted
from canzona.sweep.handles import FutureHandle, RunHandle, wait_any
from canzona.sweep.trials import ExpandedSweep, TrialRun

GIB = 2**30


def _peaks(report: dict[str, Any]) -> list[float]:
    """Per dry-run rank, its peak device memory in GiB."""
    return [float(r["memory"]["peak_bytes"]) / GIB for r in report.get("ranks", [])]


def rank_slots() -> int:
    """Dry-run ranks the sweep runs at once: one per core, at most the dry run's own cap."""
    from canzona.trial.dryrun.launch import MAX_WORKERS

    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def _dry_run_one(t: TrialRun, folder: Path, slots: threading.Semaphore) -> str | None:
    """One trial's dry run (in a worker thread) into `folder`: its error, None if it passed
    (its summary.json then written, last)."""
    from canzona.trial.dryrun import dry_run_trial

    try:
        report = dry_run_trial(t.cfg, t.cfg.dist.dry_run_ranks, folder, slots=slots)
    except Exception as e:  # noqa: BLE001 - recorded on the trial, the sweep goes on
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if report.get("errors"):
        return "; ".join(report["errors"])
    atomic_write_json(folder / SUMMARY_FILE, {"dry_run": True, "peak_gib": _peaks(report), "config": t.cfg.to_dict(),
                                              "report": DRYRUN_JSON})
    return None


class DryRunBackend(Backend):
    """``cluster=dryrun``: a few trials in flight in threads of this process, their ranks
    sharing `rank_slots` cores (one `threading.BoundedSemaphore` for the whole sweep)."""

    cluster = "dryrun"
    verb, past, noun = "dry-run", "dry-ran", "trial"
    tails = False  # the ranks' output is in dryrun.txt
    redraw_s = 2.0

    def __init__(self, sweep: ExpandedSweep, log_root: Path) -> None:
        super().__init__(sweep, log_root)
        self.cores = rank_slots()
        self.slots = threading.BoundedSemaphore(self.cores)  # one per core, shared by every trial's ranks
        self._pool: ThreadPoolExecutor | None = None

    def open(self, total: int) -> None:
        # trials in flight: enough that every core has a rank while one trial is between its ranks
        # (planning, checking, reporting) -- a trial dry-runs two ranks by default
        self.capacity = min(total, self.cores // 2 + 1)
        self._pool = ThreadPoolExecutor(self.capacity, thread_name_prefix="dryrun")

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        assert self._pool is not None, "open() first"
        handles: list[RunHandle] = []
        for run, rdir in runs:
            future = self._pool.submit(_dry_run_one, run, rdir, self.slots)
            handles.append(FutureHandle(run, rdir, future, self.cluster, "dry-run worker failed"))
        return handles, []

    def wait(self, running: list[RunHandle], timeout_s: float) -> None:
        wait_any(running, timeout_s)

    def describe(self) -> str:
        return f", {self.capacity} at a time, {self.cores} rank(s) at once"

    def close(self, handles: list[RunHandle]) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def memory_table(sweep: ExpandedSweep, runs: list[TrialRun]) -> str:
    """Per trial: world, the largest dry-run peak per rank, fits 80 GB / 141 GB; also written
    to ``dryrun.csv`` in the results folder. Returns the table's text."""
    rd = sweep.results_dir
    rows = []
    for r in runs:
        summary = bk.load_summary(rd / r.id) or {}
        status = bk.read_status(rd / r.id) or {}
        peaks = summary.get("peak_gib") or []
        peak = max(peaks) if peaks else None
        rows.append({
            "trial": r.id, "dp": r.trial.cfg.parallel.dp, "tp": r.trial.cfg.parallel.tp,
            "peak_gib": None if peak is None else round(peak, 2),
            "fits_80gib": None if peak is None else peak <= 80,
            "fits_141gib": None if peak is None else peak <= 141,
            "error": status.get("error"),
        })
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["trial"])
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(Path(rd) / DRYRUN_CSV, buf.getvalue())
    width = max((len(x["trial"]) for x in rows), default=5)
    lines = [f"{'trial':<{width}}  {'dp':>3} {'tp':>2}  {'peak GiB/rank':>13}  80 GiB  141 GiB"]
    for x in rows:
        if x["peak_gib"] is None:
            lines.append(f"{x['trial']:<{width}}  {x['dp']:>3} {x['tp']:>2}  {'-':>13}  failed: {x['error']}")
        else:
            lines.append(f"{x['trial']:<{width}}  {x['dp']:>3} {x['tp']:>2}  {x['peak_gib']:>13.1f}  "
                         f"{'yes' if x['fits_80gib'] else 'no':>6}  {'yes' if x['fits_141gib'] else 'no':>7}")
    return "\n".join(lines)
