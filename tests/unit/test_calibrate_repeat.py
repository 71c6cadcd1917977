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


def test_a_links_single_readings_are_their_own_medians() -> None:
    """Beside the latency fit, a link holds the per-call CPU fit (picked whole by its own
    reference case) and single readings (the one-element all-reduce), each its own median: one
    calibration's odd 1.6 ms one-element reading must not ride along with its latency fit."""
    runs = [_cal(1e-9, 6e-4, 1e9, 5e-3, 1e11, 1e-3) for _ in range(3)]
    for run, (one, cpu, slope, lat) in zip(runs, ((5.55e-4, 9e-4, 5e-10, 9e-4), (6.35e-4, 7e-4, 9e-10, 6e-4),
                                                  (1.605e-3, 8e-4, 1e-9, 7e-4))):
        run["collectives"]["intra"]["all_reduce"].update(
            latency_s=lat, step_latency_s=lat, one_element_s=one, call_cpu_s=cpu, call_cpu_s_per_byte=slope)
    link = median_of(runs)["collectives"]["intra"]["all_reduce"]
    # latency at 1 MB: 1.9, 1.6, 1.7 ms -> the third calibration's latency fit, whole
    assert (link["latency_s"], link["step_latency_s"], link["bandwidth_Bps"]) == (7e-4, 7e-4, 1e9)
    assert link["one_element_s"] == 6.35e-4  # not the third's 1.605 ms
    # per-call CPU at 1 MB: 1.4, 1.6, 1.8 ms -> the second calibration's fit, whole
    assert (link["call_cpu_s"], link["call_cpu_s_per_byte"]) == (7e-4, 9e-10)


def test_the_spread_reports_each_headline_numbers_range() -> None:
    runs = [_cal(0.67e-9, 6e-4, 1e9, 5e-3, 1e11, 0.4e-3), _cal(1.05e-9, 13e-4, 1e9, 5e-3, 1e11, 1.66e-3)]
    s = spread(runs)
    assert s["adamw_ns_per_element"] == [0.67, 1.05]
    assert s["sched_wait_ms"] == [0.4, 1.66]
    assert s["all_reduce_latency_us"] == [600.0, 1300.0]
    assert "overlap" not in s and "sweep_model_forward_ms" not in s  # not in these files: left out


def test_the_spread_reports_the_overlap_and_the_sweep_models_timed_passes() -> None:
    """The numbers a sweep's model passes are priced from, per calibration: its slices' range
    shows how far the machine moved under them."""
    def cal(overlap: float, fwd: float, bwd: float) -> dict:
        points = [{"model": "qwen3-0.6b", "width_div": 8, "layers": 2, "micro_batch": 1, "seq_len": 32,
                   "forward_s": 1.0, "backward_s": 1.0},
                  {"model": "qwen3-0.6b", "width_div": 8, "layers": 4, "micro_batch": 1, "seq_len": 32,
                   "forward_s": fwd, "backward_s": bwd}]
        return {"compute": {"overlap": overlap, "grad_reduce_overlap": overlap / 4}, "model": {"points": points}}

    s = spread([cal(0.28, 0.0189, 0.0255), cal(0.32, 0.0264, 0.0306)])
    assert s["overlap"] == [0.28, 0.32] and s["grad_reduce_overlap"] == [0.07, 0.08]
    assert s["sweep_model_forward_ms"] == [18.9, 26.4] and s["sweep_model_backward_ms"] == [25.5, 30.6]


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
        "repeats": 3, "spread": {"adamw_ns_per_element": [0.62, 1.09]}, "sliced": False}
    data["calibration"]["slices"] = {"before_run": [0, 20, 40, 60, 80], "of_runs": 80}
    assert load_hardware(data).describe()["calibration_spread"]["sliced"] is True
