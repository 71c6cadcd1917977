"""Run folders under ``results/<sweep>/``: what is done, what a rerun must run, the records
the launcher writes (status.json, stdout/stderr tails), all written atomically.

``results/<sweep>/``
  ``<trial_id>/``     repetition 1 of a trial: config.yaml, steps.jsonl, summary.json,
                      trace.json (the trial runner), status.json, stdout.txt, stderr.txt (the launcher)
  ``<trial_id>-r<k>/``  repetition k > 1 (sweep setting ``repeats``), the same files
  ``sweep.json``      the last sweep's manifest: sweep, profile, cluster, settings, trial ids,
                      axes and run folders, and the order the runs were launched in
  ``submitit/<stamp>/<job id>/``  submitit's pickles and full per-rank logs
  ``submitit/<stamp>/worker/<run>.out|.err``  full logs of the runs of ``local.mode=worker``
  ``sbatch/``         sbatch scripts (written by ``cluster=slurm list=true`` only)
  ``.sweep.lock``, ``.sweep.holder.json``  held by the sweep running on this folder (`lock`)

status.json: ``status`` (running | done | failed), ``error`` (one line), ``job_id``,
``started``, ``ended``, ``cluster``, ``host``, ``wall_s``, and which run it is: ``trial_id``
(shared by the repetitions of a trial), ``repeat`` (1-based) and ``repeats``.

A run is *done* when its folder holds summary.json and status.json does not say failed
(a run made by hand from ``sbatch/`` has no status.json until the next sweep adopts it).
Every run is resumed on its own: a failed repetition is rerun, its done siblings are kept.
"""

from __future__ import annotations

import json
import shutil
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from canzona.records import (
    STATUS_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    SUMMARY_FILE,
    atomic_write_json,
    atomic_write_text,
    read_summary,
)

TAIL_LINES = 200
TAIL_BYTES = 64_000

# States of a trial folder before a run.
DONE, FAILED, STALE, NEW = "done", "failed", "stale", "new"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def read_status(trial_dir: Path) -> dict[str, Any] | None:
    return read_json(Path(trial_dir) / STATUS_FILE)


def trial_state(trial_dir: Path) -> str:
    """done | failed | stale (status 'running' left by a sweep that did not finish) | new."""
    trial_dir = Path(trial_dir)
    status = read_status(trial_dir)
    s = (status or {}).get("status")
    if s == "failed":
        return FAILED
    if (trial_dir / SUMMARY_FILE).is_file():
        return DONE
    if s in ("running", "done"):  # running: sweep gone; done without summary: records lost
        return STALE
    return NEW


def should_run(state: str, rerun: str) -> bool:
    """rerun=all: everything; failed (default): all but done; none: only never-started trials."""
    if rerun == "all":
        return True
    if rerun == "failed":
        return state != DONE
    return state == NEW


def prepare(trial_dir: Path) -> None:
    """Empty the trial folder before a (re)run so no stale record survives."""
    trial_dir = Path(trial_dir)
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    trial_dir.mkdir(parents=True)


_invocation: str | None = None


def set_invocation(stamp: str) -> None:
    """Name this sweep invocation (``run_stamp``): every run it starts records it in its
    status.json, so a report of a resumed sweep can say how many invocations its runs came from."""
    global _invocation
    _invocation = stamp


def write_status(trial_dir: Path, status: str, **fields: Any) -> dict[str, Any]:
    """Update status.json (merging with what is there) atomically; returns the new record. A run
    set running records the invocation that started it (`set_invocation`)."""
    rec = read_status(trial_dir) or {
        "status": None,
        "error": None,
        "job_id": None,
        "started": None,
        "ended": None,
    }
    rec.update(fields)
    rec["status"] = status
    if status == "running":
        rec.setdefault("host", socket.gethostname())
        if _invocation is not None:
            rec["invocation"] = _invocation
    atomic_write_json(Path(trial_dir) / STATUS_FILE, rec)
    return rec


def adopt(trial_dir: Path, record: dict[str, Any] | None = None) -> None:
    """Record a run found complete without a launcher record (e.g. submitted by hand);
    ``record``: which run it is (`TrialRun.record`)."""
    status = read_status(trial_dir)
    if not status or status.get("status") != "done":
        ended = (status or {}).get("ended") or now()
        write_status(trial_dir, "done", error=None, ended=ended, adopted=True, **(record or {}))


def tail_text(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def write_tails(trial_dir: Path, stdout: list[Path], stderr: list[Path], note: str = "") -> None:
    """stdout.txt / stderr.txt: the tail of each rank's log, with a header per rank if several."""
    for name, paths in ((STDOUT_FILE, stdout), (STDERR_FILE, stderr)):
        parts = []
        for rank, p in enumerate(paths):
            text = tail_text(p)
            if len(paths) > 1:
                if not text.strip():
                    continue
                parts.append(f"==> rank {rank} ({p}) <==\n{text}")
            else:
                parts.append(text)
        body = "\n".join(parts)
        if note:
            body = f"{note}\n{body}" if body else note
        atomic_write_text(Path(trial_dir) / name, body + ("\n" if body and not body.endswith("\n") else ""))


def load_summary(trial_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json under today's key names (`canzona.records.read_summary`), or None."""
    summary = read_json(Path(trial_dir) / SUMMARY_FILE)
    return read_summary(summary) if isinstance(summary, dict) else summary
