"""``local.mode=worker``: one long-lived process runs the local runs one after another.

A local run started from scratch spends seconds before its first step: a Python interpreter,
torch, then `canzona.trial.launch.run_trial`'s forkserver importing torch and megatron-core
again for the ranks. With ``repeats`` that start dominates a local sweep (48 runs of a few
seconds of steps each). `run_trial` keeps its forkserver for later calls in the same process,
so a worker that stays up pays the start once: each later run costs its ranks' fork, model
build and steps. The ranks are fresh processes every run, as before, so nothing measured is
shared between runs.

The worker is a spawned process (a clean interpreter, not a fork of the sweep). Its stdout and
stderr -- inherited by the forkserver and so by every rank it forks -- are pipes that a thread
copies into the current run's log files, so each run's output lands in its own files however
its processes were started. A run that fails is reported with its traceback; a run that
exceeds ``local.timeout_min``, an interrupt, or a worker that dies takes the worker and all its
descendants down, and the next run gets a new worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, BinaryIO

from canzona.sweep.procs import kill_descendants


class _Tee:
    """Copies everything written to one of this process's file descriptors into the file set
    by `switch` (None: dropped), through a pipe that child processes inherit."""

    def __init__(self, fd: int) -> None:
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self._read = read
        self._dest: BinaryIO | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while chunk := os.read(self._read, 65536):
            with self._lock:
                if self._dest is not None:
                    self._dest.write(chunk)
                    self._dest.flush()

    def switch(self, path: str | None) -> None:
        with self._lock:
            if self._dest is not None:
                self._dest.close()
            self._dest = open(path, "ab") if path else None  # noqa: SIM115 - closed on the next switch


def _serve(conn: Connection) -> None:
    """The worker: ``(config, out, stdout, stderr)`` in, ``(error text or None)`` out, until None."""
    out_tee, err_tee = _Tee(1), _Tee(2)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        config, out, stdout, stderr = msg
        out_tee.switch(stdout)
        err_tee.switch(stderr)
        error = None
        try:
            from canzona.config import load_config
            from canzona.trial.launch import run_trial

            print(f"[worker {os.getpid()}] run_trial out={out}", flush=True)
            run_trial(load_config(base=config), Path(out))
        except BaseException:  # noqa: BLE001 - reported to the sweep, which records it
            error = traceback.format_exc()
            print(error, file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.05)  # let the pumps drain what the ranks wrote last
        out_tee.switch(None)
        err_tee.switch(None)
        conn.send(error)


class Worker:
    """The sweep's side of one worker process."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), name="canzona-sweep-worker")
        self.process.start()
        child.close()
        self.runs = 0

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

    def start(self, config: dict[str, Any], out: Path, stdout: Path, stderr: Path) -> str:
        """Hand the worker a run; returns the run's job id (worker pid . run number)."""
        self.runs += 1
        self._conn.send((config, str(out), str(stdout), str(stderr)))
        return f"{self.pid}.{self.runs}"

    def waitables(self) -> list[Any]:
        """What becomes ready when the run in progress ends: its result arrives, or the worker exits."""
        return [self._conn, self.process.sentinel]

    def result(self) -> tuple[bool, str | None]:
        """(finished, error text or None) of the run in progress; a dead worker is an error."""
        try:
            if self._conn.poll():
                return True, self._conn.recv()
        except (EOFError, OSError):
            pass
        else:
            if self.alive():
                return False, None
        return True, f"WorkerDied: the trial worker (pid {self.pid}) exited with code {self.process.exitcode}"

    def kill(self) -> None:
        """The worker and every process below it (forkserver, ranks)."""
        if self.process.pid is not None:
            kill_descendants(self.process.pid)
        self.process.kill()
        self.process.join(timeout=10)
        self._conn.close()

    def close(self) -> None:
        """Let an idle worker exit on its own (its forkserver goes with it), else kill it."""
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(timeout=10)  # its forkserver exits with it
        if self.process.is_alive():
            self.kill()
        else:
            self._conn.close()
