"""Several calibrations as one (canzona.calibrate.repeat): each number the median of the
measured values, fitted blocks whole."""

from __future__ import annotations

import pytest

from canzona.calibrate.repeat import median_of, spread
from canzona.calibrate.settings import parse_args
from canzona.errors import ConfigError


def _cal(adamw: float, latency: float, bandwidth: float, fixed: float, rate: float, wait: float) -> dict:
    return {
        "name": "local", "adamw_seconds_per_element": adamw,
        "compute": {"sched_wait_s": wait, "peer_wait": [[3e-4, wait], [1e-3, 2 * wait]], "coalesces": False},
        "collectives": {"intra": {"all_reduce": {"latency_s": latency, "step_latency_s": latency, "bandwidth_Bps": bandwidth}}},
        "model": {"dtype": "bfloat16", "forward": {"fixed_s": fixed, "layer_s": 1e-3, "flops_per_s": rate}},
        "updates": {"muon": {"128x128": adamw * 10}},
    }


def test_each_number_is_the_median_of_the_measured_values() -> None:
    runs = [_cal(1.0e-9, 6e-4, 1e9, 5e-3, 1e11, 1e-3), _cal(0.67e-9, 13e-4, 1e9, 5e-3, 1e11, 0.4e-3),
            _cal(1.05e-9, 7e-4, 1e9, 5e-3, 1e11, 1.66e-3)]
    out = median_of(runs)
    assert out["adamw_seconds_per_element"] == 1.0e-9  # the odd reading (0.67) kept out
    assert out["compute"]["sched_wait_s"] == 1e-3
    assert out["compute"]["peer_wait"] == [[3e-4, 1e-3], [1e-3, 2e-3]]
    assert out["updates"]["muon"]["128x128"] == 1.0e-8
    assert out["compute"]["coalesces"] is False and out["name"] == "local"


def test_a_fitted_block_is_kept_whole_from_the_median_calibration() -> None:
    """A link's latency and bandwidth (a pass's coefficients) come from one fit: the one whose
    reference case is the median, never a mix of two fits."""
    runs = [_cal(1e-9, 2e-4, 0.5e9, 1e-3, 1e11, 1e-3), _cal(1e-9, 9e-4, 4e9, 9e-3, 1e13, 1e-3),
            _cal(1e-9, 6e-4, 1e9, 5e-3, 1e11, 1e-3)]
    out = median_of(runs)
    link = out["collectives"]["intra"]["all_reduce"]
    # reference 1 MB: 2.2 ms, 1.15 ms, 1.6 ms -> the third calibration's link, whole
    assert link == runs[2]["collectives"]["intra"]["all_reduce"]
    # reference pass: 1e-3 + 4e-3 + 2e-3 = 7 ms, 9e-3 + 4e-3 + 2e-5 = 13 ms, 5e-3 + 4e-3 + 2e-3 = 11 ms
    assert out["model"]["forward"] == runs[2]["model"]["forward"]


def test_the_spread_reports_each_headline_numbers_range() -> None:
    runs = [_cal(0.67e-9, 6e-4, 1e9, 5e-3, 1e11, 0.4e-3), _cal(1.05e-9, 13e-4, 1e9, 5e-3, 1e11, 1.66e-3)]
    s = spread(runs)
    assert s["adamw_ns_per_element"] == [0.67, 1.05]
    assert s["sched_wait_ms"] == [0.4, 1.66]
    assert s["all_reduce_latency_us"] == [600.0, 1300.0]


def test_repeats_must_be_positive() -> None:
    assert parse_args(["out=x.yaml"]).repeats == 1
    assert parse_args(["out=x.yaml", "repeats=3"]).repeats == 3
    with pytest.raises(ConfigError, match="repeats=0 must be >= 1"):
        parse_args(["out=x.yaml", "repeats=0"])


def test_a_median_files_spread_is_described_for_the_report() -> None:
    """The report's CPU-sharing note says the file is the median of N calibrations and how far
    they spread (`Hardware.describe`'s ``calibration_spread``); a single calibration says nothing."""
    import yaml

    from canzona.hardware import load_hardware

    data = yaml.safe_load(open(load_hardware("h100").path).read())
    data["device"] = {**data["device"], "kind": "cpu", "cores": 2, "threads": 1}
    assert "calibration_spread" not in load_hardware(data).describe()
    data["calibration"] = {"format": 10, "repeats": 3, "spread": {"adamw_ns_per_element": [0.62, 1.09]}}
    assert load_hardware(data).describe()["calibration_spread"] == {
        "repeats": 3, "spread": {"adamw_ns_per_element": [0.62, 1.09]}}
