"""Predicted vs measured: run the simulator on recorded trials and report the error.

- `compare(trial_dir, hardware)`: one trial folder (config.yaml, summary.json, steps.jsonl).
- `compare_sweep(sweep_dir, hardware)`: every finished trial under a folder, plus the median
  absolute % error and the worst case per method and overall.
- CLI: ``python -m canzona.sim.validate DIR [hardware=hardware/local.yaml] [--json]`` (unknown
  keys or flags: one line, exit 2); ``python -m canzona.sim.validate published [--json]``: every
  published GPU measurement of ``validation/published_points.yaml`` projected beside its
  measured value (`canzona.sim.published`); ``python -m canzona.sim.validate across DIR DIR
  [...]``: several sweeps of the same trials, each priced with its report's copy of its hardware
  file, the error split into each trial's bias, each sweep's offset and the noise
  (`canzona.sim.across`).

Measured values are the trial's own aggregates: per measured step the max over ranks, then the
median over steps (``summary.json``'s ``*_median``; phases from ``steps.jsonl`` the same way).
Errors are signed ``100·(predicted − measured) / measured``.

A shared machine is faster or slower at trial time than at calibration time. Besides the raw
error each row therefore carries a *load-adjusted* one: the prediction times the trial's
``load_factor`` = measured ÷ predicted forward + backward (the model's work is the same for
every method, so this factor measures the machine, not the method). The raw error says how far
to trust an absolute projection; the adjusted one how far to trust the simulator's structure
(balance, communication, overlap), which is what carries over to other hardware.

Each run's *speed-adjusted* prediction scales it by its own speed probe (`canzona.calibrate.probe`;
`speed_factor`: every core busy at once where the calibration and the run both recorded that);
the sweep's one *speed factor* (`sweep_speed_factor`: the median of its runs' probe ratios)
scales every prediction alike -- the calibration brought to the machine's speed while the
sweep ran, which no run's noise decides. What is left at the sweep's speed is the simulator's
error by method and layout; what the raw error adds is the machine's drift since calibrating.

The simulator re-plans each trial from its config with today's planner. When the recorded plan
(micro-group counts, memory imbalance in summary.json) differs -- the planner or cost model
changed since the trial ran -- the row says ``plan_matches: False`` and the summaries leave it
out (``excluded``): its prediction is of a different plan.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from canzona.cli import run_command, usage
from canzona.config import load_config, read_config
from canzona.errors import ConfigError
from canzona.hardware import Hardware, load_hardware
from canzona.overrides import Renamed, build, split_argv
from canzona.records import (
    CONFIG_FILE,
    PHASES,
    STATUS_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    read_jsonl,
    read_summary,
)
from canzona.schema_doc import setting
from canzona.sim.goal import GOAL, HEADLINE, error_stats, meets_goal
from canzona.sim.simulate import project

METRICS = ("optimizer_step_ms", "iteration_ms", "param_sync_ms", "grad_reduce_ms")
ADJUSTED = ("optimizer_step_ms",)
MIN_MEASURED_MS = 0.5  # below this a relative error means nothing (an empty phase)


def _measured_phases(steps: list[dict[str, Any]], over_ranks: Any = max) -> dict[str, float]:
    """Per phase, the median over the measured steps of ``over_ranks`` (the slowest rank, as the
    records' summaries take it, or e.g. `statistics.fmean`) of the ranks' milliseconds."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in steps:
        if r.get("measured"):
            by_step.setdefault(r["step"], []).append(r)
    out = {}
    for p in PHASES:
        vals = [over_ranks([float(r.get(f"{p}_ms") or 0.0) for r in rows]) for rows in by_step.values()]
        if vals:
            out[p] = statistics.median(vals)
    return out


def _error(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas < MIN_MEASURED_MS:
        return None
    return 100.0 * (pred - meas) / meas


def _same_plan(recorded: dict[str, Any], planned: dict[str, Any]) -> bool | None:
    """Whether the trial's recorded plan is today's: same micro-group counts and the same memory
    imbalance (elements owned per rank: independent of the cost model's units). None: nothing
    recorded to compare."""
    groups = recorded.get("micro_groups")
    mem = (recorded.get("imbalance") or {}).get("memory")
    if groups is None and mem is None:
        return None
    if groups is not None and list(groups) != list(planned["micro_groups"]):
        return False
    return mem is None or abs(mem - planned["imbalance"]["memory"]) <= 1e-6 * max(1.0, abs(mem))


# a plan's execution dtype, as ``train.dtype`` names it
_TRAIN_DTYPE = {"bfloat16": "bf16", "float32": "fp32"}


def _in_the_dtype_it_ran(raw: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """The trial's config with ``train.dtype=auto`` pinned to the dtype its run resolved it to
    (summary.json's ``plan.execution.dtype``): ``auto`` follows the machine (bf16 on a CPU with
    native bf16, fp32 otherwise), and a trial is priced as it ran, whichever machine validates it."""
    ran = _TRAIN_DTYPE.get(((summary.get("plan") or {}).get("execution") or {}).get("dtype"))
    train = raw.get("train") or {}
    if ran is None or train.get("dtype", "auto") != "auto":
        return raw
    return {**raw, "train": {**train, "dtype": ran}}


def compare(trial_dir: str | Path, hardware: Any, projections: dict[str, Any] | None = None) -> dict[str, Any]:
    """Predicted vs measured for one recorded trial (records of any age); a flat row (plus
    ``phases``). ``projections``: predictions already made, by config (the repetitions of a
    trial share one: a projection is deterministic)."""
    trial_dir = Path(trial_dir)
    hw = load_hardware(hardware)
    raw = read_config(yaml.safe_load((trial_dir / CONFIG_FILE).read_text()))
    raw.pop("out", None)
    summary = read_summary(json.loads((trial_dir / SUMMARY_FILE).read_text()))
    cfg = load_config(base=_in_the_dtype_it_ran(raw, summary))
    steps = read_jsonl(trial_dir / STEPS_FILE) if (trial_dir / STEPS_FILE).exists() else []
    key = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    pred = (projections or {}).get(key)
    if pred is None:
        pred = project(cfg, hw, events="none")
        if projections is not None:
            projections[key] = pred
    rec = summary.get("plan") or {}
    status = json.loads((trial_dir / STATUS_FILE).read_text()) if (trial_dir / STATUS_FILE).exists() else {}
    row: dict[str, Any] = {
        # the trial a run repeats (status.json's trial_id; a folder without one is its own trial)
        "trial": trial_dir.name, "trial_id": status.get("trial_id") or trial_dir.name, "method": cfg.method.label, "optimizer": cfg.optimizer.name,
        "model": cfg.model_cfg().name, "dp": cfg.parallel.dp, "tp": cfg.parallel.tp,
        "dp_collective": cfg.dist.dp_collective, "hardware": hw.name,
        "plan_matches": _same_plan(rec, pred["plan"]),
    }
    for m in METRICS:
        meas = summary.get(f"{m}_median")
        p = pred[m]
        row[f"{m}_predicted"] = p
        row[f"{m}_measured"] = meas
        row[f"{m}_error_pct"] = _error(p, meas)
    measured_phases = _measured_phases(steps)
    model_pred = pred["phases_ms"]["forward"] + pred["phases_ms"]["backward"]
    model_meas = (measured_phases.get("forward") or 0.0) + (measured_phases.get("backward") or 0.0)
    row["load_factor"] = model_meas / model_pred if model_pred > 0 and model_meas > 0 else None
    for m in ADJUSTED:
        adj = row[f"{m}_predicted"] * row["load_factor"] if row["load_factor"] else None
        row[f"{m}_adjusted"] = adj
        row[f"{m}_adjusted_error_pct"] = _error(adj, row[f"{m}_measured"])
    # the machine's drift since the calibration (`canzona.calibrate.probe`): what of the error it explains
    row["speed_probe"], row["speed_factor"] = speed_factor(hw.raw.get("calibration") or {}, summary)
    for m in HEADLINE:
        adj = row[f"{m}_predicted"] * row["speed_factor"] if row["speed_factor"] else None
        row[f"{m}_speed_adjusted"] = adj
        row[f"{m}_speed_adjusted_error_pct"] = _error(adj, row[f"{m}_measured"])
    # each phase as the summaries take it (the slowest rank's) and as the mean over the ranks: the
    # simulator's ranks run in lockstep, so ranks that drift apart within an iteration lengthen
    # one rank's phase and another's wait, and only the mean compares like with like
    # (docs/results.md, "the gradient reductions' tail is the ranks' drift")
    measured_means = _measured_phases(steps, statistics.fmean)
    row["phases"] = {
        ph: {"predicted": pred["phases_ms"][ph], "measured": measured_phases.get(ph),
             "error_pct": _error(pred["phases_ms"][ph], measured_phases.get(ph)),
             "predicted_mean": pred["phases_ms_mean"][ph], "measured_mean": measured_means.get(ph)}
        for ph in PHASES if ph in measured_phases or pred["phases_ms"][ph] > 0
    }
    row["assumptions"] = pred["assumptions"]
    return row


def _projected(summary_path: Path) -> bool:
    try:
        return json.loads(summary_path.read_text()).get("projected") is True
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def trial_dirs(sweep_dir: str | Path) -> list[Path]:
    """Finished measured trials under a folder (any depth): folders holding summary.json and
    config.yaml whose status.json, if any, says done; projections (``projected: true``, written
    by `write_trial`) are not measurements and are left out."""
    out = []
    for s in sorted(Path(sweep_dir).rglob(SUMMARY_FILE)):
        d = s.parent
        if not (d / CONFIG_FILE).exists() or _projected(s):
            continue
        status = d / STATUS_FILE
        if status.exists():
            try:
                if json.loads(status.read_text()).get("status") != "done":
                    continue
            except (OSError, json.JSONDecodeError):
                continue
        out.append(d)
    return out


# the probes a calibration and a trial may both record, the loaded machine's first
SPEED_PROBES = ("speed_probe_all_cores_flops_per_s", "speed_probe_flops_per_s")


def speed_factor(calibration: dict[str, Any], summary: dict[str, Any]) -> tuple[str | None, float | None]:
    """(which probe, calibration's ÷ trial's) for the first of `SPEED_PROBES` both recorded: every
    core busy (`canzona.calibrate.probe.throughput_probe`) where both have it, else one thread's
    rate with the other cores idle (files and records from before the loaded probe)."""
    for key in SPEED_PROBES:
        if calibration.get(key) and summary.get(key):
            return key, calibration[key] / summary[key]
    return None, None


def sweep_speed_factor(rows: list[dict[str, Any]]) -> float | None:
    """The median of the runs' speed factors (calibration probe ÷ run probe, `compare`): how much
    slower (> 1) or faster the machine ran through the sweep than when it was calibrated, one
    number for every run. None when no run recorded a probe (a GPU sweep, a file without one)."""
    factors = [r["speed_factor"] for r in rows if r.get("speed_factor")]
    return statistics.median(factors) if factors else None


def per_trial(rows: list[dict[str, Any]], sweep_speed: float | None = None) -> list[dict[str, Any]]:
    """One row per trial from its runs' rows (``trial_id``: the repetitions of one trial share
    it, `compare`): measured, the median
    over its runs; predicted, the runs' (one config: the same prediction); ``runs``; and the
    runs' spread of the measured optimizer step (max ÷ min), the noise no prediction can beat.
    ``sweep_speed`` (`sweep_speed_factor`): each headline prediction also times it
    (``*_sweep_speed``, with its error)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["trial_id"], []).append(r)
    out = []
    for trial, rs in groups.items():
        row = {k: rs[0][k] for k in ("method", "optimizer", "model", "dp", "tp", "plan_matches")}
        row.update(trial=trial, runs=len(rs))
        for m in METRICS:
            meas = [r[f"{m}_measured"] for r in rs if r.get(f"{m}_measured") is not None]
            row[f"{m}_predicted"] = rs[0][f"{m}_predicted"]
            row[f"{m}_measured"] = statistics.median(meas) if meas else None
            row[f"{m}_error_pct"] = _error(row[f"{m}_predicted"], row[f"{m}_measured"])
        factors = [r["speed_factor"] for r in rs if r.get("speed_factor")]
        row["speed_factor"] = statistics.median(factors) if factors else None
        for m in HEADLINE:  # each run's prediction scaled by its own probe, then the median
            adj = [r[f"{m}_speed_adjusted"] for r in rs if r.get(f"{m}_speed_adjusted") is not None]
            row[f"{m}_speed_adjusted"] = statistics.median(adj) if adj else None
            row[f"{m}_speed_adjusted_error_pct"] = _error(row[f"{m}_speed_adjusted"], row[f"{m}_measured"])
            row[f"{m}_sweep_speed"] = row[f"{m}_predicted"] * sweep_speed if sweep_speed else None
            row[f"{m}_sweep_speed_error_pct"] = _error(row[f"{m}_sweep_speed"], row[f"{m}_measured"])
        row["phases"] = _trial_phases(rs)
        steps = [r["optimizer_step_ms_measured"] for r in rs if r.get("optimizer_step_ms_measured")]
        row["step_run_spread"] = max(steps) / min(steps) if steps else None
        row["plan_matches"] = None if any(r.get("plan_matches") is None for r in rs) else all(
            r["plan_matches"] for r in rs)
        out.append(row)
    return out


def _trial_phases(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per phase of the executor's timer, the prediction (one per trial) and the median over the
    runs of what each measured, the slowest rank's (``measured``) and the mean over the ranks
    (``measured_mean``), each the median over the run's steps (`_measured_phases`)."""
    out: dict[str, dict[str, float | None]] = {}
    for ph in PHASES:
        seen = [r["phases"][ph] for r in runs if ph in (r.get("phases") or {})]
        if not seen:
            continue
        out[ph] = {"predicted": seen[0]["predicted"], "predicted_mean": seen[0].get("predicted_mean")}
        for key in ("measured", "measured_mean"):
            meas = [p[key] for p in seen if p.get(key) is not None]
            out[ph][key] = statistics.median(meas) if meas else None
    return out


def trial_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`per_trial`'s rows summed up per method and per method × layout (median and worst
    |error| of the optimizer step and the iteration, raw, speed-adjusted and at the sweep's
    speed), and whether every method meets `GOAL` raw (``goal_met``) and at the sweep's speed
    (``goal_met_sweep_speed``; None without probes)."""
    probed = [r for r in rows if r.get("plan_matches") is not False and r.get("speed_factor")]
    speed = sweep_speed_factor(probed)
    trials = [r for r in per_trial(rows, speed) if r.get("plan_matches") is not False]
    metrics = (*HEADLINE, *(f"{h}_{kind}" for kind in ("speed_adjusted", "sweep_speed") for h in HEADLINE))

    def stats(sub: list[dict[str, Any]]) -> dict[str, Any]:
        return error_stats(sub, metrics)

    methods = sorted({r["method"] for r in trials})
    layouts = sorted({(r["method"], r["dp"], r["tp"]) for r in trials})
    by_method = [{"method": m, **stats([r for r in trials if r["method"] == m])} for m in methods]
    return {"trials": trials, "by_method": by_method,
            "by_layout": [{"method": m, "dp": dp, "tp": tp,
                           **stats([r for r in trials if (r["method"], r["dp"], r["tp"]) == (m, dp, tp)])}
                          for m, dp, tp in layouts],
            "goal": GOAL, "goal_met": meets_goal(by_method),
            "sweep_speed_factor": speed,
            "sweep_speed_runs": len(probed),
            "goal_met_sweep_speed": meets_goal(by_method, "_sweep_speed") if speed else None}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median absolute % error and the worst case, per method and overall, for each headline metric."""
    metrics = HEADLINE + tuple(f"{a}_adjusted" for a in ADJUSTED)

    def stats(sub: list[dict[str, Any]]) -> dict[str, Any]:
        return error_stats(sub, metrics)

    excluded = [r["trial"] for r in rows if r.get("plan_matches") is False]
    rows = [r for r in rows if r.get("plan_matches") is not False]
    methods = sorted({r["method"] for r in rows})
    return {
        "by_method": [{"method": m, **stats([r for r in rows if r["method"] == m])} for m in methods],
        "overall": stats(rows),
        "excluded": excluded,
        "per_trial": trial_summary(rows),
    }


def compare_sweep(sweep_dir: str | Path, hardware: Any) -> dict[str, Any]:
    """Every finished trial under `sweep_dir`: ``{"hardware", "trials": [rows], "by_method": [...],
    "overall": {...}, "errors": [...]}`` (rows as `compare`; a trial that cannot be simulated is
    listed under errors, not raised)."""
    hw: Hardware = load_hardware(hardware)
    rows, errors = [], []
    projections: dict[str, Any] = {}
    for d in trial_dirs(sweep_dir):
        try:
            rows.append(compare(d, hw, projections))
        except Exception as e:  # noqa: BLE001 - one bad record must not hide the rest
            errors.append({"trial": d.name, "error": f"{type(e).__name__}: {e}"})
    return {"hardware": hw.describe(), "trials": rows, **summarise(rows), "errors": errors}


def to_frame(result: dict[str, Any]):
    """The trials of `compare_sweep` as a pandas DataFrame (phases and assumptions dropped)."""
    import pandas as pd

    return pd.DataFrame([{k: v for k, v in r.items() if k not in ("phases", "assumptions")} for r in result["trials"]])


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.0f}%" if pct else f"{v:.1f}"


@dataclass
class ValidateArgs:
    """The command's ``key=value`` settings."""

    hardware: str = setting("hardware/local.yaml", "hardware file: a name under hardware/ or a YAML path")


# The command's keys that were renamed: refused with one line naming the new one.
RENAMED = {"profile": Renamed("hardware", "the hardware file: a name under hardware/ or a YAML path")}
PUBLISHED = "published"  # the positional that projects the published points instead of a folder
ACROSS = "across"  # the positional that sets several sweeps side by side (`canzona.sim.across`)
REPORT_HARDWARE = Path("report") / "hardware.yaml"  # a sweep's copy of what its report predicted with
MAX_SWEEPS = 64


def main(argv: list[str] | None = None) -> int:
    return run_command("canzona.sim.validate", _validate, argv)


def _validate(argv: list[str]) -> int:
    form = usage("canzona.sim.validate")
    if argv and argv[0] == ACROSS:
        return _across(argv[1:], form)
    parts = split_argv(argv, flags=("--json",), positionals=1, usage=form)
    if not parts.positionals:
        raise ConfigError(f"missing TRIAL_OR_SWEEP_DIR; usage: {form}")
    if parts.positionals[0] == PUBLISHED:
        if parts.overrides:
            raise ConfigError(f"{PUBLISHED} projects each point on its own hardware file "
                              f"(validation/published_points.yaml): no key=value is allowed with it")
        return _published(json_out="--json" in parts.flags)
    args = build(ValidateArgs, parts.overrides, what="validate", renamed=RENAMED)
    target = Path(parts.positionals[0])
    if not target.is_dir():
        raise ConfigError(f"{str(target)!r} is not a folder; usage: {form}")
    res = compare_sweep(target, args.hardware)
    if "--json" in parts.flags:
        print(json.dumps(res, indent=2, default=str))
        return 0
    print(f"hardware {res['hardware']['name']} ({res['hardware']['source']}); {len(res['trials'])} trials")
    print(f"{'trial':48s} {'load':>5s} {'adj':>5s} {'step pred':>9s} {'meas':>7s} {'err':>5s}   {'iter pred':>9s} {'meas':>7s} {'err':>5s}")
    for r in res["trials"]:
        lf = f"{r['load_factor']:.2f}" if r.get("load_factor") else "-"
        print(f"{r['trial'][:48]:48s} {lf:>5s} {_fmt(r.get('optimizer_step_ms_adjusted_error_pct'), True):>5s} {_fmt(r['optimizer_step_ms_predicted']):>9s} {_fmt(r['optimizer_step_ms_measured']):>7s} "
              f"{_fmt(r['optimizer_step_ms_error_pct'], True):>5s}   {_fmt(r['iteration_ms_predicted']):>9s} "
              f"{_fmt(r['iteration_ms_measured']):>7s} {_fmt(r['iteration_ms_error_pct'], True):>5s}")
    for m in res["by_method"] + [{"method": "all", **res["overall"]}]:
        print(f"  {m['method']:10s} n={m['trials']}: optimizer step median |err| "
              f"{_fmt(m.get('optimizer_step_ms_median_abs_error_pct'))}% (worst {_fmt(m.get('optimizer_step_ms_worst_abs_error_pct'))}%), "
              f"iteration {_fmt(m.get('iteration_ms_median_abs_error_pct'))}% (worst {_fmt(m.get('iteration_ms_worst_abs_error_pct'))}%); "
              f"load-adjusted step {_fmt(m.get('optimizer_step_ms_adjusted_median_abs_error_pct'))}% "
              f"(worst {_fmt(m.get('optimizer_step_ms_adjusted_worst_abs_error_pct'))}%)")
    pt = res["per_trial"]
    print(f"per trial (the median of its runs), goal median |err| <= {GOAL['median_abs_error_pct']:g}% and worst <= "
          f"{GOAL['worst_abs_error_pct']:g}% per method, raw: {'met' if pt['goal_met'] else 'not met'}; "
          f"speed-adjusted errors (prediction x calibration's speed probe / the trial's) in brackets")
    for m in pt["by_layout"]:
        print(f"  {m['method']:10s} dp {m['dp']} x tp {m['tp']} n={m['trials']}: {_errs(m)}")
    for m in pt["by_method"]:
        print(f"  {m['method']:10s} all layouts n={m['trials']}: {_errs(m)}")
    if pt["sweep_speed_factor"]:
        print(f"at the sweep's speed (every prediction x {pt['sweep_speed_factor']:.3f}: the calibration's speed probe / "
              f"the median of the {pt['sweep_speed_runs']} runs' probes), per trial: "
              f"{'met' if pt['goal_met_sweep_speed'] else 'not met'}")
        for m in pt["by_method"]:
            print(f"  {m['method']:10s} all layouts n={m['trials']}: {_errs(m, ('_sweep_speed',))}")
    if res["excluded"]:
        print(f"  left out (recorded plan differs from today's planner): {', '.join(res['excluded'])}")
    for e in res["errors"]:
        print(f"  could not simulate {e['trial']}: {e['error']}")
    return 0


def _errs(m: dict[str, Any], kinds: tuple[str, ...] = ("", "_speed_adjusted")) -> str:
    """Median and worst |error| of step and iteration, one figure per kind of prediction (by
    default raw [speed-adjusted])."""
    def one(metric: str) -> str:
        figs = [f"{_fmt(m.get(f'{metric}{k}_median_abs_error_pct'))}% (worst "
                f"{_fmt(m.get(f'{metric}{k}_worst_abs_error_pct'))}%)" for k in kinds]
        return figs[0] + "".join(f" [{f}]" for f in figs[1:])

    return f"step median |err| {one('optimizer_step_ms')}, iteration {one('iteration_ms')}"


def _across(argv: list[str], form: str) -> int:
    """Several sweeps side by side (`canzona.sim.across`), each priced with its report's hardware file."""
    from canzona.sim.across import decompose, render

    parts = split_argv(argv, flags=("--json",), positionals=MAX_SWEEPS, usage=form)
    if parts.overrides:
        raise ConfigError(f"{ACROSS} predicts each sweep with its own report's hardware file ({REPORT_HARDWARE}): "
                          f"no key=value is allowed with it")
    dirs = [Path(d) for d in parts.positionals]
    if len(dirs) < 2:
        raise ConfigError(f"{ACROSS} needs at least two sweep folders, got {len(dirs)}; usage: {form}")
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"{str(d)!r} is not a folder; usage: {form}")
        if not (d / REPORT_HARDWARE).is_file():
            raise ConfigError(f"{str(d)!r} has no {REPORT_HARDWARE}: build its report with the hardware file it "
                              f"was calibrated with (python -m analysis.report {d} hardware=FILE)")
    sweeps = [(str(d), compare_sweep(d, d / REPORT_HARDWARE)["per_trial"]["trials"]) for d in dirs]
    result = decompose(sweeps)
    if "--json" in parts.flags:
        print(json.dumps(result, indent=2, default=str))
    else:
        print("\n".join(render(result)))
    return 0


def _published(json_out: bool) -> int:
    from canzona.sim.published import band, print_table, project_points

    results = project_points()
    if json_out:
        print(json.dumps({"points": [r.as_dict() for r in results], "band": band(results)}, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
