"""The six fresh-clone runs of the README's first command on the 2-core development VM
(validation/cpu_runs/), set side by side by `python -m canzona.sim.validate across`: the
decomposition docs/results.md records (§ Predicted against measured, "Six fresh clones side by
side") must still hold. When the simulator changes these predictions, update that paragraph
with this test."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from canzona import CHECKOUT
from canzona.sim.across import decompose
from canzona.sim.validate import REPORT_HARDWARE, compare_sweep

pytestmark = pytest.mark.slow  # six sweeps of 80 runs priced: about 30 s
RUNS = CHECKOUT / "validation" / "cpu_runs"
ORDER = ("5d4d695", "e715d84", "753b23a", "641a3f0-a", "641a3f0-b", "466175a")  # as they ran


@pytest.fixture(scope="module")
def across(tmp_path_factory) -> dict:
    """The decomposition, each trial re-planned with the kernel timings its run planned with
    (validation/cpu_runs/planner_costs.yaml, the VM's planner cache, filed here under this
    machine's name): on another CPU its own timings could deal canzona's matrices otherwise, and
    such a trial is left out as planned differently."""
    from canzona.calibrate.cache import ENV, this_device

    cache = tmp_path_factory.mktemp("planner-cache")
    costs = yaml.safe_load((RUNS / "planner_costs.yaml").read_text())
    for threads in range(1, (os.cpu_count() or 1) + 1):  # as many as a rank of these trials takes here
        ident = this_device("cpu", threads)
        (cache / ident.file_name()).write_text(yaml.safe_dump({**costs, "identity": ident.as_dict()}, sort_keys=False))
    dirs = [RUNS / f"readme-sweep-{name}" for name in ORDER]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, str(cache))
        return decompose([(d.name, compare_sweep(d, d / REPORT_HARDWARE)["per_trial"]["trials"]) for d in dirs])


def test_the_records_are_the_readme_sweep_on_two_cores() -> None:
    for name in ORDER:
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
