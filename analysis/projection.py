"""The report's two simulator sections: projected trials, and predicted vs measured.

- **Projected (not measured)**: trials written by the simulator (``cluster=simulate``;
  summary.json ``projected: true``) never enter the measured tables, speedups or plots. They get
  a section of their own: per point (model x optimizer x dp x tp), canzona's projected iteration
  time and optimizer step latency, its speedup over ``sync`` and ``layerwise`` (baseline ÷
  canzona) and its overhead over ``adamw``, the paper's claims (`canzona.sim.claims.PAPER_CLAIMS`)
  beside the projection at the largest model on the most GPUs, where the time goes there, and the
  inputs: the hardware (its source, stated inputs, effective rates) and the simulator's
  assumptions, as recorded in each projected trial's summary.json.
- **Predicted vs measured**: `canzona.sim.validate.compare_sweep` on the measured trials with a
  hardware file (default ``hardware/local.yaml``): per method the median absolute % error and
  the worst case of optimizer_step_ms and iteration_ms, and the trials left out and why. The
  simulator never fails the report: an exception becomes the section's message.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import Sweep, TrialRecords
from analysis.stats import (
    POINT_BASE,
    _variant,
    baselines_in,
    comparisons,
    method_order,
    point_extra_columns,
    rungs_of,
)
from canzona.plan.registry import LADDER
from canzona.records import DRYRUN_JSON, PHASES, STATUS_FILE, SUMMARY_FILE

CALIBRATE_CMD = "python -m canzona.calibrate out=hardware/local.yaml"
METRICS = ("iteration_ms", "optimizer_step_ms")
# trial settings that shape a projection, listed with its inputs
SHAPING_KEYS = ("dist.dp_collective", "optimizer.ns_dtype", "train.micro_batch", "train.seq_len",
                "bucket.size", "planner.pipeline_depth", "planner.cost", "dist.overlap_grad_reduce",
                "dist.overlap_param_gather", "train.dtype", "optimizer.clip_grad", "train.grad_accum",
                "train.recompute", "parallel.sequence_parallel", "model.vocab", "model.tied_embeddings")
SYNC_NOTE = (
    "The sync baseline (0_0-0_0) is the fully synchronous run: plain DDP, every DP rank computes every "
    "matrix's update and every TP rank all-gathers and recomputes it (planned imbalance about dp × tp), "
    "with full-matrix optimizer state on every TP rank (it fits no 80 GB GPU at 32B). The authors' own "
    "default Muon run is atomic (1_0-0_0): ZeRO-1 with whole-tensor ownership and TP-synchronous compute. "
    "A projected ratio is one iteration of one micro-batch per rank on the hardware's device: with gradient "
    "accumulation (several micro-batches per iteration, as large-batch training runs) forward and backward "
    "grow and the iteration speedup over sync shrinks toward the optimizer step's share; the assumptions "
    "below list everything the projection includes."
)


def is_projected(t: TrialRecords) -> bool:
    return t.summary.get("projected") is True or t.status.get("projected") is True


def _nan(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


# ------------------------------------------------------------------------------ projected


def projected_trials(sweep: Sweep) -> pd.DataFrame:
    """One row per projected trial, in the columns of `stats.trial_table` (values from
    summary.json: one simulated iteration, so median = p10 = p90) plus ``projected``,
    ``hardware``, ``hardware_fingerprint``, the phases (``phase.<name>``, mean over ranks) and
    ``param_sync_peer_ms_mean`` (of ``phase.param_sync``, the wait for peers still in their step)."""
    df = sweep.trials_df.copy()
    extra: list[dict[str, Any]] = []
    for t in sweep.trials:
        s = t.summary
        hw = s.get("hardware") or {}
        world = s.get("world") or {}
        r: dict[str, Any] = {"trial_id": t.trial_id, "projected": True, "hardware": hw.get("name"),
                             "hardware_fingerprint": hw.get("fingerprint"),
                             "source": "projection" if s.get("iteration_ms") is not None else None,
                             "n_steps": 1 if s.get("iteration_ms") is not None else 0,
                             "n_ranks": world.get("world_size") or 0,
                             "param_sync_ms_median": _nan(s.get("param_sync_ms")),
                             "grad_reduce_ms_median": _nan(s.get("grad_reduce_ms")),
                             "param_sync_peer_ms_mean": _nan(s.get("param_sync_peer_ms_mean")),
                             "param_gather_ms": _nan(s.get("param_gather_ms")),
                             "param_sync_bound_ms": _nan(s.get("param_sync_bound_ms")),
                             "forward_ms": _nan(s.get("forward_ms")),
                             "planned_imbalance": _nan(((s.get("plan") or {}).get("imbalance") or {}).get("compute")),
                             "measured_imbalance": math.nan}
        for m in METRICS:
            v = _nan(s.get(m))
            r[f"{m}_median"] = r[f"{m}_p10"] = r[f"{m}_p90"] = v
        for p in PHASES:
            r[f"phase.{p}"] = _nan((s.get("phases_ms_mean") or {}).get(p))
        extra.append(r)
    out = df.merge(pd.DataFrame(extra), on="trial_id", how="left") if extra else df
    out["usable"] = out["source"].notna() if "source" in out else False
    return out


def _points(df: pd.DataFrame, config_columns: list[str]) -> list[str]:
    pcols = [*POINT_BASE, *point_extra_columns(df, config_columns)]
    if df["hardware"].astype(str).nunique() > 1:
        pcols = ["hardware", *pcols]
    return pcols


def _size_order(df: pd.DataFrame) -> dict[str, float]:
    return df.groupby("model")["model_params"].max().fillna(float("inf")).to_dict()


def speedup_rows(df: pd.DataFrame, pcols: list[str]) -> list[dict[str, Any]]:
    """The projected `stats.comparisons` (point values, no interval) per point x canzona variant:
    canzona's values, and per baseline (and variant) its values and the ratios (speedup =
    baseline ÷ canzona; overhead vs adamw = canzona ÷ adamw)."""
    df.attrs["point_columns"] = pcols
    first = {tid: i for i, tid in enumerate(df["trial_id"])}
    rows = []
    for c in comparisons(df):
        cells = {b: [{"baseline": b, "variant": cell.variant, "trial_ids": cell.trial_ids,
                      "values": {m: r.baseline_median for m, r in cell.ratios.items()},
                      "ratio": {m: r.value for m, r in cell.ratios.items()}} for cell in cs]
                 for b, cs in c.cells.items()}
        rows.append({"point": {k: _clean(v) for k, v in c.point.items()}, "variant": c.variant,
                     "canzona": c.canzona, "trial_ids": list(c.trials["trial_id"]),
                     "gpus": int(c.trials["n_ranks"].max()), "model_params": float(c.trials["model_params"].max()),
                     "cells": cells})
    rows.sort(key=lambda r: first[r["trial_ids"][0]])  # ties of the order below: the trials' order
    order = _size_order(df)
    rows.sort(key=lambda r: (order.get(r["point"].get("model"), float("inf")), str(r["point"].get("model")),
                             r["gpus"], r["point"].get("parallel.tp") or 0, str(r["point"].get("optimizer.name")),
                             str(r["variant"])))
    return rows


def behind_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where canzona does not lead: every projected point x baseline (not the adamw reference,
    whose ratio is an overhead) x metric whose speedup is below 1, slowest first."""
    out = [{"id": r["id"], "point": r["point"], "variant": r["variant"], "gpus": r["gpus"], "baseline": b,
            "baseline_variant": c["variant"], "metric": m, "ratio": c["ratio"][m],
            "canzona_ms": r["canzona"][m], "baseline_ms": c["values"][m]}
           for r in rows for b, cells in r["cells"].items() if b != "adamw"
           for c in cells for m in METRICS if c["ratio"][m] < 1]
    return sorted(out, key=lambda x: x["ratio"])


