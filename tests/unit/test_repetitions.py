"""Repetitions in the analysis: runs of one config are pooled, and repetitions that ran side by
side (the sweep's interleaved order) are resampled together, so load drift between repetitions
cancels in a speedup instead of widening its interval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis import stats
from analysis.load import load_sweep

DRIFT = {1: 0.6, 2: 1.0, 3: 1.7}  # the machine's speed in each repetition (slow, normal, loaded)


def _drifted_sweep(gen, root: Path, *, record_repeats: bool = True) -> Path:
    """canzona and sync, 3 repetitions each; every millisecond of repetition k scaled by DRIFT[k]
    on both methods alike (as load drift would), status.json naming config and repetition.
    ``gen``: the synthetic-records module (the ``records_gen`` fixture)."""
    for method in ("canzona", "sync"):
        cfg = gen.trial_config(method, "qwen3-0.6b", 2, 2, steps=8, warmup=1)
        tid = f"0.6b-{method}-muon-dp2tp2-0123456789"
        for rep, f in DRIFT.items():
            d = gen.write_trial(root / (tid if rep == 1 else f"{tid}-r{rep}"), cfg)
            rows = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines()]
            for r in rows:
                for k in list(r):
                    if k.endswith("_ms") and r[k] is not None:  # null: not recorded
                        r[k] *= f
            (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            status = json.loads((d / "status.json").read_text())
            if record_repeats:
                status.update(trial_id=tid, repeat=rep, repeats=len(DRIFT))
            (d / "status.json").write_text(json.dumps(status))
    return root


def _tables(root: Path):
    sweep = load_sweep(root)
    per_step = stats.step_values(sweep.steps_df)
    trials = stats.trial_table(sweep, per_step)
    return trials, per_step


def test_repetitions_pool_into_one_group_and_pair(records_gen, tmp_path):
    trials, per_step = _tables(_drifted_sweep(records_gen, tmp_path / "paired"))
    assert sorted(trials["repeat"]) == [1, 1, 2, 2, 3, 3]
    assert trials["config_id"].nunique() == 2
    groups = stats.group_table(trials, per_step)
    assert list(groups["n_trials"]) == [3, 3] and list(groups["n_configs"]) == [1, 1]
    sp = stats.speedup_table(trials, per_step)
    row = sp[(sp["baseline"] == "sync") & (sp["metric"] == "optimizer_step_ms")].iloc[0]
    assert bool(row["paired"]) and row["n_trials_canzona"] == 3 and row["n_steps_canzona"] == 3 * 7
    paired_hw = (row["ci_high"] - row["ci_low"]) / 2 / row["value"]

    # the same records without the repetition numbers: each run is its own config, so the
    # repetitions are resampled independently and the drift shows up in the interval
    trials_u, per_step_u = _tables(_drifted_sweep(records_gen, tmp_path / "unpaired", record_repeats=False))
    sp_u = stats.speedup_table(trials_u, per_step_u)
    row_u = sp_u[(sp_u["baseline"] == "sync") & (sp_u["metric"] == "optimizer_step_ms")].iloc[0]
    assert not bool(row_u["paired"]) and row_u["value"] == row["value"]  # same pooled medians
    unpaired_hw = (row_u["ci_high"] - row_u["ci_low"]) / 2 / row_u["value"]
    assert paired_hw < 0.5 * unpaired_hw, (paired_hw, unpaired_hw)
    assert row["ci_low"] <= row["value"] <= row["ci_high"]


def test_paired_resampling_cancels_a_common_drift():
    rng = np.random.default_rng(0)
    den, num = [], []  # canzona (den) 100 ms, sync (num) 300 ms, times the repetition's drift
    for f in DRIFT.values():
        den.append(100 * f * rng.lognormal(0, 0.02, 6))
        num.append(300 * f * rng.lognormal(0, 0.02, 6))
    value, lo, hi = stats.ratio_with_ci(num, den, paired=True)
    assert lo <= value <= hi and 2.8 < lo and hi < 3.2
    _, lo_u, hi_u = stats.ratio_with_ci(num, den)
    assert hi_u - lo_u > 3 * (hi - lo)
