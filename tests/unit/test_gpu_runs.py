"""The simulator's GPU projections held against this project's own GPU measurements
(validation/gpu_runs/): the spec-derived hardware file must keep predicting them as
docs/results.md says it does."""

from __future__ import annotations

import json

import pytest

from canzona import CHECKOUT
from canzona.hardware import load_hardware
from canzona.sim.validate import compare_sweep

H200_RUN = CHECKOUT / "validation" / "gpu_runs" / "h200-2026-12-04"


@pytest.fixture(scope="module")
def h200_rows() -> dict[str, dict]:
    rows = compare_sweep(H200_RUN, load_hardware("h200"))["trials"]
    return {r["trial_id"]: r for r in rows}


def test_the_records_are_the_gpu_profiles_on_an_h200(h200_rows) -> None:
    assert len(h200_rows) == 8
    for trial in h200_rows:
        summary = json.loads((H200_RUN / trial / "summary.json").read_text())
        assert "H200" in summary["device_name"] and summary["world"]["world_size"] == 1
        cfg = summary["config"]
        assert (cfg["train"]["seq_len"], cfg["train"]["micro_batch"], cfg["dist"]["device"]) == (4096, 1, "cuda")
        assert h200_rows[trial]["plan_matches"] is True


def test_spec_h200_predicts_a_busy_gpu_within_a_quarter(h200_rows) -> None:
    """At 8B width (4096 tokens) the GPU is busy: the spec-derived file is within 25 % on every
    Muon trial's step and iteration and on AdamW's iteration (measured: +10 to +20 %). AdamW's
    step (+34 %, memory bandwidth at its datasheet value) and the launch-bound 0.6B trials (−40 to
    −65 %: gVisor's launches) are outside it, as docs/results.md records."""
    busy = {t: r for t, r in h200_rows.items() if t.startswith("8b-")}
    assert len(busy) == 4
    for trial, r in busy.items():
        assert abs(r["iteration_ms_error_pct"]) <= 25.0, trial
        if r["method"] != "adamw":
            assert abs(r["optimizer_step_ms_error_pct"]) <= 25.0, trial
    launch_bound = [r for t, r in h200_rows.items() if t.startswith("0.6b-") and r["method"] != "adamw"]
    assert all(r["optimizer_step_ms_error_pct"] < -25.0 for r in launch_bound)


CALIBRATED_RUN = CHECKOUT / "validation" / "gpu_runs" / "h200-2026-12-04b"


@pytest.fixture(scope="module")
def calibrated_rows() -> dict[str, dict]:
    hw = load_hardware(str(CALIBRATED_RUN / "h200-calibrated.yaml"))
    return {r["trial_id"]: r for r in compare_sweep(CALIBRATED_RUN, hw)["trials"]}


def test_the_gpus_own_calibration_predicts_its_trials(calibrated_rows) -> None:
    """The second H200 session's records with the calibration `scripts/gpu_check.sh` took on that
    GPU just before (bf16 passes at the profile's 4096 tokens, bf16 Newton-Schulz): every
    iteration within 16 % (measured +1 to +15 %) and every Muon step within 15 % (-14 to +9 %),
    at 0.6B as at 8B width. AdamW's step is +36 / +53 %: that calibration timed an extra pass
    over the second moment inside AdamW's call and priced the clip's scaling on steps that did
    not scale (docs/results.md)."""
    assert len(calibrated_rows) == 8
    for trial, r in calibrated_rows.items():
        assert r["plan_matches"] is True, trial
        assert abs(r["iteration_ms_error_pct"]) <= 16.0, trial
        if r["method"] != "adamw":
            assert abs(r["optimizer_step_ms_error_pct"]) <= 15.0, trial