def _first(cells: list[dict[str, Any]] | None, metric: str) -> float:
    return cells[0]["ratio"][metric] if cells else math.nan


def claims_view(rows: list[dict[str, Any]], claims: dict[str, Any] | None,
                fits: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The paper's claims beside the projection: at the most GPUs projected, the largest model
    (one row per layout), and the range over every model at that GPU count; Muon when present.
    One line per baseline and metric, the paper's figure beside every one (which run the paper's
    ratios are against is not stated in what is readable of it); ``fits``: trial id -> its dry
    run (`dry_run_fits`), so a baseline that fits no GPU is labelled so."""
    if not rows:
        return None
    muon = [r for r in rows if r["point"].get("optimizer.name") == "muon"] or rows
    gpus = max(r["gpus"] for r in muon)
    at = [r for r in muon if r["gpus"] == gpus]
    largest = max(r["model_params"] if not math.isnan(r["model_params"]) else -1 for r in at)
    top = [r for r in at if (r["model_params"] if not math.isnan(r["model_params"]) else -1) == largest]
    lines = []
    present = [b for b in dict.fromkeys(b for r in at for b in r["cells"]) if b != "adamw"]
    rungs = rungs_of(present)
    for b in baselines_in(present):
        for m, claim_key in (("iteration_ms", "iteration_speedup"), ("optimizer_step_ms", "optimizer_step_speedup")):
            allv = [v for v in (_first(r["cells"].get(b), m) for r in at) if not math.isnan(v)]
            lines.append({
                "baseline": b, "rung": rungs.get(b), "metric": m,
                "paper": (claims or {}).get(claim_key),
                "top": [{"layout": f"dp {r['point']['parallel.dp']} × tp {r['point']['parallel.tp']}",
                         "variant": r["variant"], "value": _first(r["cells"].get(b), m),
                         "fits": _fits_of(r["cells"].get(b), fits)} for r in top],
                "range": (min(allv), max(allv)) if allv else None,
            })
    return {"gpus": gpus, "model": top[0]["point"].get("model"), "optimizer": top[0]["point"].get("optimizer.name"),
            "n_models": len({r["point"].get("model") for r in at}), "lines": lines, "claims": claims}


def _fits_of(cells: list[dict[str, Any]] | None, fits: dict[str, dict[str, Any]] | None) -> dict[str, Any] | None:
    """The dry run of a baseline cell's (first) trial, if one was recorded."""
    if not cells or not fits:
        return None
    return next((fits[t] for t in cells[0]["trial_ids"] if t in fits), None)


