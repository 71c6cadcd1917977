"""Slurm's own word on how a job ended, for jobs submitit cannot explain.

When Slurm ends a job -- ``scancel``, the time limit, a node failure, the OOM killer,
preemption -- the job writes no result, and submitit can only say ``UncompletedJobError ...
has not produced any output``. The trial's record should name what happened instead. Where
accounting runs (``sacct``, every real cluster) the state comes from there; without slurmdbd
(the dev cluster) ``sacct`` is disabled and submitit sees every job as ``UNKNOWN`` -- and then
never sees a cancelled job end at all, since it waits for a result file. The controller still
knows the job's state for ``MinJobAge`` seconds after it ended (``squeue --states=all``), so
that is asked too. One call covers every watched job.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# States in which Slurm, not the job's own code, ended the job.
ENDED_BY_SLURM = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
# Further end states; a job in one of these normally wrote its own result or error.
ENDED_BY_JOB = ("COMPLETED", "FAILED", "REVOKED", "SPECIAL_EXIT")


@dataclass(frozen=True)
class JobState:
    state: str  # first word of Slurm's state ("CANCELLED by 0" -> CANCELLED)
    reason: str = ""

    def describe(self, job_id: str) -> str:
        reason = f" ({self.reason})" if self.reason and self.reason not in ("None", "") else ""
        return f"Slurm ended job {job_id}: {self.state}{reason}"


Runner = Callable[[list[str]], str | None]


def _run(cmd: list[str]) -> str | None:
    """stdout of ``cmd``, or None if it fails (no such command, accounting disabled, ...)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def parse_states(text: str) -> dict[str, JobState]:
    """``JOBID|STATE[|REASON]`` lines (sacct --parsable2, or squeue -o '%i|%T|%r') -> states;
    pending array ranges (``12_[3-9]``) and job steps (``12.batch``) are skipped."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0] or "[" in parts[0] or "." in parts[0]:
            continue
        words = parts[1].split()
        if words:
            out[parts[0]] = JobState(words[0].upper(), parts[2].strip() if len(parts) > 2 else "")
    return out


def query(job_ids: Iterable[str], run: Runner = _run) -> dict[str, JobState]:
    """The states of ``job_ids`` (``123`` or array tasks ``123_4``): accounting first, then the
    controller for any job accounting does not know."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    mains = sorted({j.split("_")[0] for j in ids})
    found: dict[str, JobState] = {}
    text = run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(mains)])
    if text:
        found.update(parse_states(text))
    if any(j not in found for j in ids):
        text = run(["squeue", "-h", "-t", "all", "-j", ",".join(mains), "-o", "%i|%T|%r"])
        if text:
            found.update({k: v for k, v in parse_states(text).items() if k not in found})
    return {j: found[j] for j in ids if j in found}


class SlurmStates:
    """Watches the Slurm state of submitted jobs, asking at most every ``interval_s`` seconds
    (one call for all of them), and says when a job has ended without a result.

    A job Slurm ended (`ENDED_BY_SLURM`) counts as ended once it has been seen in that state
    for ``grace_s`` (a preempted job that submitit requeues leaves it again); a job that ended on
    its own (`ENDED_BY_JOB`) but left no result only after ``lost_s`` (its result file may reach
    a shared filesystem late), so that no sweep waits forever for a result that will not come."""

    def __init__(
        self, interval_s: float = 5.0, grace_s: float = 5.0, lost_s: float = 120.0, run: Runner = _run
    ) -> None:
        self.interval_s, self.grace_s, self.lost_s = interval_s, grace_s, lost_s
        self._run = run
        self._watched: set[str] = set()
        self._states: dict[str, JobState] = {}
        self._since: dict[str, tuple[str, float]] = {}  # job -> (end state, first seen)
        self._last = float("-inf")

    def watch(self, job_id: str) -> None:
        self._watched.add(job_id)

    def forget(self, job_id: str) -> None:
        self._watched.discard(job_id)

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self._states.update(query(self._watched, self._run))
        for job, st in self._states.items():
            if st.state in ENDED_BY_SLURM or st.state in ENDED_BY_JOB:
                if self._since.get(job, ("", 0.0))[0] != st.state:
                    self._since[job] = (st.state, now)
            else:
                self._since.pop(job, None)

    def state(self, job_id: str, refresh: bool = False) -> JobState | None:
        self.watch(job_id)
        self._refresh(force=refresh)
        return self._states.get(job_id)

    def ended_by_slurm(self, job_id: str) -> str | None:
        """For a job that has ended: the error naming Slurm's end state, if Slurm ended it."""
        st = self.state(job_id, refresh=True)
        return st.describe(job_id) if st is not None and st.state in ENDED_BY_SLURM else None

    def ended_without_result(self, job_id: str) -> str | None:
        """For a job with no result yet: the error to record if it will never have one."""
        st = self.state(job_id)
        if st is None or job_id not in self._since:
            return None
        age = time.monotonic() - self._since[job_id][1]
        if st.state in ENDED_BY_SLURM and age >= self.grace_s:
            return st.describe(job_id)
        if st.state in ENDED_BY_JOB and age >= self.lost_s:
            return f"Slurm says job {job_id} ended {st.state}, but it left no result (see stderr.txt)"
        return None
