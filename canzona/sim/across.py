"""Several measured sweeps of the same trials side by side: how much of the prediction error is
the simulator's, and how much the machine's.

One sweep's error per trial (`canzona.sim.validate.per_trial`) mixes three things: what the
simulator gets wrong about that trial (the same on every run of it), how fast the machine ran
through the whole sweep against its calibration (common to that sweep's trials), and the
trial's own run-to-run noise. With the same trials measured in several sweeps, each calibrated
on its own (the README's first command run again on fresh clones, or on other days), they come
apart:

- a trial's **bias**: its mean error over the sweeps (what a better simulator could remove);
- a sweep's **offset**: the median over its trials of their errors less their biases (the
  machine's speed during that sweep against its calibration: no prediction made before the
  trials can know it);
- what is left: the noise.

The same split, in milliseconds, per phase of the executor's timer (forward, backward, the
gradient reductions' tail, the step's gather / compute / scatter / apply, the parameter sync,
...), each phase as the mean over the ranks: a trial's phase whose mean error over the sweeps is
beyond twice its standard error (and at least `PHASE_MIN_MS`) is one the simulator gets wrong on
that trial, and a phase wrong the same way on most trials names what to model next. Not the
slowest rank's phase, as the records' summaries take it: the simulator's ranks run in lockstep,
and ranks that drift apart within an iteration lengthen one rank's backward and another's wait
for the reductions, both counted there while the iteration (one rank's span) is not longer by
their sum (docs/results.md). That comparison is kept beside it (``slowest_bias_ms``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from canzona.errors import ConfigError
from canzona.sim.goal import GOAL, HEADLINE, error_stats, meets_goal

KINDS = ("raw", "bias_removed", "bias_and_offset_removed")
PHASE_MIN_MS = 0.5  # a phase's mean error below this is nothing to model, whatever its spread


def decompose(sweeps: Sequence[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """``sweeps``: (label, per-trial rows as `canzona.sim.validate.per_trial` gives them) of at
    least two sweeps. Only trials with both headline errors in every sweep are compared; the
    others are listed in ``left_out``. Returns ``{"goal", "trials": [{trial, method, dp, tp,
    bias: {metric: %}, sd: {metric: %}}], "median_sd": {metric: %}, "sweeps": [{label, offset:
    {metric: %}, raw / bias_removed / bias_and_offset_removed: {goal_met, by_method}}],
    "left_out": [trial ids]}``."""
    if len(sweeps) < 2:
        raise ConfigError(f"comparing sweeps needs at least two of them, got {len(sweeps)}")
    usable = [{r["trial"]: r for r in rows if r.get("plan_matches") is not False} for _, rows in sweeps]
    every = set.union(*(set(u) for u in usable))
    common = sorted(t for t in every if all(
        t in u and all(u[t].get(f"{m}_error_pct") is not None for m in HEADLINE) for u in usable))
    if not common:
        raise ConfigError("no trial has an optimizer step and an iteration error in every sweep: "
                          "are they sweeps of the same trials?")
    errors = {t: {m: [u[t][f"{m}_error_pct"] for u in usable] for m in HEADLINE} for t in common}
    bias = {t: {m: statistics.fmean(v) for m, v in errs.items()} for t, errs in errors.items()}
    sd = {t: {m: statistics.stdev(v) for m, v in errs.items()} for t, errs in errors.items()}
    out_sweeps = []
    for k, (label, _) in enumerate(sweeps):
        debiased = {t: {m: errors[t][m][k] - bias[t][m] for m in HEADLINE} for t in common}
        offset = {m: statistics.median(debiased[t][m] for t in common) for m in HEADLINE}
        variants = {
            "raw": {t: {m: errors[t][m][k] for m in HEADLINE} for t in common},
            "bias_removed": debiased,
            "bias_and_offset_removed": {t: {m: debiased[t][m] - offset[m] for m in HEADLINE} for t in common},
        }
        entry: dict[str, Any] = {"label": label, "offset": offset}
        for kind, errs in variants.items():
            entry[kind] = _judged([{**usable[k][t], **{f"{m}_error_pct": e for m, e in errs[t].items()}}
                                   for t in common])
        out_sweeps.append(entry)
    first = usable[0]
    phases = {t: phase_bias([u[t] for u in usable]) for t in common}
    return {
        "goal": GOAL,
        "trials": [{"trial": t, **{c: first[t][c] for c in ("method", "dp", "tp")}, "bias": bias[t], "sd": sd[t],
                    "phases": phases[t]} for t in common],
        "median_sd": {m: statistics.median(sd[t][m] for t in common) for m in HEADLINE},
        "phases": phase_summary(list(phases.values())),
        "sweeps": out_sweeps,
        "left_out": sorted(every - set(common)),
    }


def phase_bias(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One trial's rows, one per sweep (`per_trial`'s, with ``phases``): per phase measured in
    every sweep, the mean over the sweeps of the predicted and the measured milliseconds (each
    the mean over the ranks), their difference's mean (``bias_ms``: predicted - measured) and
    standard deviation, ``off``: -1 (under-predicted), +1 (over) or 0 -- off when the mean
    difference is at least `PHASE_MIN_MS` and beyond twice its standard error (sd /
    sqrt(sweeps)) -- and ``slowest_bias_ms``, the mean difference against the slowest rank's
    phase, as the summaries take it."""
    out: dict[str, dict[str, Any]] = {}
    names = set.intersection(*(set(r.get("phases") or {}) for r in rows))
    for ph in sorted(names):
        seen = [r["phases"][ph] for r in rows]
        keys = ("predicted_mean", "measured_mean", "predicted", "measured")
        if any(p.get(k) is None for p in seen for k in keys):
            continue
        diff = [p["predicted_mean"] - p["measured_mean"] for p in seen]
        mean, sd = statistics.fmean(diff), statistics.stdev(diff)
        off = abs(mean) >= PHASE_MIN_MS and abs(mean) > 2.0 * sd / math.sqrt(len(diff))
        out[ph] = {"predicted_ms": statistics.fmean(p["predicted_mean"] for p in seen),
                   "measured_ms": statistics.fmean(p["measured_mean"] for p in seen),
                   "bias_ms": mean, "sd_ms": sd, "off": (1 if mean > 0 else -1) if off else 0,
                   "slowest_bias_ms": statistics.fmean(p["predicted"] - p["measured"] for p in seen)}
    return out


