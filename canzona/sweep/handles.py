"""A submitted run's job: whether it has ended, and its error as one line.

The error is what a reader of status.json needs first: the exception that ended the failing
rank (the likely cause listed before the collateral "connection closed" of the other ranks),
or -- when Slurm ended the job (``scancel``, time limit, node failure, OOM) -- Slurm's state,
from `canzona.sweep.slurm_state`, rather than submitit's "has not produced any output".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import submitit

from canzona.sweep.slurm_state import SlurmStates
from canzona.sweep.trials import TrialRun

# Messages that are usually the consequence of another rank failing, not the cause.
_COLLATERAL = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl", "timed out", "socket")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Exited|Failure)\b")


def headline(exc: BaseException) -> str:
    """One line from a job's error: the exception line ending its traceback if it carries one
    (submitit's FailedJobError wraps the job's trace and appends log paths), else its first line."""
    text = str(exc)
    traced = "with trace:" in text
    body = text.split("with trace:", 1)[1].split("You can check full logs", 1)[0] if traced else text
    lines = [ln.strip() for ln in body.splitlines() if ln.strip() and set(ln.strip()) - {"-", "="}]
    if not lines:
        return type(exc).__name__
    if traced:
        for ln in reversed(lines):
            if _EXC_LINE.match(ln):
                return ln[:400]
        return lines[-1][:400]
    first = lines[0][:400]
    return first if first.startswith(type(exc).__name__) else f"{type(exc).__name__}: {first}"


def traceback_line(text: str) -> str:
    """The exception line a formatted traceback ends with (the innermost one quoted in it, e.g.
    a rank's error inside torch's ProcessRaisedException), else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXC_LINE.match(ln) and not ln.startswith("torch.multiprocessing.spawn.ProcessRaisedException"):
            return ln[:400]
    return (lines[-1] if lines else "unknown error")[:400]


def job_error(job: submitit.Job) -> str | None:
    """None if every task succeeded, else 'rank k: <error>' per failing rank, likely cause first."""
    n = job.num_tasks
    subs = [job.task(k) for k in range(n)] if n > 1 else [job]
    found: dict[str, list[int]] = {}
    for k, sub in enumerate(subs):
        try:
            exc = sub.exception()
        except Exception as e:  # noqa: BLE001 - reading the outcome itself failed
            exc = e
        if exc is not None:
            found.setdefault(headline(exc), []).append(k)
    if not found:
        return None
    items = sorted(found.items(), key=lambda kv: (any(c in kv[0].lower() for c in _COLLATERAL), kv[1][0]))
    parts = []
    for msg, ranks in items:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
        parts.append(f"{who}: {msg}" if n > 1 else msg)
    return "; ".join(parts)[:2000]


class RunHandle(Protocol):
    """What the sweep needs of a launched run, whatever launched it."""

    run: TrialRun
    run_dir: Path
    cluster: str
    t0: float

    @property
    def job_id(self) -> str | None: ...
    @property
    def log_dir(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    def done(self) -> bool: ...
    def log_paths(self) -> tuple[list[Path], list[Path]]: ...
    def cancel(self) -> None: ...


@dataclass
class JobHandle:
    """One run's submitit job. ``slurm``: the backend's watcher of Slurm states (cluster=slurm)."""

    run: TrialRun
    job: Any
    run_dir: Path
    cluster: str
    slurm: SlurmStates | None = None
    t0: float = field(default_factory=time.monotonic)
    _error: str | None = None
    _finished: bool = False

    def __post_init__(self) -> None:
        if self.slurm is not None:
            self.slurm.watch(self.job_id)

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    @property
    def log_dir(self) -> str:
        return str(self.job.paths.folder)

    def done(self) -> bool:
        if self._finished:
            return True
        if self.cluster == "debug":
            exc = self.job.exception()  # runs the trial here; exception() never enters pdb
            self._finish(None if exc is None else headline(exc))
            return True
        if self.job.done():
            err = job_error(self.job)
            if err is not None and self.slurm is not None:
                err = self.slurm.ended_by_slurm(self.job_id) or err
            self._finish(err)
            return True
        if self.slurm is not None:  # no result (yet): has Slurm ended the job without one?
            err = self.slurm.ended_without_result(self.job_id)
            if err is not None:
                self._finish(err)
                return True
        return False

    def _finish(self, error: str | None) -> None:
        self._error, self._finished = error, True
        if self.slurm is not None:
            self.slurm.forget(self.job_id)

    @property
    def error(self) -> str | None:
        return self._error

    def log_paths(self) -> tuple[list[Path], list[Path]]:
        n = self.job.num_tasks
        subs = [self.job.task(k) for k in range(n)] if n > 1 else [self.job]
        return [s.paths.stdout for s in subs], [s.paths.stderr for s in subs]

    def cancel(self) -> None:
        if self.cluster == "debug":
            return
        try:
            self.job.cancel(check=False)
        except Exception:  # noqa: BLE001 - best effort on interrupt
            pass


class InlineFuture:
    """A call made in this process the first time its result is asked for, with the
    `concurrent.futures.Future` methods `FutureHandle` uses (a pool of one: no worker)."""

    def __init__(self, fn: Callable[..., str | None], *args: Any) -> None:
        self._call: Callable[[], str | None] | None = lambda: fn(*args)
        self._result: str | None = None

    def done(self) -> bool:
        if self._call is not None:
            call, self._call = self._call, None
            self._result = call()
        return True

    def result(self) -> str | None:
        self.done()
        return self._result

    def cancel(self) -> bool:
        self._call = None
        return True


@dataclass
class FutureHandle:
    """A run handed to a pool (`concurrent.futures`, or an `InlineFuture`) whose call returns the
    run's error, None if it passed. An exception out of the call itself -- the pool's worker
    died -- is the run's error, prefixed with ``lost`` (e.g. ``projection worker failed``)."""

    run: TrialRun
    run_dir: Path
    future: Future | InlineFuture
    cluster: str
    lost: str
    t0: float = field(default_factory=time.monotonic)
    job_id: None = None
    log_dir: None = None
    error: str | None = None

    def done(self) -> bool:
        if not self.future.done():
            return False
        try:
            self.error = self.future.result()
        except Exception as e:  # noqa: BLE001 - e.g. the worker ran out of memory
            self.error = f"{self.lost}: {type(e).__name__}: {e}"
        return True

    def log_paths(self) -> tuple[list[Path], list[Path]]:
        return [], []

    def cancel(self) -> None:
        self.future.cancel()


def wait_any(running: list[RunHandle], timeout_s: float) -> None:
    """Until one of the pool futures of `running` is done, at most `timeout_s`."""
    futures = [h.future for h in running if isinstance(h, FutureHandle) and isinstance(h.future, Future)]
    if futures:
        wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)
