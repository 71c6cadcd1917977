"""One sweep at a time per results folder.

Two sweeps on one folder (a user rerunning while the first still runs) would both run every
pending trial at once, on the same cores, and overwrite each other's records: whatever survived
would have been measured under double load. So a sweep holds an OS file lock
(`filelock.FileLock`, ``flock`` on Unix) on ``<results folder>/.sweep.lock`` for as long as it
runs; a second sweep fails at once, before it writes anything, naming the holder.

The lock itself carries no information, and the OS drops it when its process dies -- so a
crashed sweep never blocks the next one. Who holds it (pid, host, start time, command line)
is written beside it in ``.sweep.holder.json`` once the lock is taken; that file is only read
by a sweep that failed to take the lock, i.e. while its writer still holds it (a holder file
left by a dead sweep is simply overwritten by the next one).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from canzona.errors import ConfigError
from canzona.records import atomic_write_json

LOCK_NAME = ".sweep.lock"
HOLDER_NAME = ".sweep.holder.json"


def holder_record(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Who this process is, as the holder file records it."""
    args = list(sys.argv if argv is None else argv)
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *args]),
        "cwd": os.getcwd(),
    }


def describe_holder(folder: Path) -> str:
    """One line naming the sweep holding ``folder`` (from its holder file, if readable)."""
    try:
        h = json.loads((Path(folder) / HOLDER_NAME).read_text())
        return f"pid {h['pid']} on {h['host']}, started {h['started']}: {h['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not recorded itself yet"


class ResultsLock:
    """Exclusive hold of a results folder by this process: `acquire`, then `release` (or use
    it as a context manager)."""

    def __init__(self, folder: Path, argv: Sequence[str] | None = None) -> None:
        self.folder = Path(folder)
        self.argv = argv
        self._lock: FileLock | None = None

    def acquire(self) -> None:
        """Take the folder (created if missing). Raises `ConfigError` -- the CLI prints it and
        exits 2 -- if another process holds it; nothing is then created or written."""
        self.folder.mkdir(parents=True, exist_ok=True)  # writes nothing when it exists: a held folder does
        lock = FileLock(str(self.folder / LOCK_NAME), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise ConfigError(
                f"results folder {self.folder} is in use by another sweep ({describe_holder(self.folder)}); "
                "wait for it to end or choose another results=DIR"
            ) from None
        self._lock = lock
        atomic_write_json(self.folder / HOLDER_NAME, holder_record(self.argv))

    def release(self) -> None:
        if self._lock is None:
            return
        try:
            (self.folder / HOLDER_NAME).unlink()
        except OSError:
            pass
        self._lock.release()
        self._lock = None

    def __enter__(self) -> ResultsLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
