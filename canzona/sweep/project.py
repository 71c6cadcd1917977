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
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, TextIO

from canzona.sim.hardware import Hardware
from canzona.sweep import bookkeeping as bk
from canzona.sweep.progress import Progress, fmt_duration
from canzona.sweep.trials import SweepPlan, TrialRun

_HARDWARE: Hardware | None = None  # the worker's hardware (set once per process)


def _init(hardware: Hardware) -> None:
    global _HARDWARE
    _HARDWARE = hardware
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _project_one(config: dict[str, Any], out: str) -> dict[str, Any]:
    """Project one trial into `out`; returns ``{"error": None | str, "iteration_ms", ...}``."""
    from canzona.config import load_config
    from canzona.sim.simulate import write_trial

    assert _HARDWARE is not None
    try:
        cfg = load_config(base={k: v for k, v in config.items() if k != "out"})
        s = write_trial(cfg, _HARDWARE, out)
        return {"error": None, "iteration_ms": s["iteration_ms"], "optimizer_step_ms": s["optimizer_step_ms"]}
    except Exception as e:  # noqa: BLE001 - recorded on the trial, the sweep goes on
        tb = traceback.format_exc()
        try:
            Path(out, "stderr.txt").write_text(tb)
        except OSError:
            pass
        return {
            "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:2000]
        }


def stale_trials(plan: SweepPlan, hardware: Hardware, states: dict[str, str]) -> list[str]:
    """Runs recorded done whose projection came from another content of the hardware file
    (summaries of any age: `canzona.records.read_summary`)."""
    out = []
    for t in plan.runs():
        if states.get(t.id) != bk.DONE:
            continue
        summary = bk.load_summary(plan.results_dir / t.id) or {}
        if (
            summary.get("projected")
            and (summary.get("hardware") or {}).get("fingerprint") != hardware.fingerprint
        ):
            out.append(t.id)
    return out


def _workers(plan: SweepPlan, n: int) -> int:
    w = plan.settings.sim.workers or (os.cpu_count() or 1)
    return max(1, min(w, n))


def _context() -> mp.context.BaseContext:
    # fork: the workers inherit the imported planner and simulator (no re-import per worker)
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def project_trials(plan: SweepPlan, to_run: list[TrialRun], skipped: int, hardware: Hardware, out: TextIO) -> int:
    """Project `to_run` into the sweep folder; 0, or 130 if interrupted."""
    rd = plan.results_dir.resolve()
    if not to_run:
        print(
            "[sweep] nothing to project: every trial is already recorded (rerun=all to project them again)",
            file=out,
        )
        return 0
    workers = _workers(plan, len(to_run))
    # one line per failure, the counts at most every 2 s: a projection is 100+ trials in seconds
    progress = Progress(len(to_run), skipped=skipped, parallel=workers, stream=out, min_interval_s=2.0)
    clock = time.monotonic()
    base = {
        "cluster": "simulate",
        "projected": True,
        "sim_hardware": hardware.name,
        "sim_hardware_source": hardware.source,
        "sim_hardware_path": hardware.path,
        "hardware_fingerprint": hardware.fingerprint,
    }
    t0: dict[str, float] = {}

    def started(t: TrialRun) -> None:
        bk.prepare(rd / t.id)
        bk.write_status(
            rd / t.id, "running", error=None, job_id=None, started=bk.now(), ended=None, **t.record(), **base
        )
        t0[t.id] = time.monotonic()
        progress.start(t.id)

    def finished(t: TrialRun, res: dict[str, Any]) -> None:
        err = res.get("error")
        if err is None and not (rd / t.id / bk.SUMMARY).is_file():
            err = "the projection ended without writing summary.json"
        wall = time.monotonic() - t0.pop(t.id, time.monotonic())
        bk.write_status(
            rd / t.id, "failed" if err else "done", error=err, ended=bk.now(), wall_s=round(wall, 3)
        )
        if err:
            progress.finish(t.id, False, f"[sweep] FAILED {t.id} ({fmt_duration(wall)}): {err}")
        else:
            progress.finish(t.id, True, None)

    running: dict[Future, TrialRun] = {}
    try:
        if workers == 1:
            _init(hardware)
            for t in to_run:
                started(t)
                finished(t, _project_one(t.cfg.to_dict(), str(rd / t.id)))
            return 0
        with ProcessPoolExecutor(
            workers, mp_context=_context(), initializer=_init, initargs=(hardware,)
        ) as pool:
            queue = list(to_run)
            while queue or running:
                while queue and len(running) < workers:  # status "running" only while a worker has it
                    t = queue.pop(0)
                    started(t)
                    running[pool.submit(_project_one, t.cfg.to_dict(), str(rd / t.id))] = t
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for f in done:
                    t = running.pop(f)
                    try:
                        res = f.result()
                    except Exception as e:  # noqa: BLE001 - a worker died (e.g. out of memory)
                        res = {"error": f"projection worker failed: {type(e).__name__}: {e}"}
                    finished(t, res)
    except KeyboardInterrupt:
        for tid in list(t0):  # started, not finished
            bk.write_status(
                rd / tid, "failed", error="interrupted (sweep stopped by the user)", ended=bk.now()
            )
        progress.close()
        print(
            f"[sweep] interrupted: {len(t0)} projection(s) stopped; rerun the same command to resume",
            file=out,
        )
        return 130
    finally:
        progress.close()
    print(
        f"[sweep] projected {progress.done} trial(s) in {fmt_duration(time.monotonic() - clock)} with {workers} "
        f"worker(s) on {hardware.name} ({hardware.source}); {progress.failed} failed",
        file=out,
    )
    return 0
