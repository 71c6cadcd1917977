"""A local trial's ranks live only as long as the process that launched them.

The ranks are forked from the multiprocessing forkserver, not from the launcher, so neither the
kernel's parent-death signal (torch sets one, aimed at the forkserver) nor the forkserver itself
notices a launcher killed with SIGKILL: the forkserver keeps waiting while the ranks, which hold
its liveness pipe, keep training. So each rank watches the launcher itself -- its pid and, to be
safe from pid reuse, its start time in ``/proc`` -- and ends at once (``os._exit``) when it is
gone; the forkserver then sees its pipe close and exits too. Signals to a live launcher are its
own business (`canzona.trial.launch.run_trial` stops the ranks).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

LOST_LAUNCHER_EXIT = 1  # nobody reads it: the launcher is gone


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), None if unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def identity(pid: int | None = None) -> tuple[int, str | None]:
    """(pid, start time) of a process (default: this one); the start time is None off Linux."""
    pid = os.getpid() if pid is None else pid
    fields = _stat(pid)
    return pid, fields[19] if fields and len(fields) > 19 else None  # field 22 of stat: starttime


def alive(who: tuple[int, str | None]) -> bool:
    """Is the process still running? A zombie (killed, not yet reaped by its own parent) is not."""
    pid, started = who
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if started is None:
        return True
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == started


def watch(launcher: tuple[int, str | None], interval_s: float = 0.5) -> threading.Thread:
    """End this process as soon as ``launcher`` (an `identity`) is no longer alive."""

    def run() -> None:
        while alive(launcher):
            time.sleep(interval_s)
        os._exit(LOST_LAUNCHER_EXIT)

    t = threading.Thread(target=run, name="canzona-lifeline", daemon=True)
    t.start()
    return t
