"""Aggregations over a loaded sweep (docs/design.md §6).

Definitions used everywhere (and stated in the report):

- A **step's value** of ``iteration_ms`` / ``optimizer_step_ms`` / ``param_sync_ms`` is the max
  over ranks of that step (the critical rank); only measured steps count (warm-up dropped).
- A **trial** here is one run (one folder); with the sweep setting ``repeats`` a config is run
  several times and each **repetition** is a trial of its own, with the config's id in
  ``config_id`` and its number in ``repeat``. A trial's median / p10 / p90 are taken over its
  step values (numpy linear percentiles).
- A **group** is every trial of one method (and method variant) at one point -- all
  repetitions of its config(s); its median / p10 / p90 pool the step values of its trials.
- A **point** is (model, optimizer, dp, tp) plus any other config value that varies in the
  sweep and is not method-specific (``planner.*``, ``dist.dp_collective``, ``dist.sync_variant``
  make a method's *variant* instead); the seed and output paths never split points.
- **Speedup** of canzona over a baseline = baseline group median / canzona group median;
  **overhead** over adamw = canzona median / adamw median (adamw matched on model and layout,
  whatever its optimizer name). The interval is a 90% percentile interval of a hierarchical
  bootstrap (resample trials -- repetitions --, then steps within each trial; 2000 resamples,
  fixed seed), so that it reflects how much whole runs differ, not only steps within a run.
  **Paired** when both groups are the repetitions 1..N of one config each (``paired`` true in
  speedups.csv): the sweep runs repetition k of every method at a point back to back, so
  repetition k of canzona and of the baseline saw the same machine load, and a resample picks
  the same repetitions on both sides; load drift between repetitions then cancels in the
  ratio instead of widening its interval.
- **Imbalance** (planned and measured) = max over ranks ÷ mean over ranks of the per-rank load:
  planned = summary.json ``plan.ranks[*].compute`` (or the steps' ``compute_load``), measured =
  the per-rank median over measured steps of ``compute_ms``. The planner's own
  ``plan.imbalance.compute`` (docs/design.md §2: against work counted once) is reported beside it.
- **Phases**: per step the mean over ranks of each phase's milliseconds, then the median over
  steps; ``other`` is what of ``iteration_ms`` the phases leave unexplained (never negative).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from analysis.load import Sweep, planned_loads
from canzona.peers import PEERS
from canzona.plan.registry import METHOD_ORDER, method_rank, pair_of, rung
from canzona.records import PHASES

METHODS = METHOD_ORDER  # the presets' order: canzona first, then the baselines, the reference last
BASELINES = ("sync", "layerwise")  # always shown; every other method present (atomic, the rungs) joins them
METRICS = ("iteration_ms", "optimizer_step_ms")
POINT_BASE = ("model", "optimizer.name", "parallel.dp", "parallel.tp")
# config values that never split a point: identity, seeds, paths, test hooks, model (in `model`)
NOT_POINT = {
    "method", "method.name", "method.dp", "method.tp", "rung", "out", "save_params", "train.seed", "train.fail_on_rank", "train.fail_at_step",
    "model.name", "model.width_div", "model.num_layers", "model.vocab", "model.tied_embeddings", "dist.timeout_s",
}
METHOD_SPECIFIC = {
    "canzona": lambda c: c.startswith("planner.") or c == "dist.dp_collective",
    "sync": lambda c: c == "dist.sync_variant",
    # the peers' own switches (peer.tp_mode, peer.ns_matmul_prec): a peer's variant, never a point
    **{p: (lambda c: c.startswith("peer.")) for p in PEERS},
}
N_BOOT = 2000
CI = (5.0, 95.0)


def _pct(values: Iterable[float]) -> tuple[float, float, float]:
    a = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    return tuple(float(x) for x in np.percentile(a, [50, 10, 90]))  # type: ignore[return-value]


def _is_method_specific(col: str) -> bool:
    return any(f(col) for f in METHOD_SPECIFIC.values())


# ---------------------------------------------------------------------------- per step


def step_values(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per trial x measured step: max over ranks of the step metrics, mean over ranks
    of each phase (``<phase>_ms``) and ``other_ms``, and ``n_ranks``."""
    cols = ["trial_id", "step", "n_ranks", "iteration_ms", "optimizer_step_ms", "param_sync_ms"]
    cols += [f"{p}_ms_mean" for p in PHASES] + ["other_ms_mean"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    m = steps[steps["measured"]].copy()
    if m.empty:
        return pd.DataFrame(columns=cols)
    phase_cols = [f"{p}_ms" for p in PHASES]
    m["other_ms"] = (m["iteration_ms"] - m[phase_cols].fillna(0).sum(axis=1)).clip(lower=0)
    g = m.groupby(["trial_id", "step"], sort=True)
    out = g.agg(
        n_ranks=("rank", "nunique"),
        iteration_ms=("iteration_ms", "max"),
        optimizer_step_ms=("optimizer_step_ms", "max"),
        param_sync_ms=("param_sync_ms", "max"),
    )
    means = g[[*phase_cols, "other_ms"]].mean().add_suffix("_mean")
    return out.join(means).reset_index()[cols]


# ---------------------------------------------------------------------------- per trial


def rank_loads(sweep: Sweep, trial_id: str) -> pd.DataFrame:
    """Per rank of one trial: planned load, measured median compute_ms, each as a share of
    the mean over ranks. Columns rank, dp_rank, tp_rank, planned, measured_ms, planned_rel,
    measured_rel."""
    t = sweep.trial(trial_id)
    planned = planned_loads(t)
    s = sweep.steps_df
    s = s[(s["trial_id"] == trial_id) & s["measured"]] if not s.empty else s
    if not s.empty:
        meas = s.groupby("rank").agg(measured_ms=("compute_ms", "median"), dp_m=("dp_rank", "first"),
                                     tp_m=("tp_rank", "first")).reset_index()
    else:
        meas = pd.DataFrame(columns=["rank", "measured_ms", "dp_m", "tp_m"])
    df = planned.merge(meas, on="rank", how="outer").sort_values("rank").reset_index(drop=True)
    df["dp_rank"] = df["dp_rank"].fillna(df["dp_m"])
    df["tp_rank"] = df["tp_rank"].fillna(df["tp_m"])
    df = df.drop(columns=["dp_m", "tp_m"])
    for c in ("planned", "measured_ms"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    for c, rel in (("planned", "planned_rel"), ("measured_ms", "measured_rel")):
        mean = df[c].mean()
        df[rel] = df[c] / mean if mean and not math.isnan(mean) else math.nan
    return df


def imbalance(values: pd.Series) -> float:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty or v.mean() <= 0:
        return math.nan
    return float(v.max() / v.mean())


def trial_table(sweep: Sweep, per_step: pd.DataFrame | None = None) -> pd.DataFrame:
    """sweep.trials_df plus, per trial: n_ranks, n_steps (measured), median/p10/p90 of
    iteration_ms and optimizer_step_ms, param_sync_ms_median (from steps.jsonl; summary.json's
    values when there are no steps, ``source`` says which), planned and measured imbalance."""
    per_step = step_values(sweep.steps_df) if per_step is None else per_step
    rows = []
    for t in sweep.trials:
        ps = per_step[per_step["trial_id"] == t.trial_id]
        r: dict[str, object] = {"trial_id": t.trial_id, "n_steps": int(len(ps)),
                                "n_ranks": int(ps["n_ranks"].max()) if len(ps) else 0}
        if len(ps):
            r["source"] = "steps"
            for m in METRICS:
                r[f"{m}_median"], r[f"{m}_p10"], r[f"{m}_p90"] = _pct(ps[m])
            r["param_sync_ms_median"] = _pct(ps["param_sync_ms"])[0]
        elif any(t.summary.get(f"{m}_median") is not None for m in METRICS):
            r["source"] = "summary"
            for m in METRICS:
                for q in ("median", "p10", "p90"):
                    v = t.summary.get(f"{m}_{q}")
                    r[f"{m}_{q}"] = float(v) if v is not None else math.nan
            v = t.summary.get("param_sync_ms_median")
            r["param_sync_ms_median"] = float(v) if v is not None else math.nan
        else:
            r["source"] = None
        loads = rank_loads(sweep, t.trial_id)
        r["planned_imbalance"] = imbalance(loads["planned"])
        r["measured_imbalance"] = imbalance(loads["measured_ms"])
        rows.append(r)
    stats = pd.DataFrame(rows)
    for m in METRICS:
        for q in ("median", "p10", "p90"):
            if f"{m}_{q}" not in stats:
                stats[f"{m}_{q}"] = math.nan
    if "param_sync_ms_median" not in stats:
        stats["param_sync_ms_median"] = math.nan
    df = sweep.trials_df.merge(stats, on="trial_id", how="left")
    df["usable"] = df["source"].notna()
    extra = point_extra_columns(df, sweep.config_columns)
    df["variant"] = df.apply(lambda row: _variant(row, df, sweep.config_columns), axis=1)
    df.attrs["point_columns"] = [*POINT_BASE, *extra]
    return df


# Layout columns shown beside dp × tp whenever a trial uses them (an MoE model's expert grid),
# even where they do not vary: "dp 2 × tp 1" alone would hide the expert parallelism.
SHOWN_WHEN_USED = {"parallel.ep": 1}


def point_extra_columns(trials: pd.DataFrame, config_columns: list[str]) -> list[str]:
    """Config columns beyond POINT_BASE that vary among usable trials and split points, and
    those of `SHOWN_WHEN_USED` that some usable trial sets to other than their neutral value."""
    usable = trials[trials["source"].notna()] if "source" in trials else trials
    out = []
    for c in config_columns:
        if c in NOT_POINT or c in POINT_BASE or _is_method_specific(c) or c not in usable:
            continue
        used = c in SHOWN_WHEN_USED and (usable[c].dropna() != SHOWN_WHEN_USED[c]).any()
        if used or usable[c].astype(str).nunique(dropna=False) > 1:
            out.append(c)
    return out


def _variant(row: pd.Series, trials: pd.DataFrame, config_columns: list[str]) -> str:
    method = row.get("method")
    pred = METHOD_SPECIFIC.get(str(method).split("[", 1)[0])  # megatron_layerwise[duplicated]: the peer's
    if pred is None:
        return ""
    same = trials[(trials["method"] == method) & trials["usable"]]
    parts = []
    for c in config_columns:
        if pred(c) and c in same and same[c].astype(str).nunique(dropna=False) > 1:
            parts.append(f"{c.split('.', 1)[-1]}={row.get(c)}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------- groups


def _key(row: pd.Series, cols: list[str]) -> tuple:
    return tuple(None if (isinstance(row[c], float) and math.isnan(row[c])) else row[c] for c in cols)


def group_table(trials: pd.DataFrame, per_step: pd.DataFrame) -> pd.DataFrame:
    """Per point x method x variant (usable trials with measured steps): n_trials (runs, every
    repetition counted), n_configs, n_steps, pooled median/p10/p90 of iteration_ms and optimizer_step_ms, mean model_params."""
    pcols = trials.attrs["point_columns"]
    ok = trials[trials["source"] == "steps"]
    rows = []
    if ok.empty:
        return pd.DataFrame(columns=[*pcols, "method", "variant", "n_trials", "n_steps"])
    for key, g in ok.groupby([*pcols, "method", "variant"], dropna=False, sort=True):
        ps = per_step[per_step["trial_id"].isin(g["trial_id"])]
        r = dict(zip([*pcols, "method", "variant"], key))
        r.update(n_trials=len(g), n_configs=g["config_id"].nunique(), n_steps=len(ps),
                 model_params=g["model_params"].mean(),
                 trial_ids=" ".join(g["trial_id"]))
        for m in METRICS:
            r[f"{m}_median"], r[f"{m}_p10"], r[f"{m}_p90"] = _pct(ps[m])
        rows.append(r)
    return _sorted(pd.DataFrame(rows), trials, pcols)


def _sorted(df: pd.DataFrame, trials: pd.DataFrame, pcols: list[str]) -> pd.DataFrame:
    """Order rows by model size, layout, other point values, then method (canzona first)."""
    if df.empty:
        return df
    size = trials.groupby("model")["model_params"].max().to_dict()
    key = pd.DataFrame({"_size": df["model"].map(size).fillna(float("inf")), "_model": df["model"].astype(str),
                        "_dp": df["parallel.dp"], "_tp": df["parallel.tp"]}, index=df.index)
    for i, c in enumerate(p for p in pcols if p not in POINT_BASE):
        key[f"_x{i}"] = df[c].astype(str)
    if "method" in df:
        key["_method"] = df["method"].map(lambda m: method_rank(str(m)))
    key["_opt"] = df["optimizer.name"].astype(str)
    order = key.sort_values(list(key.columns), kind="stable").index
    return df.loc[order].reset_index(drop=True)


def _samples(per_step: pd.DataFrame, trial_ids: Iterable[str], metric: str) -> list[np.ndarray]:
    out = []
    for tid in trial_ids:
        v = per_step.loc[per_step["trial_id"] == tid, metric].dropna().to_numpy(dtype=float)
        if v.size:
            out.append(v)
    return out


def _paired(cg: pd.DataFrame, bg: pd.DataFrame, per_step: pd.DataFrame,
            metric: str) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """Step values of the two groups' trials aligned by repetition, when the groups are the
    repetitions 1..N (N >= 2) of one config each; else None (resample them independently)."""
    if cg["config_id"].nunique() != 1 or bg["config_id"].nunique() != 1:
        return None
    reps = sorted(cg["repeat"])
    if len(reps) < 2 or reps != sorted(bg["repeat"]) or len(set(reps)) != len(reps):
        return None
    num, den = [], []
    for rep in reps:
        a = _samples(per_step, cg.loc[cg["repeat"] == rep, "trial_id"], metric)
        b = _samples(per_step, bg.loc[bg["repeat"] == rep, "trial_id"], metric)
        if a and b:
            num += a
            den += b
    return (num, den) if len(num) >= 2 else None


def _boot_medians(trials: list[np.ndarray], rng: np.random.Generator, n: int,
                  pick: np.ndarray | None = None) -> np.ndarray:
    """Two-level bootstrap: n resamples of (trials with replacement, then steps within each
    picked trial with replacement, as many as it has), the median of each resample. ``pick``
    (n x trials): which trials each resample takes, when given (paired resampling)."""
    k = len(trials)
    sizes = np.array([a.size for a in trials])
    smax = int(sizes.max())
    table = np.full((k, smax), np.nan)
    for i, a in enumerate(trials):
        table[i, : a.size] = a
    if pick is None:
        pick = rng.integers(0, k, size=(n, k))  # trials
    size = sizes[pick][:, :, None]  # (n, k, 1)
    idx = np.floor(rng.random((n, k, smax)) * size).astype(int)  # steps within each trial
    vals = table[pick[:, :, None], idx]
    vals[np.broadcast_to(np.arange(smax) >= size, vals.shape)] = np.nan  # a trial gives its own count
    vals = vals.reshape(n, k * smax)
    return np.nanmedian(vals, axis=1) if (sizes != smax).any() else np.median(vals, axis=1)


def ratio_with_ci(num: list[np.ndarray], den: list[np.ndarray], seed: int = 0, n: int = N_BOOT,
                  paired: bool = False) -> tuple[float, float, float]:
    """median(num) / median(den) with a 90% two-level bootstrap percentile interval.
    ``paired``: num[i] and den[i] ran together (same repetition); resample them together."""
    if not num or not den:
        return (math.nan, math.nan, math.nan)
    value = float(np.median(np.concatenate(num)) / np.median(np.concatenate(den)))
    rng = np.random.default_rng(seed)
    if paired:
        if len(num) != len(den):
            raise ValueError(f"paired resampling needs as many trials on both sides ({len(num)} != {len(den)})")
        pick = rng.integers(0, len(num), size=(n, len(num)))
        r = _boot_medians(num, rng, n, pick) / _boot_medians(den, rng, n, pick)
    else:
        r = _boot_medians(num, rng, n) / _boot_medians(den, rng, n)
    lo, hi = np.percentile(r, CI)
    return value, float(lo), float(hi)


@dataclass
class Ratio:
    """One metric of one comparison: ``value`` = numerator median ÷ denominator median
    (speedup: baseline ÷ canzona; overhead: canzona ÷ adamw), its interval (NaN without samples),
    and what it was computed from."""

    value: float
    ci_low: float
    ci_high: float
    paired: bool
    canzona_median: float
    baseline_median: float
    n_trials_canzona: int
    n_trials_baseline: int
    n_steps_canzona: int
    n_steps_baseline: int


@dataclass
class Cell:
    """canzona against one baseline (and baseline variant) at one point."""

    baseline: str
    variant: str
    kind: str  # speedup | overhead
    trial_ids: list[str]
    ratios: dict[str, Ratio]  # metric -> its ratio


@dataclass
class Comparison:
    """One canzona group (point x canzona variant) and its cells per baseline: every baseline
    `baselines_in` names, then adamw; a baseline without trials at the point has none."""

    point: dict[str, object]
    variant: str
    trials: pd.DataFrame  # the canzona group's trials
    canzona: dict[str, float]  # metric -> the group's median
    cells: dict[str, list[Cell]]


def _group_samples(g: pd.DataFrame, metric: str, per_step: pd.DataFrame | None) -> list[np.ndarray]:
    """Per trial of `g` its values of `metric`: its measured steps, or (no per_step: projected
    trials, one value each) its ``<metric>_median``."""
    if per_step is not None:
        return _samples(per_step, g["trial_id"], metric)
    return [np.array([v]) for v in pd.to_numeric(g[f"{metric}_median"], errors="coerce") if not math.isnan(v)]


def _median(samples: list[np.ndarray]) -> float:
    return float(np.median(np.concatenate(samples))) if samples else math.nan


def _ratio(cg: pd.DataFrame, bg: pd.DataFrame, metric: str, kind: str, per_step: pd.DataFrame | None) -> Ratio:
    pairs = _paired(cg, bg, per_step, metric) if per_step is not None else None
    cs, bs = pairs if pairs is not None else (_group_samples(cg, metric, per_step), _group_samples(bg, metric, per_step))
    num, den = (cs, bs) if kind == "overhead" else (bs, cs)
    if per_step is not None:
        value, lo, hi = ratio_with_ci(num, den, paired=pairs is not None)
    else:  # point values: no interval
        n, d = _median(num), _median(den)
        value, lo, hi = (n / d if d > 0 else math.nan), math.nan, math.nan
    return Ratio(value=value, ci_low=lo, ci_high=hi, paired=pairs is not None, canzona_median=_median(cs),
                 baseline_median=_median(bs), n_trials_canzona=len(cs), n_trials_baseline=len(bs),
                 n_steps_canzona=int(sum(a.size for a in cs)), n_steps_baseline=int(sum(a.size for a in bs)))


def comparisons(trials: pd.DataFrame, per_step: pd.DataFrame | None = None) -> list[Comparison]:
    """canzona against every baseline at every point of `trials` (point columns in
    ``trials.attrs["point_columns"]``), in point order: speedup over each baseline (baseline ÷
    canzona), overhead over adamw (canzona ÷ adamw, adamw matched on model and layout whatever
    its optimizer). ``per_step`` (`step_values`): the measured trials' steps, each ratio then with
    its bootstrap interval (paired where the repetitions allow); None: projected trials, one
    value per trial (``<metric>_median``), point ratios without an interval."""
    pcols = trials.attrs["point_columns"]
    ok = trials[trials["usable"].astype(bool)]
    if per_step is not None:
        ok = ok[ok["source"] == "steps"]
    keep = [*pcols, "method", "variant", "trial_id", "config_id", "repeat", "n_ranks", "model_params",
            *(f"{m}_median" for m in METRICS)]
    ok = ok[[c for c in dict.fromkeys(keep) if c in ok]]  # narrow first: the point lookups filter it often
    no_opt = [c for c in pcols if not c.startswith("optimizer.")]
    baselines = [*baselines_in(ok["method"].unique()), "adamw"]
    out = []
    for key, cg in ok[ok["method"] == "canzona"].groupby([*pcols, "variant"], dropna=False, sort=True):
        point = dict(zip(pcols, key[:-1]))
        cells: dict[str, list[Cell]] = {}
        for b in baselines:
            kind = "overhead" if b == "adamw" else "speedup"
            at = _at_point(ok[ok["method"] == b], point, no_opt if b == "adamw" else pcols)
            cells[b] = [Cell(b, str(bv), kind, list(bg["trial_id"]), {m: _ratio(cg, bg, m, kind, per_step) for m in METRICS})
                        for bv, bg in at.groupby("variant", dropna=False, sort=True)]
        canzona = {m: _median(_group_samples(cg, m, per_step)) for m in METRICS}
        out.append(Comparison(point, key[-1], cg, canzona, cells))
    return out


def speedup_table(trials: pd.DataFrame, per_step: pd.DataFrame) -> pd.DataFrame:
    """The measured `comparisons` as rows: canzona group x comparison (vs each baseline:
    speedup; vs adamw: overhead) x metric. Columns: point columns, canzona_variant, comparison,
    baseline, baseline_variant, metric, kind, value, ci_low, ci_high, verdict, paired (repetitions
    resampled together, see the module docstring), canzona_median, baseline_median,
    n_trials_canzona, n_trials_baseline, n_steps_canzona, n_steps_baseline."""
    pcols = trials.attrs["point_columns"]
    cols = [*pcols, "canzona_variant", "comparison", "baseline", "baseline_variant", "metric", "kind",
            "value", "ci_low", "ci_high", "verdict", "paired", "canzona_median", "baseline_median", "n_trials_canzona",
            "n_trials_baseline", "n_steps_canzona", "n_steps_baseline"]
    rows = []
    for c in comparisons(trials, per_step):
        for b, cells in c.cells.items():
            comparison = "canzona overhead vs adamw" if b == "adamw" else f"canzona vs {b}"
            for cell in cells:
                for m, r in cell.ratios.items():
                    rows.append({**c.point, "canzona_variant": c.variant, "comparison": comparison, "baseline": b,
                                 "baseline_variant": cell.variant, "metric": m, "kind": cell.kind,
                                 **asdict(r), "verdict": verdict(cell.kind, r.ci_low, r.ci_high)})
    return _sorted(pd.DataFrame(rows, columns=cols), trials, pcols)


def verdict(kind: str, lo: float, hi: float) -> str:
    """What a ratio's interval says, in words: a speedup (baseline ÷ canzona) is ``faster`` or
    ``slower`` when the whole interval lies on one side of 1; an overhead (canzona ÷ adamw) is
    ``costs more`` or ``costs less``; otherwise ``not decisive``."""
    if not (lo == lo and hi == hi):  # NaN: no interval
        return "not decisive"
    above, below = lo > 1.0, hi < 1.0
    if kind == "overhead":
        return "costs more" if above else "costs less" if below else "not decisive"
    return "faster" if above else "slower" if below else "not decisive"


def verdict_lines(speedups: pd.DataFrame) -> list[dict[str, object]]:
    """Per comparison and metric, over the sweep's points: how many the ratio decides each way
    at the report's interval, with the range of the ratios (the headline's sentence)."""
    out = []
    if speedups.empty:
        return out
    for (b, m), d in speedups.groupby(["baseline", "metric"], sort=False):
        counts = d["verdict"].value_counts().to_dict()
        out.append({"baseline": b, "metric": m, "kind": d["kind"].iloc[0], "points": len(d), "counts": counts,
                    "low": float(d["value"].min()), "high": float(d["value"].max())})
    order = {b: i for i, b in enumerate([*baselines_in(speedups["baseline"].unique()), "adamw"])}
    return sorted(out, key=lambda r: (r["metric"] != "optimizer_step_ms", order.get(r["baseline"], 99)))


def _eq(series: pd.Series, value: object) -> pd.Series:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return series.isna()
    return series == value


def phase_table(trials: pd.DataFrame, per_step: pd.DataFrame) -> pd.DataFrame:
    """Per trial with steps: median over measured steps of the rank-mean of each phase (ms),
    plus ``other`` and the median max-over-ranks iteration_ms; with method and point columns."""
    pcols = trials.attrs["point_columns"]
    cols = ["trial_id", *pcols, "method", "variant", *PHASES, "other", "iteration_ms"]
    rows = []
    ok = trials[trials["source"] == "steps"]
    for _, t in ok.iterrows():
        ps = per_step[per_step["trial_id"] == t["trial_id"]]
        r = {c: t[c] for c in ["trial_id", *pcols, "method", "variant"]}
        for p in (*PHASES, "other"):
            r[p] = float(ps[f"{p}_ms_mean"].median())
        r["iteration_ms"] = float(ps["iteration_ms"].median())
        rows.append(r)
    return pd.DataFrame(rows, columns=cols)


def _at_point(df: pd.DataFrame, point: dict[str, object], cols: list[str]) -> pd.DataFrame:
    if df.empty or not cols:
        return df
    return df[np.logical_and.reduce([_eq(df[c], point[c]) for c in cols])]


def showcase(trials: pd.DataFrame) -> tuple[dict[str, object], dict[str, str]]:
    """The point shown in the per-rank plots (loads, Gantt, phases): the one where the most
    methods have usable trials (adamw matched on model and layout whatever its optimizer),
    then the most ranks, then the largest model; and for each method there the first trial
    (by id), preferring trials that recorded events. Returns (point, {method: trial_id})."""
    pcols = trials.attrs["point_columns"]
    no_opt = [c for c in pcols if not c.startswith("optimizer.")]
    ok = trials[(trials["source"] == "steps") & trials["method"].notna()]
    if ok.empty:
        return {}, {}
    non_adamw = ok[ok["method"] != "adamw"]
    base = non_adamw if len(non_adamw) else ok
    best = None
    for key, g in base.groupby(pcols, dropna=False, sort=True):
        point = dict(zip(pcols, key if isinstance(key, tuple) else (key,)))
        if len(non_adamw):
            g = pd.concat([g, _at_point(ok[ok["method"] == "adamw"], point, no_opt)])
        score = (g["method"].nunique(), float(g["n_ranks"].max()), float(np.nan_to_num(g["model_params"].max())))
        if best is None or score > best[0]:
            best = (score, point, g)
    assert best is not None
    _, point, g = best
    chosen = {}
    for m in _method_order(g["method"].unique()):
        gm = g[g["method"] == m]
        chosen[m] = str(min(zip(~gm["has_events"].astype(bool), gm["trial_id"]))[1])  # prefer trials with events
    return point, chosen


def _method_order(methods: Iterable[object]) -> list[str]:
    ms = [str(m) for m in methods if m is not None and not (isinstance(m, float) and math.isnan(m))]
    return sorted(set(ms), key=method_rank)


def baselines_in(methods: Iterable[object]) -> list[str]:
    """What canzona is compared with: the fixed baselines and every other method present but
    the reference, in ladder order."""
    present = set(_method_order(methods))
    return [m for m in _method_order([*BASELINES, *present]) if m not in ("canzona", "adamw")]


def rungs_of(methods: Iterable[object]) -> dict[str, str]:
    """Method label -> the authors' ladder name of its DP x TP pair, for those on the ladder."""
    out = {}
    for m in _method_order(methods):
        pair = pair_of(m)
        r = rung(*pair) if pair else None
        if r:
            out[m] = r
    return out


def method_order(methods: Iterable[object]) -> list[str]:
    return _method_order(methods)
