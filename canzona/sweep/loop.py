"""The sweep's one run loop, whatever the cluster: hand runs to a `Backend` while it has room,
poll their handles, and record each run's start and end in its folder.

Per run: its folder emptied (`bookkeeping.prepare`), status.json ``running`` once the backend
has it (``failed`` with the reason if the backend refused it), then ``done`` or ``failed`` with
its error -- a run that ended without summary.json failed -- and the stdout/stderr tails of its
logs. Progress: `canzona.sweep.progress.Progress`. Ctrl-C: every running run is stopped and
recorded failed (``interrupted``), and the loop returns 130; rerunning the same command resumes.
A closing line says how many runs ran, in how long, how, and how many failed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from canzona.records import SUMMARY_FILE
from canzona.sweep import bookkeeping as bk
from canzona.sweep.backend import Backend
from canzona.sweep.handles import RunHandle
from canzona.sweep.progress import Progress, fmt_duration
from canzona.sweep.trials import ExpandedSweep, TrialRun

INTERRUPTED = "interrupted (sweep stopped by the user)"


def run_loop(sweep: ExpandedSweep, backend: Backend, to_run: list[TrialRun], skipped: int, out: TextIO,
             between: Callable[[int, Callable[[str], None]], None] | None = None,
             between_eta: Callable[[], float] | None = None) -> int:
    """Run `to_run` on `backend` into the sweep folder; 0 (failures are recorded per run), or
    130 if interrupted. ``between(launched, log)`` is called whenever no run is in flight and
    another is about to be launched (the machine's calibration slices: `SweepCalibration`);
    ``between_eta()``: the seconds of that work still to come, added to the progress's ETA."""
    rd = sweep.results_dir.resolve()
    b = backend
    if not to_run:
        print(f"[sweep] nothing to {b.verb}: every {b.noun} is already recorded (rerun=all to {b.verb} them again)",
              file=out)
        return 0
    clock = time.monotonic()
    b.open(len(to_run))
    progress = Progress(len(to_run), skipped=skipped, parallel=min(b.capacity, len(to_run)), stream=out,
                        min_interval_s=b.redraw_s, extra=between_eta)
    base = {"cluster": b.cluster, **b.status_fields()}
    queue = list(to_run)
    running: list[RunHandle] = []
    submitted: list[RunHandle] = []
    try:
        while queue or running:
            free = b.capacity - len(running)
            if queue and free > 0:
                if between is not None and not running:
                    between(len(to_run) - len(queue), progress.event)
                batch, queue = queue[:free], queue[free:]
                with held_interrupts():  # what the backend took is recorded running, all of it
                    for r in batch:
                        bk.prepare(rd / r.id)
                    handles, refused = b.submit([(r, rd / r.id) for r in batch])
                    submitted.extend(handles)
                    for h in handles:
                        logs = {} if h.log_dir is None else {"log_dir": h.log_dir}
                        bk.write_status(h.run_dir, "running", error=None, job_id=h.job_id, started=bk.now(),
                                        ended=None, **base, **logs, **h.run.record())
                        progress.start(h.run.id)
                        running.append(h)
                    for r, err in refused:
                        bk.write_status(rd / r.id, "failed", error=err, started=bk.now(), ended=bk.now(), **base,
                                        **r.record())
                        progress.finish(r.id, False, f"[sweep] FAILED {r.id}: {err}")
            finished = [h for h in running if h.done()]
            for h in finished:
                with held_interrupts():  # recorded ended and out of `running` together
                    _finish(h, b, progress)
                    running.remove(h)
            progress.refresh()
            if running and not finished:
                b.wait(running, sweep.settings.poll_s)
    except KeyboardInterrupt:
        for h in running:
            h.cancel()
            bk.write_status(h.run_dir, "failed", error=INTERRUPTED, ended=bk.now())
        progress.close()
        print(f"[sweep] interrupted: stopped {len(running)} running {b.noun}(s); rerun the same command to resume",
              file=out)
        return 130
    finally:
        progress.close()
        b.close(submitted)
    print(f"[sweep] {b.past} {progress.finished} {b.noun}(s) in {fmt_duration(time.monotonic() - clock)}"
          f"{b.describe()}; {progress.failed} failed", file=out)
    return 0


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold a Ctrl-C until the block is over, then raise it: a KeyboardInterrupt between writing
    a run's status and updating the loop's list of running runs would leave status.json
    ``running`` for a run the interrupt handler does not know about. Only where Python's own
    handler is installed (an inherited SIG_IGN stays ignored) and on the main thread."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def _finish(h: RunHandle, backend: Backend, progress: Progress) -> None:
    """Record a run that ended: its tails (if the backend has logs), status.json, one progress line."""
    err = h.error
    if err is None and not (h.run_dir / SUMMARY_FILE).is_file():
        err = f"the {backend.noun} ended without writing {SUMMARY_FILE}"
    if backend.tails:
        note = "(cluster=debug: the trial's output went to the console)" if h.cluster == "debug" else ""
        try:
            stdout, stderr = h.log_paths()
            bk.write_tails(h.run_dir, stdout, stderr, note=note)
        except Exception as e:  # noqa: BLE001 - missing logs must not lose the status
            bk.write_tails(h.run_dir, [], [], note=f"logs unavailable: {e}")
    wall = time.monotonic() - h.t0
    bk.write_status(h.run_dir, "failed" if err else "done", error=err, ended=bk.now(), wall_s=round(wall, 3))
    rid = h.run.id
    progress.finish(rid, not err, f"[sweep] FAILED {rid} ({fmt_duration(wall)}): {err}" if err else None)


def log_root(results_dir: Path, invocation: str) -> Path:
    """Where the backends of one invocation keep their logs (submitit's folders, the workers')."""
    return results_dir.resolve() / "submitit" / invocation
