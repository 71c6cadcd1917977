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
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

LOCK_TIMEOUT_S = 900.0
REPEATS = 3


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


def machine_hardware(threads: int = 1, log: Callable[[str], Any] = print) -> Path:
    """The path of this machine's CPU hardware file for ``threads`` torch threads per rank,
    calibrated now if there is none yet (or it predates a number the simulator reads)."""
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
        opts = parse_args([f"out={path}", "device=cpu", f"threads={threads}", "name=local", f"repeats={REPEATS}"])
        write_hardware(calibrate(opts, log=lambda line: log(f"[calibrate] {line.strip()}")), path)
    return path