def dry_run_fits(sweep_path: Path, limits: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """Trial id -> {"fits": bool, "peak_gib", "limit_gib"} from the dry run of the same sweep and
    sweep profile (``cluster=dryrun`` writes ``<sweep>[-<profile>]-dryrun`` beside the projection's
    ``...-sim-<hardware>``; a trial keeps its id there, its config being the same). ``limits``:
    trial id -> its ``dist.dry_run_memory_gb`` (what the dry run checked against when its
    report does not say). Trials without a dry run are left out."""
    name = sweep_path.resolve().name
    if "-sim-" not in name:
        return {}
    folder = sweep_path.resolve().parent / (name.rsplit("-sim-", 1)[0] + "-dryrun")
    out: dict[str, dict[str, Any]] = {}
    for tid, config_limit in limits.items():
        status = _read_json(folder / tid / STATUS_FILE)
        if not status or status.get("status") not in ("done", "failed"):
            continue
        summary = _read_json(folder / tid / SUMMARY_FILE) or {}
        report = _read_json(folder / tid / DRYRUN_JSON) or {}
        peaks = summary.get("peak_gib") or [r["memory"]["peak_bytes"] / 2**30 for r in report.get("ranks", [])]
        error = str(status.get("error") or "")
        if status["status"] == "failed" and "run out of memory" not in error:
            continue  # failed for another reason: says nothing about memory
        limit = (report.get("memory_gb") or {}).get("limit") or _limit_of(error) or config_limit
        out[tid] = {"fits": status["status"] == "done", "peak_gib": max(peaks) if peaks else None, "limit_gib": limit}
    return out


def _limit_of(error: str) -> float | None:
    m = re.search(r"dist\.dry_run_memory_gb=([0-9.]+)", error)
    return float(m.group(1)) if m else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ladder_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per point with rungs of the authors' ladder: each rung's projected optimizer step and
    iteration, and what the feature that rung adds removes from them (the rung before it minus
    the rung; negative: the feature costs time)."""
    out = []
    for r in rows:
        values: dict[str, dict[str, Any]] = {}
        for b, cells in r["cells"].items():
            rg = rungs_of([b]).get(b)
            if rg and cells:
                values[rg] = {"method": b, **cells[0]["values"]}
        if r["variant"] or not values:
            continue
        values["1_1-1_1"] = {"method": "canzona", **r["canzona"]}
        steps = []
        for rung_name, before, feature in LADDER:
            if rung_name not in values:
                continue
            v = values[rung_name]
            prev = values.get(before) if before else None
            steps.append({"rung": rung_name, "method": v["method"], "feature": feature, "before": before,
                          **{m: v[m] for m in METRICS},
                          **{f"removed_{m}": (prev[m] - v[m]) if prev else None for m in METRICS}})
        out.append({"id": r["id"], "point": r["point"], "gpus": r["gpus"], "steps": steps})
    return out


@functools.cache
def published_band() -> dict[str, Any] | None:
    """The projection's error bar from the published GPU runs (`canzona.sim.published`): the band
    in one line, per hardware file, and the band of projected ratios; None if it cannot be made
    (the report still renders)."""
    try:
        from canzona.sim.published import band, band_line, project_points

        results = project_points()
    except Exception:  # noqa: BLE001 - the band is context; never fail the report over it
        return None
    b = band(results)
    return {"line": band_line(b), "band": b, "n_points": len(results)}


def ratio_band(value: float, published: dict[str, Any] | None) -> tuple[float, float] | None:
    """Where a measured ratio would lie if a projected ratio ``value`` were off as the published
    pairs' projected ratios are (projected ÷ measured in [min, max]): ``value / max .. value / min``."""
    r = (published or {}).get("band", {}).get("ratios", {})
    if not r.get("points") or value is None or math.isnan(value):
        return None
    return value / r["max"], value / r["min"]


def _paper_claims() -> dict[str, Any] | None:
    try:
        from canzona.sim.claims import PAPER_CLAIMS
    except Exception:  # noqa: BLE001 - the claims are a label; never fail the report over them
        return None
    return dict(PAPER_CLAIMS)


def _assumptions(trials: list[TrialRecords]) -> list[dict[str, Any]]:
    seen: dict[str, int] = {}
    for t in trials:
        for a in t.summary.get("assumptions") or []:
            seen[str(a)] = seen.get(str(a), 0) + 1
    return [{"text": a, "count": n} for a, n in seen.items()]


def _hardware(trials: list[TrialRecords]) -> list[dict[str, Any]]:
    """The hardware the trials were projected on, one entry per content (name and fingerprint)."""
    out: dict[tuple, dict[str, Any]] = {}
    for t in trials:
        p = t.summary.get("hardware") or {}
        key = (p.get("name"), p.get("fingerprint"))
        if key not in out:
            inputs = t.summary.get("hardware_inputs") or {}
            out[key] = {"describe": p, "inputs": inputs, "n_trials": 0}
        out[key]["n_trials"] += 1
    return list(out.values())


def _shaping(df: pd.DataFrame) -> dict[str, str]:
    out = {}
    for k in SHAPING_KEYS:
        if k in df:
            vals = sorted({str(v) for v in df[k] if v is not None and not (isinstance(v, float) and math.isnan(v))})
            if vals:
                out[k] = ", ".join(vals)
    return out


def _phases_at(df: pd.DataFrame, view: dict[str, Any] | None, pcols: list[str]) -> list[dict[str, Any]]:
    """Phases (mean over ranks, ms) of every method at the claims' point, largest layout first."""
    if not view:
        return []
    sel = df[df["usable"] & (df["model"] == view["model"]) & (df["n_ranks"] == view["gpus"])]
    sel = sel[(sel["optimizer.name"] == view["optimizer"]) | (sel["method"] == "adamw")]
    rows = []
    for _, r in sel.iterrows():
        rows.append({"method": r["method"], "variant": r.get("variant") or "", "trial_id": r["trial_id"],
                     "layout": f"dp {r['parallel.dp']} × tp {r['parallel.tp']}",
                     "phases": {p: _clean(r[f"phase.{p}"]) for p in PHASES},
                     "param_sync_peer_ms": _clean(r["param_sync_peer_ms_mean"]),
                     "param_gather_ms": _clean(r["param_gather_ms"]),
                     "param_sync_bound_ms": _clean(r["param_sync_bound_ms"]),
                     "forward_ms": _clean(r["forward_ms"]),
                     "iteration_ms": _clean(r["iteration_ms_median"]),
                     "optimizer_step_ms": _clean(r["optimizer_step_ms_median"])})
    order = {m: i for i, m in enumerate(method_order(sel["method"].unique()))}
    rows.sort(key=lambda r: (r["layout"], order.get(r["method"], 99)))
    return rows


def projected_section(sweep: Sweep) -> dict[str, Any]:
    """Everything the template's projected section shows, plus ``trials`` (a DataFrame) and
    ``table`` (one flat row per point x canzona variant x baseline, for projected.csv)."""
    df = projected_trials(sweep)
    pcols = _points(df, sweep.config_columns)
    df["variant"] = df.apply(lambda row: _variant(row, df, sweep.config_columns), axis=1) if len(df) else []
    df.attrs["point_columns"] = pcols
    rows = speedup_rows(df, pcols)
    for i, r in enumerate(rows):
        r["id"] = f"p{i:04d}"
    claims = _paper_claims()
    fits = dry_run_fits(sweep.path, {t.trial_id: (t.config.get("dist") or {}).get("dry_run_memory_gb")
                                     for t in sweep.trials})
    view = claims_view(rows, claims, fits)
    published = published_band()
    for line in (view or {}).get("lines", []):
        for x in line["top"]:
            x["band"] = ratio_band(x["value"], published)
    flat = []
    for r in rows:
        for b, cells in r["cells"].items():
            for c in cells:
                for m in METRICS:
                    flat.append({"id": r["id"], **r["point"], "canzona_variant": r["variant"], "gpus": r["gpus"],
                                 "baseline": b, "baseline_variant": c["variant"], "metric": m,
                                 "kind": "overhead" if b == "adamw" else "speedup", "value": c["ratio"][m],
                                 "canzona_ms": r["canzona"][m], "baseline_ms": c["values"][m],
                                 "canzona_trials": " ".join(r["trial_ids"]), "baseline_trials": " ".join(c["trial_ids"])})
    return {
        "trials": df,
        "table": pd.DataFrame(flat),
        "rows": rows,
        "pcols": pcols,
        "extra_pcols": [c for c in pcols if c not in POINT_BASE],
        "claims": claims,
        "view": view,
        "baselines": baselines_in(b for r in rows for b in r["cells"] if b != "adamw"),
        "rungs": rungs_of(b for r in rows for b in r["cells"]),
        "ladder": ladder_rows(rows),
        "behind": behind_rows(rows),
        "n_dry_run": len(fits),
        "phases": _phases_at(df, view, pcols),
        "phase_names": list(PHASES),
        "hardware": _hardware(sweep.trials),
        "assumptions": _assumptions(sweep.trials),
        "n_trials": len(sweep.trials),
        "shaping": _shaping(df),
        "sync_note": SYNC_NOTE,
        "published": published,
        "hardware_names": sorted({h["describe"].get("name") for h in _hardware(sweep.trials)} - {None}),
    }


# ------------------------------------------------------------------------------ predicted vs measured


def resolve_hardware(hardware: Any) -> Any:
    """``"auto"``: hardware/local.yaml if it exists, else None; ``"none"``/None: None."""
    if isinstance(hardware, str) and hardware.lower() == "auto":
        from canzona.hardware import local_file

        local = local_file()
        return str(local) if local is not None else None
    if hardware is None or (isinstance(hardware, str) and hardware.lower() in ("", "none")):
        return None
    return hardware


def predicted_section(sweep: Sweep, measured_ids: set[str], hardware: Any) -> dict[str, Any]:
    """`compare_sweep` over the measured trials, summarised for the template. Never raises:
    ``error`` holds what went wrong. ``result`` is compare_sweep's output (for CSV and tests)."""
    out: dict[str, Any] = {"hardware_arg": None if hardware is None else str(hardware) if not isinstance(hardware, dict)
                           else f"(hardware {hardware.get('name')!r} given as a mapping)",
                           "calibrate_cmd": CALIBRATE_CMD, "error": None, "result": None}
    if hardware is None:
        return out
    try:
        from canzona.sim.validate import MIN_MEASURED_MS, compare_sweep

        res = compare_sweep(sweep.path, hardware)
    except Exception as e:  # noqa: BLE001 - the simulator must never fail the report
        out["error"] = f"{type(e).__name__}: {str(e).strip() or repr(e)}"
        return out
    rows = [r for r in res["trials"] if r["trial"] in measured_ids]
    errors = [e for e in res["errors"] if e["trial"] in measured_ids]
    compared = {r["trial"] for r in rows} | {e["trial"] for e in errors}
    left_out = [{"trial": tid, "reason": "recorded plan differs from today's planner (plan_matches is false): its "
                 "prediction would be of a different plan"} for tid in res["excluded"] if tid in measured_ids]
    left_out += [{"trial": e["trial"], "reason": f"could not simulate: {e['error']}"} for e in errors]
    by_id = {t.trial_id: t for t in sweep.trials}
    for tid in sorted(measured_ids - compared):
        st = by_id[tid].state if tid in by_id else "unknown"
        left_out.append({"trial": tid, "reason": f"not a finished trial (status {st})" if st != "done"
                         else "no config.yaml / summary.json to predict from"})
    for r in rows:
        if r.get("plan_matches") is False:
            continue
        for m in METRICS:
            if r.get(f"{m}_error_pct") is None:
                meas = r.get(f"{m}_measured")
                why = "not measured" if meas is None else f"measured {meas:.3g} ms < {MIN_MEASURED_MS} ms"
                left_out.append({"trial": r["trial"], "reason": f"{m}: no error figure ({why})"})
    out.update(result=res, hardware=res["hardware"], by_method=res["by_method"], overall=res["overall"],
               per_trial=res["per_trial"],
               rows=sorted(rows, key=lambda r: (r["method"], r["trial"])), left_out=left_out,
               min_measured_ms=MIN_MEASURED_MS, phase_columns=_phase_columns(res["per_trial"]["trials"]))
    return out


def _phase_columns(trials: list[dict[str, Any]], least_ms: float = 0.05) -> list[str]:
    """The phases (in the timer's order) that any trial predicts or measures, as the mean over
    its ranks, at ``least_ms`` or more: the columns of the per-phase table."""
    def shows(ph: str) -> bool:
        return any(max((t.get("phases") or {}).get(ph, {}).get(k) or 0.0 for k in ("predicted_mean", "measured_mean"))
                   >= least_ms for t in trials)
    return [ph for ph in PHASES if shows(ph)]
