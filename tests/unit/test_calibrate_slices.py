"""This machine's calibration taken in slices between a sweep's runs (`SweepCalibration`): the
schedule, reuse of a calibration already there, and the setting's bad values. The slices of a
real sweep: tests/e2e/test_sweep_local.py::test_a_sweep_calibrates_in_slices_between_its_runs."""

from __future__ import annotations

import pytest
import yaml

from canzona.errors import ConfigError


def test_slices_are_spread_evenly_over_the_runs() -> None:
    from canzona.calibrate.machine import slice_schedule

    assert slice_schedule(80, 5) == [0, 20, 40, 60]  # and the fifth after the 80th run
    assert slice_schedule(2, 2) == [0]
    assert slice_schedule(7, 1) == []  # one slice: after the runs
    assert slice_schedule(3, 5) == [0, 1, 2, 3]  # due at the end (3): taken after the runs
    with pytest.raises(ValueError, match="slices=0"):
        slice_schedule(4, 0)


def test_a_machine_with_a_calibration_takes_no_slice(tmp_path, monkeypatch) -> None:
    from canzona.calibrate import machine
    from canzona.calibrate.build import CALIBRATION_FORMAT
    from canzona.calibrate.cache import ENV

    monkeypatch.setenv(ENV, str(tmp_path))
    path = machine.machine_hardware_path(1)
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"calibration": {"format": CALIBRATION_FORMAT}}))
    lines: list[str] = []
    cal = machine.SweepCalibration(1, runs=4, slices=3)
    cal.between(0, lines.append)
    cal.between(2, lines.append)
    assert cal.taken == [] and lines == []
    assert cal.finish(lines.append) == path
    assert lines == [f"[calibrate] reused this machine's calibration: {path}"]


def test_calibrate_slices_below_one_is_refused_in_one_line() -> None:
    from canzona.sweep.expand import expand_sweep

    with pytest.raises(ConfigError, match=r"sim.calibrate_slices=0 is not allowed; it must be >= 1"):
        expand_sweep(["sweep=qwen3_scaling", "sim.calibrate_slices=0"])