def phase_summary(trials: Sequence[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per phase, over the trials that have it: how many it is under- and over-predicted on
    (`phase_bias`'s ``off``) and the median bias; most often off first."""
    out = []
    for ph in sorted({ph for t in trials for ph in t}):
        got = [t[ph] for t in trials if ph in t]
        out.append({"phase": ph, "trials": len(got), "under": sum(g["off"] < 0 for g in got),
                    "over": sum(g["off"] > 0 for g in got), "median_bias_ms": statistics.median(g["bias_ms"] for g in got),
                    "median_slowest_bias_ms": statistics.median(g["slowest_bias_ms"] for g in got)})
    return sorted(out, key=lambda p: (-(p["under"] + p["over"]), p["phase"]))


def _judged(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method, the median and worst |error| of each headline metric, and the goal."""
    by_method = [{"method": m, **error_stats([r for r in rows if r["method"] == m], HEADLINE)}
                 for m in sorted({r["method"] for r in rows})]
    return {"goal_met": meets_goal(by_method), "by_method": by_method}


def render(result: dict[str, Any]) -> list[str]:
    """The decomposition as printed lines (``python -m canzona.sim.validate across``)."""
    step, it = HEADLINE
    goal = result["goal"]
    lines = [f"{len(result['sweeps'])} sweeps, {len(result['trials'])} trials in all of them; goal per method: "
             f"median |err| <= {goal['median_abs_error_pct']:g}% and worst <= {goal['worst_abs_error_pct']:g}%, "
             "optimizer step and iteration"]
    width = max(len("sweep"), *(len(s["label"]) for s in result["sweeps"]))
    lines.append(f"{'sweep':{width}s} {'offset step/iter':>17s}  {'raw':>4s}  {'bias out':>8s}  {'bias+offset out':>15s}")
    for s in result["sweeps"]:
        met = ["met" if s[k]["goal_met"] else "miss" for k in KINDS]
        lines.append(f"{s['label']:{width}s} {s['offset'][step]:+7.1f}/{s['offset'][it]:+6.1f} %  "
                     f"{met[0]:>4s}  {met[1]:>8s}  {met[2]:>15s}")
    sd = result["median_sd"]
    lines.append(f"a trial's error moves between sweeps by {sd[step]:.1f}% (step) and {sd[it]:.1f}% (iteration), "
                 "the median standard deviation over the trials")
    lines.append("bias per trial (its mean error over the sweeps, step / iteration) and its standard deviation:")
    for t in sorted(result["trials"], key=lambda t: -max(abs(v) for v in t["bias"].values())):
        lines.append(f"  {t['trial'][:44]:44s} {t['bias'][step]:+6.1f} / {t['bias'][it]:+6.1f} %   "
                     f"sd {t['sd'][step]:4.1f} / {t['sd'][it]:4.1f}")
    lines.append("per phase, the mean over the ranks (predicted - measured, ms; off on a trial where its mean over "
                 "the sweeps is beyond twice its standard error; against the slowest rank's phase, as the summaries "
                 "take it, in brackets):")
    for p in result["phases"]:
        if p["under"] or p["over"]:
            lines.append(f"  {p['phase']:12s} under-predicted on {p['under']:2d}, over on {p['over']:2d} of "
                         f"{p['trials']} trials (median {p['median_bias_ms']:+.1f} ms "
                         f"[{p['median_slowest_bias_ms']:+.1f} ms])")
    if result["left_out"]:
        lines.append(f"left out (not in every sweep with both errors): {', '.join(result['left_out'])}")
    return lines
