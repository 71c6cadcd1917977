"""The fresh-clone runs of the README's first command on the 2-core development VMs
(validation/cpu_runs/), set side by side by `python -m canzona.sim.validate across`: the
decompositions docs/results.md records (§ Predicted against measured, "Six fresh clones side by
side" and "Two more fresh clones, on a faster machine") must still hold. When the simulator
changes these predictions, update those paragraphs with this test."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from canzona import CHECKOUT
from canzona.sim.across import decompose
from canzona.sim.validate import REPORT_HARDWARE, compare_sweep

pytestmark = pytest.mark.slow  # eight sweeps of 80 runs priced: about 40 s
RUNS = CHECKOUT / "validation" / "cpu_runs"
ORDER = ("5d4d695", "e715d84", "753b23a", "641a3f0-a", "641a3f0-b", "466175a")  # sessions 7-9, as they ran
LATER = ("155c792", "66f424d")  # the eleventh session's, on a faster machine of the same kind


@pytest.fixture(scope="module")
def priced(tmp_path_factory) -> dict[str, list[dict]]:
    """Each sweep's per-trial rows, each trial re-planned with the kernel timings its run planned
    with (validation/cpu_runs/planner_costs.yaml, the VM's planner cache, filed here under this
    machine's name): on another CPU its own timings could deal canzona's matrices otherwise, and
    such a trial is left out as planned differently."""
    from canzona.calibrate.cache import ENV, this_device

    cache = tmp_path_factory.mktemp("planner-cache")
    costs = yaml.safe_load((RUNS / "planner_costs.yaml").read_text())
    for threads in range(1, (os.cpu_count() or 1) + 1):  # as many as a rank of these trials takes here
        ident = this_device("cpu", threads)
        (cache / ident.file_name()).write_text(yaml.safe_dump({**costs, "identity": ident.as_dict()}, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, str(cache))
        return {name: compare_sweep(RUNS / f"readme-sweep-{name}", RUNS / f"readme-sweep-{name}" / REPORT_HARDWARE)
                ["per_trial"]["trials"] for name in (*ORDER, *LATER)}


@pytest.fixture(scope="module")
def across(priced) -> dict:
    return decompose([(f"readme-sweep-{name}", priced[name]) for name in ORDER])


@pytest.fixture(scope="module")
def across_all(priced) -> dict:
    return decompose([(f"readme-sweep-{name}", priced[name]) for name in (*ORDER, *LATER)])


def test_the_records_are_the_readme_sweep_on_two_cores() -> None:
    for name in (*ORDER, *LATER):
        trials = [d for d in (RUNS / f"readme-sweep-{name}").iterdir() if (d / "summary.json").is_file()]
        assert len(trials) == 80, name  # 16 trials x 5 runs
        summary = json.loads(trials[0].joinpath("summary.json").read_text())
        assert summary["versions"]["git"] == name.split("-")[0] and summary["config"]["dist"]["device"] == "cpu"


def test_no_unbiased_simulator_meets_the_goal_reliably_on_this_vm(across) -> None:
    """Raw, no run meets the goal; with every trial's six-run mean error taken out, three of six
    do; with each run's offset taken out too, five."""
    sweeps = {s["label"]: s for s in across["sweeps"]}
    assert len(across["trials"]) == 16 and not across["left_out"]
    assert [sweeps[f"readme-sweep-{n}"]["raw"]["goal_met"] for n in ORDER] == [False] * 6
    assert [sweeps[f"readme-sweep-{n}"]["bias_removed"]["goal_met"] for n in ORDER] == [
        False, True, False, True, True, False]
    assert [sweeps[f"readme-sweep-{n}"]["bias_and_offset_removed"]["goal_met"] for n in ORDER] == [
        True, True, True, False, True, True]
    # a trial's error moves about 9 % from one run to the next
    assert 8.0 <= across["median_sd"]["optimizer_step_ms"] <= 10.0
    assert 8.5 <= across["median_sd"]["iteration_ms"] <= 10.5
    offsets = [s["offset"]["optimizer_step_ms"] for s in across["sweeps"]]
    assert min(offsets) < -8.0 and max(offsets) > 10.0


def test_the_largest_biases_are_the_documented_ones(across) -> None:
    """The step's largest six-run mean errors: canzona and sync at 0.6B dp 2 x tp 1, AdamW at
    0.6B dp 2 x tp 2 and canzona at 8B dp 2 x tp 2, each about -10 to -12 %; every other trial
    within 7.1 %; on average the step is under-predicted by 5 %."""
    bias = {t["trial"].rsplit("-", 1)[0]: t["bias"]["optimizer_step_ms"] for t in across["trials"]}
    large = {t for t, b in bias.items() if abs(b) > 7.2}
    assert large == {"0.6b-canzona-muon-dp2tp1", "0.6b-sync-muon-dp2tp1", "0.6b-adamw-adamw-dp2tp2",
                     "8b-canzona-muon-dp2tp2"}
    assert all(-12.0 <= bias[t] <= -10.0 for t in large)
    assert sum(bias.values()) / len(bias) == pytest.approx(-5.0, abs=0.1)


def _goal_by_method(rows: list[dict]) -> dict[str, tuple[bool, bool]]:
    """Per method, whether the optimizer step and the iteration each meet the goal (raw)."""
    from canzona.sim.goal import GOAL, HEADLINE, error_stats

    out = {}
    for m in sorted({r["method"] for r in rows}):
        stats = error_stats([r for r in rows if r["method"] == m], HEADLINE)
        out[m] = tuple(stats[f"{h}_median_abs_error_pct"] <= GOAL["median_abs_error_pct"]
                       and stats[f"{h}_worst_abs_error_pct"] <= GOAL["worst_abs_error_pct"] for h in HEADLINE)
    return out


def test_the_faster_machines_runs_meet_the_goal_in_part(priced) -> None:
    """The eleventh session's two fresh clones: at 155c792 every method's iteration met the goal
    and the step of layerwise and sync; at 66f424d the step of canzona, layerwise and sync, the
    iteration of AdamW and sync. AdamW's step missed on both."""
    assert _goal_by_method(priced["155c792"]) == {
        "adamw": (False, True), "canzona": (False, True), "layerwise": (True, True), "sync": (True, True)}
    assert _goal_by_method(priced["66f424d"]) == {
        "adamw": (False, True), "canzona": (True, False), "layerwise": (True, False), "sync": (True, True)}


def test_eight_runs_bound_and_what_the_phases_say(across_all) -> None:
    """All eight side by side: still no run meets the goal raw, and a simulator without any
    bias would meet it on three of eight. Per phase, against the slowest rank's phase (as the
    summaries take it) the gradient reductions' tail is under-predicted on every trial by about
    9 ms and the backward by about 6: the ranks' drift, counted twice. Against the mean over the
    ranks the backward is right (median within 1 ms), the tail short by about 3 ms, and the
    parameter sync the phase most over-predicted (the gathers' CPU charged at their issue)."""
    sweeps = across_all["sweeps"]
    assert len(across_all["trials"]) == 16 and not across_all["left_out"]
    assert not any(s["raw"]["goal_met"] for s in sweeps)
    assert sum(s["bias_removed"]["goal_met"] for s in sweeps) == 3
    phases = {p["phase"]: p for p in across_all["phases"]}
    slowest_tail = [t["phases"]["grad_reduce"]["slowest_bias_ms"] for t in across_all["trials"]]
    assert all(b < -3.0 for b in slowest_tail) and -11.0 <= phases["grad_reduce"]["median_slowest_bias_ms"] <= -7.0
    assert phases["backward"]["median_slowest_bias_ms"] < -4.0 and abs(phases["backward"]["median_bias_ms"]) < 1.0
    assert phases["grad_reduce"]["over"] == 0 and phases["grad_reduce"]["under"] >= 10
    assert -4.0 <= phases["grad_reduce"]["median_bias_ms"] <= -1.5
    assert (phases["param_sync"]["under"], phases["param_sync"]["over"]) == (0, 11)
    assert 3.0 <= phases["param_sync"]["median_bias_ms"] <= 7.0
