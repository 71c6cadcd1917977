"""This machine's hardware file, made once per (host, device, torch) and reused after: what a
measured sweep's report predicts its trials with when no hardware file is given.

The file lives beside the calibration cache (`canzona.calibrate.cache.cache_dir`), under
``hardware/<identity>.yaml`` (the identity of `canzona.calibrate.cache.this_device`: host, CPU
model and threads per rank, torch version), so a checkout copied to another machine, or a torch
upgrade, gets a calibration of its own. A file of another calibration format (an older harness
measured less, or differently: `canzona.calibrate.build.CALIBRATION_FORMAT`) is taken anew. Concurrent sweeps take turns through a file
lock; the calibration is the full one of ``python -m canzona.calibrate`` (about a minute on 2
cores), as a quick one estimates the model pass instead of timing it, taken `REPEATS` times in a
row and kept as their median (`canzona.calibrate.repeat`: one calibration of a shared VM can
read a rate 35 % off the trials' minutes).

A measured sweep that finds no calibration takes it in slices between its runs instead
(`SweepCalibration`): a trial's number is the median of runs spread over the sweep, and its
prediction is then made with a calibration sampled over the same minutes, not one moment after
them (on the project's 2-core VM the same command's trials moved 8-33 % from one sweep to the
next, and two calibrations ten minutes apart about 30 %: docs/results.md).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

LOCK_TIMEOUT_S = 900.0
REPEATS = 3
SLICES = 5  # a sweep's calibration slices: as many as the runs of each trial the README's sweep takes the median of


def machine_hardware_path(threads: int = 1) -> Path:
    from canzona.calibrate.cache import cache_dir, this_device

    return cache_dir() / "hardware" / this_device("cpu", threads).file_name()


def _usable(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    from canzona.calibrate.build import CALIBRATION_FORMAT

    return isinstance(data, dict) and (data.get("calibration") or {}).get("format") == CALIBRATION_FORMAT


def machine_hardware(threads: int = 1, log: Callable[[str], Any] = print, quick: bool = False) -> Path:
    """The path of this machine's CPU hardware file for ``threads`` torch threads per rank,
    calibrated now if there is none yet (or it predates a number the simulator reads);
    ``quick``: a quick calibration (`canzona.calibrate.settings`) if one is taken."""
    from filelock import FileLock

    from canzona.calibrate.build import calibrate, write_hardware
    from canzona.calibrate.settings import parse_args

    path = machine_hardware_path(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        if _usable(path):
            log(f"[calibrate] reused this machine's calibration: {path}")
            return path
        log(f"[calibrate] calibrating this machine ({REPEATS} times in a row, about a minute each, the median kept; "
            f"once per host, CPU and torch) into {path}")
        opts = parse_args(_arguments(path, threads, REPEATS, quick))
        write_hardware(calibrate(opts, log=lambda line: log(f"[calibrate] {line.strip()}")), path)
    return path


def _arguments(path: Path, threads: int, repeats: int, quick: bool = False) -> list[str]:
    """``python -m canzona.calibrate``'s arguments for this machine's file."""
    return [f"out={path}", "device=cpu", f"threads={threads}", "name=local", f"repeats={repeats}",
            *(["quick=true"] if quick else [])]


def slice_schedule(runs: int, slices: int) -> list[int]:
    """Before which run (0-based, in launch order) each slice but the last is taken; the last
    is taken after the runs. Evenly spread: 80 runs in 5 slices -> [0, 20, 40, 60], then the end."""
    if slices < 1:
        raise ValueError(f"slices={slices} must be >= 1")
    return [math.ceil(k * runs / (slices - 1)) for k in range(slices - 1)]


class SweepCalibration:
    """This machine's calibration, taken by a measured local sweep in ``slices`` slices spread
    between its runs -- each a whole calibration of ``python -m canzona.calibrate``, taken while
    no run is in flight -- and kept as their median (`canzona.calibrate.build.merge_calibrations`);
    ``calibration.slices`` records where each was taken. Nothing is taken when this machine has
    a usable calibration already (`finish` reuses it), and a slice that fails leaves the rest to
    `machine_hardware`'s calibration in a row after the runs: the report never goes without."""

    def __init__(self, threads: int, runs: int, slices: int = SLICES, quick: bool = False) -> None:
        self.path = machine_hardware_path(threads)
        self.threads, self.runs, self.slices, self.quick = threads, runs, slices, quick
        self.due = slice_schedule(runs, slices)
        self.taken: list[tuple[int, dict[str, Any]]] = []  # (runs launched before it, its calibration)
        self.seconds: list[float] = []  # how long each slice taken took
        self.failed = False
        self.wanted = not _usable(self.path)

    def between(self, started: int, log: Callable[[str], Any] = print) -> None:
        """Take the slices due before run ``started`` (the runs launched so far; none running)."""
        while self.wanted and not self.failed and self.due and self.due[0] <= started:
            self.due.pop(0)
            self._take(started, log)

    def remaining_s(self) -> float:
        """Seconds of the slices still to take, at the median of those taken (measured, never
        guessed: 0 before the first has been taken, or when none is wanted): the sweep's ETA
        adds them to its runs'."""
        if not self.wanted or self.failed or not self.seconds:
            return 0.0
        return max(0, self.slices - len(self.taken)) * statistics.median(self.seconds)

    def finish(self, log: Callable[[str], Any] = print) -> Path:
        """The path of this machine's hardware file: the slices' median, the last slice taken now."""
        if not self.wanted or self.failed:
            return machine_hardware(self.threads, log, self.quick)
        from filelock import FileLock

        from canzona.calibrate.build import merge_calibrations, write_hardware

        while not self.failed and len(self.taken) < self.slices:
            self._take(self.runs, log)
        if self.failed:
            return machine_hardware(self.threads, log, self.quick)
        with FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S):
            if _usable(self.path):  # another sweep's calibration landed meanwhile: one per machine
                log(f"[calibrate] reused this machine's calibration: {self.path}")
                return self.path
            hardware = merge_calibrations([h for _, h in self.taken], log=lambda line: log(f"[calibrate] {line.strip()}"))
            hardware["calibration"]["slices"] = {"before_run": [k for k, _ in self.taken], "of_runs": self.runs}
            write_hardware(hardware, self.path)
        log(f"[calibrate] this machine's calibration, the median of {self.slices} slices spread over the sweep: "
            f"{self.path}")
        return self.path

    def _take(self, started: int, log: Callable[[str], Any]) -> None:
        from filelock import FileLock

        from canzona.calibrate.build import calibrate
        from canzona.calibrate.settings import parse_args

        where = "after the runs" if started >= self.runs else f"before run {started + 1} of {self.runs}"
        log(f"[calibrate] calibrating this machine, slice {len(self.taken) + 1} of {self.slices} ({where}; "
            f"once per host, CPU and torch) for {self.path}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S):
                opts = parse_args(_arguments(self.path, self.threads, 1, self.quick))
                t0 = time.monotonic()
                self.taken.append((started, calibrate(opts, log=lambda line: None)))
                self.seconds.append(time.monotonic() - t0)
            log(f"[calibrate] slice {len(self.taken)} of {self.slices} took {self.seconds[-1]:.0f} s")
        except Exception as e:  # noqa: BLE001 - the sweep goes on; finish() calibrates in a row instead
            self.failed = True
            log(f"[calibrate] slice {len(self.taken) + 1} failed ({type(e).__name__}: {e}); calibrating after "
                f"the runs instead")
