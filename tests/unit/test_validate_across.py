"""`python -m canzona.sim.validate across`: several measured sweeps of the same trials, the
error split into each trial's bias, each sweep's offset and the noise (`canzona.sim.across`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_sim import TINY, _fake_trial, toy_hardware

from canzona.errors import ConfigError
from canzona.sim.across import decompose, render
from canzona.sim.validate import REPORT_HARDWARE, main


def _rows(errors: dict[str, tuple[str, float, float]]) -> list[dict]:
    """Per-trial rows as `per_trial` gives them: trial -> (method, step error %, iteration error %)."""
    return [{"trial": t, "method": m, "dp": 2, "tp": 1, "plan_matches": True,
             "optimizer_step_ms_error_pct": s, "iteration_ms_error_pct": i} for t, (m, s, i) in errors.items()]


def test_bias_offset_and_noise_come_apart() -> None:
    """Four trials with biases +20, -5, 0, +12 (step; the iteration half of it) in three sweeps
    whose machine ran +14, 0 and -14 % against their calibrations, no other noise: the biases and
    offsets come out exactly; raw, every sweep misses; without the biases the middle sweep meets
    the goal and the others miss by their offset; without both, every sweep meets it."""
    bias = {"t1": ("a", 20.0), "t2": ("a", -5.0), "t3": ("b", 0.0), "t4": ("b", 12.0)}
    offsets = (14.0, 0.0, -14.0)
    sweeps = [(f"s{k}", _rows({t: (m, b + o, b / 2 + o) for t, (m, b) in bias.items()})) for k, o in enumerate(offsets)]
    sweeps[2][1].append({"trial": "t5", "method": "a", "dp": 2, "tp": 1, "plan_matches": True,
                         "optimizer_step_ms_error_pct": 1.0, "iteration_ms_error_pct": 1.0})  # in one sweep only
    out = decompose(sweeps)
    got = {t["trial"]: t for t in out["trials"]}
    assert set(got) == set(bias) and out["left_out"] == ["t5"]
    for t, (_, b) in bias.items():
        assert got[t]["bias"]["optimizer_step_ms"] == pytest.approx(b)
        assert got[t]["bias"]["iteration_ms"] == pytest.approx(b / 2)
        assert got[t]["sd"]["optimizer_step_ms"] == pytest.approx(14.0)  # the offsets' own spread
    assert [s["offset"]["optimizer_step_ms"] for s in out["sweeps"]] == pytest.approx(list(offsets))
    assert [s["raw"]["goal_met"] for s in out["sweeps"]] == [False, False, False]
    assert [s["bias_removed"]["goal_met"] for s in out["sweeps"]] == [False, True, False]
    assert [s["bias_and_offset_removed"]["goal_met"] for s in out["sweeps"]] == [True, True, True]
    worst = {m["method"]: m for m in out["sweeps"][0]["raw"]["by_method"]}
    assert worst["a"]["optimizer_step_ms_worst_abs_error_pct"] == pytest.approx(34.0)


def test_a_phase_is_off_where_its_mean_error_is_beyond_twice_its_standard_error() -> None:
    """Three sweeps of two trials, phases in ms (predicted, measured per sweep, each the mean over
    the ranks; the slowest rank's reads 3 ms more): t1's gradient tail is 5 ms short in every
    sweep (sd 1: off, under), its compute right on average; t2's tail is 0.2 ms off at most
    (under `PHASE_MIN_MS`), its compute 2 ms over on average but scattered by 10 ms (within
    twice its standard error: not off); a phase missing from one sweep is left out."""
    measured = {"t1": {"grad_reduce": (8.0, [12.0, 13.0, 14.0]), "compute": (10.0, [9.0, 11.0, 10.0])},
                "t2": {"grad_reduce": (8.0, [8.2, 7.8, 8.0]), "compute": (10.0, [0.0, 20.0, 4.0])}}
    sweeps = []
    for k in range(3):
        rows = _rows({"t1": ("a", 1.0, 1.0), "t2": ("a", 1.0, 1.0)})
        for r in rows:
            r["phases"] = {ph: {"predicted_mean": p, "measured_mean": m[k], "predicted": p, "measured": m[k] + 3.0}
                           for ph, (p, m) in measured[r["trial"]].items()}
            if k == 1:
                r["phases"]["apply"] = {"predicted_mean": 1.0, "measured_mean": 5.0, "predicted": 1.0, "measured": 5.0}
        sweeps.append((f"s{k}", rows))
    out = decompose(sweeps)
    got = {t["trial"]: t["phases"] for t in out["trials"]}
    assert set(got["t1"]) == set(got["t2"]) == {"grad_reduce", "compute"}
    assert got["t1"]["grad_reduce"]["bias_ms"] == pytest.approx(-5.0)
    assert got["t1"]["grad_reduce"]["slowest_bias_ms"] == pytest.approx(-8.0)
    assert got["t1"]["grad_reduce"]["sd_ms"] == pytest.approx(1.0)
    assert got["t1"]["grad_reduce"]["measured_ms"] == pytest.approx(13.0)
    assert [got["t1"]["grad_reduce"]["off"], got["t1"]["compute"]["off"]] == [-1, 0]
    assert got["t2"]["compute"]["bias_ms"] == pytest.approx(2.0)
    assert [got["t2"]["grad_reduce"]["off"], got["t2"]["compute"]["off"]] == [0, 0]
    summary = {p["phase"]: p for p in out["phases"]}
    assert out["phases"][0]["phase"] == "grad_reduce"  # most often off first
    assert (summary["grad_reduce"]["under"], summary["grad_reduce"]["over"], summary["grad_reduce"]["trials"]) == (1, 0, 2)
    assert summary["grad_reduce"]["median_bias_ms"] == pytest.approx(-2.5)
    assert summary["grad_reduce"]["median_slowest_bias_ms"] == pytest.approx(-5.5)
    assert (summary["compute"]["under"], summary["compute"]["over"]) == (0, 0)
    text = "\n".join(render(out))
    assert "grad_reduce  under-predicted on  1, over on  0 of 2 trials (median -2.5 ms [-5.5 ms])" in text
    assert "compute " not in text.split("per phase")[1]  # off on no trial: not listed


def test_a_measured_phase_is_taken_per_step_over_the_ranks_then_the_median_over_steps() -> None:
    """Two ranks that drift apart: the slowest rank's backward and the mean over the ranks differ."""
    import statistics

    from canzona.sim.validate import _measured_phases

    steps = [{"step": s, "measured": s > 0, "rank": r, "backward_ms": b, "grad_reduce_ms": g}
             for s, pairs in enumerate([((99, 0), (99, 0)), ((10, 9), (20, 1)), ((12, 8), (14, 4)), ((10, 5), (10, 5))])
             for r, (b, g) in enumerate(pairs)]
    slowest, mean = _measured_phases(steps), _measured_phases(steps, statistics.fmean)
    assert (slowest["backward"], slowest["grad_reduce"]) == (14, 8)  # medians of 20, 14, 10 and 9, 8, 5
    assert (mean["backward"], mean["grad_reduce"]) == (13, 5)  # of 15, 13, 10 and 5, 6, 5


def test_one_sweep_or_no_common_trial_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least two"):
        decompose([("s0", _rows({"t1": ("a", 1.0, 1.0)}))])
    with pytest.raises(ConfigError, match="same trials"):
        decompose([("s0", _rows({"t1": ("a", 1.0, 1.0)})), ("s1", _rows({"t2": ("a", 1.0, 1.0)}))])


def _sweep(root: Path, factors: dict[str, float]) -> Path:
    """A measured sweep folder of fake trials (measured = projection x factor) whose report kept
    the toy hardware file it was predicted with."""
    for name, f in factors.items():
        _fake_trial(root, name, TINY + ["parallel.dp=2", f"method={name.split('-')[0]}"], f)
    (root / REPORT_HARDWARE).parent.mkdir()
    (root / REPORT_HARDWARE).write_text(yaml.safe_dump(toy_hardware()))
    return root


def test_the_command_reads_each_sweeps_own_hardware(tmp_path: Path, capsys) -> None:
    """Two sweeps of the same two trials: measured 1.25x and 0.8x the prediction in the first,
    1.25x and 1.0x in the second (errors -20/+25 and -20/0 %)."""
    one = _sweep(tmp_path / "one", {"canzona-a": 1.25, "sync-b": 0.8})
    two = _sweep(tmp_path / "two", {"canzona-a": 1.25, "sync-b": 1.0})
    assert main(["across", str(one), str(two), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    bias = {t["trial"]: t["bias"]["optimizer_step_ms"] for t in out["trials"]}
    assert bias == pytest.approx({"canzona-a": -20.0, "sync-b": 12.5})
    assert [s["label"] for s in out["sweeps"]] == [str(one), str(two)]
    assert [s["offset"]["optimizer_step_ms"] for s in out["sweeps"]] == pytest.approx([6.25, -6.25])
    compute = {t["trial"]: t["phases"]["compute"] for t in out["trials"]}  # each run's phases, scaled alike
    assert compute["canzona-a"]["measured_ms"] == pytest.approx(1.25 * compute["canzona-a"]["predicted_ms"])
    assert compute["canzona-a"]["slowest_bias_ms"] == pytest.approx(-0.25 * compute["canzona-a"]["predicted_ms"])
    assert main(["across", str(one), str(two)]) == 0
    text = capsys.readouterr().out
    assert "2 sweeps, 2 trials in all of them" in text and "canzona-a" in text


def test_the_command_refuses_what_it_cannot_compare(tmp_path: Path, capsys) -> None:
    one = _sweep(tmp_path / "one", {"canzona-a": 1.0})
    bare = tmp_path / "bare"
    _fake_trial(bare, "canzona-a", TINY + ["parallel.dp=2", "method=canzona"], 1.0)
    for argv, words in ((["across", str(one)], "at least two sweep folders"),
                        (["across", str(one), str(bare)], "has no report/hardware.yaml"),
                        (["across", str(one), str(tmp_path / "nope")], "is not a folder"),
                        (["across", str(one), str(one), "hardware=h100"], "no key=value")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, (argv, err)
