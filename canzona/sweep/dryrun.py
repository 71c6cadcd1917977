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
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TextIO

from canzona.records import atomic_write_json, atomic_write_text
from canzona.sweep import bookkeeping as bk
from canzona.sweep.progress import Progress, fmt_duration
from canzona.sweep.trials import SweepPlan, TrialRun

GIB = 2**30


def _peaks(report: dict[str, Any]) -> list[float]:
    """Per dry-run rank, its peak device memory in GiB."""
    return [float(r["memory"]["peak_bytes"]) / GIB for r in report.get("ranks", [])]


def rank_slots() -> int:
    """Dry-run ranks the sweep runs at once: one per core, at most the dry run's own cap."""
    from canzona.trial.dryrun.launch import MAX_WORKERS

    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def _dry_run_one(t: TrialRun, folder: Path, slots: threading.Semaphore) -> tuple[dict[str, Any], str | None]:
    """One trial's dry run (in a worker thread): its report and error (None: it passed)."""
    from canzona.trial.dryrun import dry_run_trial

    try:
        report = dry_run_trial(t.cfg, t.cfg.dist.dry_run_ranks, folder, slots=slots)
        return report, ("; ".join(report["errors"]) if report.get("errors") else None)
    except Exception as e:  # noqa: BLE001 - recorded on the trial, the sweep goes on
        return {}, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def dry_run_trials(plan: SweepPlan, to_run: list[TrialRun], skipped: int, out: TextIO) -> int:
    """Dry-run `to_run` into the sweep folder; 0, or 130 if interrupted."""
    rd = plan.results_dir.resolve()
    if not to_run:
        print("[sweep] nothing to dry-run: every trial is already recorded (rerun=all to run them again)", file=out)
        return 0
    cores = rank_slots()
    slots = threading.BoundedSemaphore(cores)
    # trials in flight: enough that every core has a rank while one trial is between its ranks
    # (planning, checking, reporting) -- a trial dry-runs two ranks by default
    parallel = min(len(to_run), cores // 2 + 1)
    progress = Progress(len(to_run), skipped=skipped, parallel=parallel, stream=out, min_interval_s=2.0)
    clock = time.monotonic()
    t0: dict[str, float] = {}

    def started(t: TrialRun) -> None:
        folder = rd / t.id
        bk.prepare(folder)
        bk.write_status(folder, "running", error=None, job_id=None, started=bk.now(), ended=None,
                        cluster="dryrun", **t.record())
        t0[t.id] = time.monotonic()
        progress.start(t.id)

    def finished(t: TrialRun, report: dict[str, Any], err: str | None) -> None:
        folder = rd / t.id
        wall = time.monotonic() - t0.pop(t.id)
        if err is None:
            atomic_write_json(folder / bk.SUMMARY, {"dry_run": True, "peak_gib": _peaks(report),
                                                    "config": t.cfg.to_dict(), "report": "dryrun.json"})
        bk.write_status(folder, "failed" if err else "done", error=err, ended=bk.now(), wall_s=round(wall, 3))
        progress.finish(t.id, err is None, f"[sweep] FAILED {t.id} ({fmt_duration(wall)}): {err}" if err else None)

    try:
        with ThreadPoolExecutor(parallel, thread_name_prefix="dryrun") as pool:
            queue = list(to_run)
            order = {id(t): k for k, t in enumerate(to_run)}
            running: dict[Future, TrialRun] = {}
            while queue or running:
                while queue and len(running) < parallel:  # status "running" only once it is handed out
                    t = queue.pop(0)
                    started(t)
                    running[pool.submit(_dry_run_one, t, rd / t.id, slots)] = t
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for f in sorted(done, key=lambda f: order[id(running[f])]):
                    t = running.pop(f)
                    finished(t, *f.result())
    except KeyboardInterrupt:
        for tid in list(t0):  # handed out, not finished
            bk.write_status(rd / tid, "failed", error="interrupted (sweep stopped by the user)", ended=bk.now())
        progress.close()
        print(f"[sweep] interrupted: {len(t0)} dry run(s) stopped; rerun the same command to resume", file=out)
        return 130
    progress.close()
    print(f"[sweep] dry-ran {progress.finished} trial(s) in {fmt_duration(time.monotonic() - clock)}, {parallel} at a "
          f"time, {cores} rank(s) at once; {progress.failed} failed", file=out)
    return 0


def memory_table(plan: SweepPlan, runs: list[TrialRun]) -> str:
    """Per trial: world, the largest dry-run peak per rank, fits 80 GB / 141 GB; also written
    to ``dryrun.csv`` in the results folder. Returns the table's text."""
    rd = plan.results_dir
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
    atomic_write_text(Path(rd) / "dryrun.csv", buf.getvalue())
    width = max((len(x["trial"]) for x in rows), default=5)
    lines = [f"{'trial':<{width}}  {'dp':>3} {'tp':>2}  {'peak GiB/rank':>13}  80 GiB  141 GiB"]
    for x in rows:
        if x["peak_gib"] is None:
            lines.append(f"{x['trial']:<{width}}  {x['dp']:>3} {x['tp']:>2}  {'-':>13}  failed: {x['error']}")
        else:
            lines.append(f"{x['trial']:<{width}}  {x['dp']:>3} {x['tp']:>2}  {x['peak_gib']:>13.1f}  "
                         f"{'yes' if x['fits_80gib'] else 'no':>6}  {'yes' if x['fits_141gib'] else 'no':>7}")
    return "\n".join(lines)
