"""``python -m analysis.report results/<sweep> [out=DIR] [hardware=H]``: (re)build a sweep's HTML report.

Reads only the trial records under the sweep folder (canzona/records.py) and writes, into
``DIR`` (default ``results/<sweep>/report/``):

- ``index.html``   self-contained report (plots inlined as SVG data URIs);
- ``trials.csv``   one row per trial: status, error, missing records, every config value
  (``parallel.dp``...), medians/p10/p90, imbalance;
- ``steps.csv``    one row per trial x rank x step (warm-up included, ``measured`` flag);
- ``latencies.csv`` per point x method: pooled medians/p10/p90 and trial counts;
- ``speedups.csv`` speedups over sync/layerwise and overhead over adamw with 90% CIs;
- ``phases.csv``, ``rank_loads.csv``; ``peers.csv`` (a sweep with peer trials: each peer beside
  its mirror and canzona per layout, analysis/peers.py); ``*.parquet`` of trials and steps if pyarrow imports;
- ``traces/<trial_id>.json`` Chrome traces (Perfetto), linked from the report;
- ``projected.csv`` (projected trials: canzona vs each baseline per point, analysis/projection.py)
  and ``predicted.csv`` (predicted vs measured per trial, `canzona.sim.validate.to_frame`).

Projected trials (``cluster=simulate``) are kept out of every measured table, plot and CSV
above (trials.csv and steps.csv list them, with ``projected`` true) and get their own section.
``hardware=NAME|PATH`` picks the hardware file the measured trials are predicted with (default
hardware/local.yaml if it exists, ``none`` to skip).

Prints the report's path as its last line. Exit 2 with a one-line error when the folder does
not exist or holds no trials. The sweep launcher calls `build_report(sweep_dir) -> Path`.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import importlib.metadata
import math
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import pandas as pd
import yaml

from analysis import peers, plots, projection, stats, timeline
from analysis.load import Sweep, load_sweep, subset
from canzona.cli import run_command, usage
from canzona.errors import ConfigError
from canzona.overrides import Renamed, build, split_argv
from canzona.records import atomic_write_text
from canzona.schema_doc import setting

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "reports" / "templates"
TEMPLATE = "report.html.j2"
STEP_CONFIG_COLUMNS = ("method", "model", "optimizer.name", "parallel.dp", "parallel.tp", "train.seed")


# ---------------------------------------------------------------------------- formatting


def fmt(v: Any, digits: int = 2) -> str:
    """The one number format of the report (tests format CSV values with it to compare)."""
    if v is None:
        return "–"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f):
        return "–"
    return f"{f:,.{digits}f}"


def _num(v: Any) -> str:
    """Full-precision value for a data-value attribute (round-trips through float())."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(f) else repr(f)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in r.items()} for r in df.to_dict("records")]


def _data_uri(svg: str | None) -> str | None:
    if svg is None:
        return None
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def setting_text(v: Any) -> str:
    """A config value in a table cell: unset (None / NaN: the key's default) as "default", a
    whole number pandas made a float (a column with unset cells) as the integer."""
    if v is None or (isinstance(v, float) and v != v):
        return "default"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _wbr(v: Any) -> markupsafe.Markup:
    """Escaped text with a line-break opportunity after ``+ _ . , /`` (method labels such as
    zero1_atomic+async_balanced wrap there instead of widening a column)."""
    return markupsafe.Markup(re.sub(r"([+_.,/])", r"\1<wbr>", str(markupsafe.escape(str(v)))))


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_head() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------- tables


def _headline_rows(speedups: pd.DataFrame, groups: pd.DataFrame, pcols: list[str]) -> list[dict[str, Any]]:
    """One row per canzona group: its latencies and, per comparison x metric, the list of
    ratio cells (one per baseline variant)."""
    rows = []
    if speedups.empty:
        return rows
    for key, d in speedups.groupby([*pcols, "canzona_variant"], dropna=False, sort=False):
        point = dict(zip([*pcols, "canzona_variant"], key))
        g = groups[(groups["method"] == "canzona") & (groups["variant"] == point["canzona_variant"])]
        for c in pcols:
            g = g[stats._eq(g[c], point[c])]
        cells: dict[str, list[dict[str, Any]]] = {}
        for _, r in d.iterrows():
            cells.setdefault(f"{r['baseline']}|{r['metric']}", []).append(_clean_row(r))
        ns = {b: int(d.loc[d["baseline"] == b, "n_trials_baseline"].max()) for b in d["baseline"].unique()}
        rows.append({"point": {k: _clean(v) for k, v in point.items()}, "cells": cells, "n": ns,
                     "canzona": _clean_row(g.iloc[0]) if len(g) else None})
    return rows


def _clean_row(r: pd.Series) -> dict[str, Any]:
    return {k: _clean(v) for k, v in r.items()}


def _problems(sweep: Sweep, trials: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    rows = {r["trial_id"]: r for _, r in trials.iterrows()}
    for t in sweep.trials:
        row = rows[t.trial_id]
        if row["status"] == "done" and not row["missing"] and not t.problems and row["source"] in ("steps", "projection"):
            continue
        what = []
        if row["missing"]:
            what.append(f"missing: {row['missing']}")
        if t.problems:
            what.extend(t.problems)
        if row["status"] == "done" and row["source"] == "summary":
            what.append("no measured steps: summary.json values shown, excluded from speedups")
        elif row["status"] == "done" and not row["source"]:
            what.append("no usable timings")
        out.append({"trial_id": t.trial_id, "status": row["status"], "method": _clean(row.get("method")),
                    "model": _clean(row.get("model")), "error": _clean(t.status.get("error")), "notes": "; ".join(what)})
    return out


# ---------------------------------------------------------------------------- build


def _measured(sweep: Sweep, out_dir: Path) -> dict[str, Any]:
    """The measured part of the report (headline, latencies, plots, per-rank views) and its
    CSV exports; ``_trials`` is the trial table."""
    per_step = stats.step_values(sweep.steps_df)
    trials = stats.trial_table(sweep, per_step)
    pcols: list[str] = trials.attrs["point_columns"]
    groups = stats.group_table(trials, per_step)
    speedups = stats.speedup_table(trials, per_step)
    phases = stats.phase_table(trials, per_step)
    point, chosen = stats.showcase(trials)

    # ids that tie the HTML cells to CSV rows
    groups.insert(0, "id", [f"g{i:04d}" for i in range(len(groups))])
    speedups.insert(0, "id", [f"s{i:04d}" for i in range(len(speedups))])

    # per-rank loads of every trial with steps or a plan
    loads_all = []
    for t in sweep.trials:
        ld = stats.rank_loads(sweep, t.trial_id)
        if not ld.empty:
            loads_all.append(ld.assign(trial_id=t.trial_id))
    rank_loads = pd.concat(loads_all, ignore_index=True) if loads_all else pd.DataFrame(
        columns=["trial_id", "rank", "dp_rank", "tp_rank", "planned", "measured_ms", "planned_rel", "measured_rel"])
    rank_loads = rank_loads[["trial_id", *[c for c in rank_loads.columns if c != "trial_id"]]]
    speedups.to_csv(out_dir / "speedups.csv", index=False)
    groups.to_csv(out_dir / "latencies.csv", index=False)
    phases.to_csv(out_dir / "phases.csv", index=False)
    rank_loads.to_csv(out_dir / "rank_loads.csv", index=False)
    peer = peers.peer_section(sweep, trials, per_step)
    if peer is not None:
        peer.pop("csv").to_csv(out_dir / "peers.csv", index=False)

    # traces
    traces: dict[str, str] = {}
    for t in sweep.trials:
        rel = f"traces/{t.trial_id}.json"
        if timeline.write_trace(t, out_dir / rel):
            traces[t.trial_id] = rel

    # per-rank views of the showcase point
    loads = {m: stats.rank_loads(sweep, tid) for m, tid in chosen.items()}
    timelines: dict[str, tuple[list[dict[str, Any]], str]] = {}
    gantt_info = []
    for m, tid in chosen.items():
        tr = sweep.trial(tid)
        step = timeline.representative_step(tr)
        if step is None:
            gantt_info.append({"method": m, "trial_id": tid, "step": None})
            continue
        evs, opt_only = timeline.step_events(tr, step)
        what = "optimizer step" if opt_only else "whole iteration (no optimizer events recorded)"
        timelines[m] = (evs, f"{m} — {tid}, step {step} ({what})")
        gantt_info.append({"method": m, "trial_id": tid, "step": step})
    show_phases = phases[phases["trial_id"].isin(list(chosen.values()))]
    show_phases_tbl = show_phases.groupby("method")[[*stats.PHASES, "other", "iteration_ms"]].mean()
    show_phases_tbl = show_phases_tbl.reindex(stats.method_order(show_phases_tbl.index)).reset_index()

    figures = {
        "latency": _data_uri(plots.latency_vs_size(groups, pcols)),
        "speedup": _data_uri(plots.speedup_bars(speedups, pcols)),
        "loads": _data_uri(plots.rank_load_bars(loads, chosen)),
        "phases": _data_uri(plots.phase_stack(show_phases)),
        "gantt": _data_uri(plots.gantt(timelines)),
    }
    return {
        "_trials": trials,
        "pcols": pcols,
        "extra_pcols": [c for c in pcols if c not in stats.POINT_BASE],
        "headline": _headline_rows(speedups, groups, pcols),
        "baselines": stats.baselines_in(speedups["baseline"].unique() if len(speedups) else []),
        "verdicts": stats.verdict_lines(speedups),
        "n_configs": int(trials["config_id"].nunique()) if len(trials) else 0,
        "groups": _records(groups),
        "figures": figures,
        "showcase_point": {k: _clean(v) for k, v in point.items()},
        "chosen": chosen,
        "gantt_info": gantt_info,
        "load_rows": {m: _records(d) for m, d in loads.items()},
        "phases_tbl": _records(show_phases_tbl),
        "traces": traces,
        "peers": peer,
    }


def _no_measured() -> dict[str, Any]:
    return {"_trials": None, "pcols": list(stats.POINT_BASE), "extra_pcols": [], "headline": [], "verdicts": [],
            "n_configs": 0,
            "baselines": list(stats.BASELINES), "groups": [],
            "figures": dict.fromkeys(("latency", "speedup", "loads", "phases", "gantt")), "showcase_point": {},
            "chosen": {}, "gantt_info": [], "load_rows": {}, "phases_tbl": [], "traces": {}, "peers": None}


def _keep_hardware(hardware: Any, dest: Path) -> None:
    """A copy of the hardware file the measured trials were predicted with, beside the report: a
    machine's cached calibration is replaced by its next one, and the prediction can be checked
    again from the sweep alone (``python -m canzona.sim.validate across``)."""
    from canzona.hardware import load_hardware

    hw = load_hardware(hardware)
    text = Path(hw.path).read_text() if hw.path and Path(hw.path).is_file() else yaml.safe_dump(hw.raw, sort_keys=False)
    atomic_write_text(dest, text)


def _same_file(path: Path, hardware: Any) -> bool:
    """Whether ``hardware`` (a name, path or mapping) is the file at ``path``."""
    if not isinstance(hardware, (str, Path)) or not path.is_file():
        return False
    given = Path(hardware).expanduser()
    return given.is_file() and given.resolve() == path.resolve()


def build_report(sweep_dir: str | Path, out: str | Path | None = None, hardware: Any = "auto") -> Path:
    """Build the report of `sweep_dir` into `out` (default ``<sweep_dir>/report``); return the
    path of index.html. Raises `ConfigError` if the folder is missing or has no trials.

    Projected trials (summary.json ``projected: true``, from ``cluster=simulate``) get a section
    of their own and never enter the measured tables. `hardware` (a hardware file's name, YAML
    path or mapping; ``"auto"``: hardware/local.yaml if it exists; None: none) is what the
    predicted-vs-measured section simulates the measured trials with."""
    sweep = load_sweep(sweep_dir)
    out_dir = Path(out) if out is not None else sweep.path / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    predicted_with = projection.resolve_hardware(hardware)
    for stale in ("speedups.csv", "latencies.csv", "phases.csv", "rank_loads.csv", "projected.csv", "predicted.csv",
                  "peers.csv", "hardware.yaml"):
        if stale == "hardware.yaml" and _same_file(out_dir / stale, predicted_with):
            continue  # the kept copy, given back to predict with again: an input, not a stale output
        (out_dir / stale).unlink(missing_ok=True)  # a rebuild leaves no table of another content

    proj_ids = {t.trial_id for t in sweep.trials if projection.is_projected(t)}
    meas_ids = {t.trial_id for t in sweep.trials} - proj_ids
    measured = subset(sweep, meas_ids) if proj_ids else sweep
    ctx = _measured(measured, out_dir) if meas_ids else _no_measured()
    parts = [ctx.pop("_trials")] if meas_ids else []
    proj = None
    if proj_ids:
        proj = projection.projected_section(subset(sweep, proj_ids))
        proj["figures"] = {"ladder": _data_uri(plots.ladder_bars(proj["ladder"]))}
        parts.append(proj.pop("trials"))
        proj.pop("table").to_csv(out_dir / "projected.csv", index=False)
    pred = None
    if meas_ids:
        pred = projection.predicted_section(measured, meas_ids, predicted_with)
        if pred.get("result"):
            from canzona.sim.validate import to_frame

            to_frame(pred["result"]).to_csv(out_dir / "predicted.csv", index=False)
            _keep_hardware(predicted_with, out_dir / "hardware.yaml")
        pred.pop("result", None)

    # every trial, in folder order, measured and projected
    trials = pd.concat([p for p in parts if p is not None], ignore_index=True)
    trials["projected"] = trials["trial_id"].isin(proj_ids)
    order = {t.trial_id: i for i, t in enumerate(sweep.trials)}
    trials = trials.sort_values("trial_id", key=lambda s: s.map(order)).reset_index(drop=True)

    # CSV (and parquet) exports
    steps_out = sweep.steps_df
    meta_cols = [c for c in STEP_CONFIG_COLUMNS if c in trials]
    steps_out = steps_out.merge(trials[["trial_id", *meta_cols]], on="trial_id", how="left")
    trials_out = trials.drop(columns=["usable"])
    trials_out.to_csv(out_dir / "trials.csv", index=False)
    steps_out.to_csv(out_dir / "steps.csv", index=False)
    try:
        import pyarrow  # noqa: F401

        trials_out.astype({c: str for c in trials_out.columns if trials_out[c].dtype == object}).to_parquet(out_dir / "trials.parquet")
        steps_out.to_parquet(out_dir / "steps.parquet")
    except ImportError:
        pass
    except Exception as e:  # parquet is a convenience: never fail the report over it
        print(f"warning: parquet export skipped: {type(e).__name__}: {e}", file=sys.stderr)

    # provenance
    ok_sum = [t.summary for t in sweep.trials if t.summary]
    prov = {
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "sweep_path": str(sweep.path.resolve()),
        "command": "python -m analysis.report " + html.escape(str(sweep_dir)),
        "git_records": sorted({str(s.get("versions", {}).get("git")) for s in ok_sum if s.get("versions", {}).get("git")}),
        "git_analysis": _git_head(),
        "versions": sorted({tuple(sorted((k, str(v)) for k, v in (s.get("versions") or {}).items() if k != "git"))
                            for s in ok_sum if s.get("versions")}),
        "hosts": sorted({str(s.get("host")) for s in ok_sum if s.get("host")}),
        "devices": sorted({f"{(s.get('world') or {}).get('device')} / {(s.get('world') or {}).get('backend')}"
                           for s in ok_sum if s.get("world")}),
        "analysis_versions": {"python": platform.python_version(), **{p: _version(p) for p in ("pandas", "numpy", "matplotlib", "seaborn", "jinja2")}},
        "sweep_config": sweep.sweep_config,
        "invocations": sweep.invocations,
    }
    placed = [g for g in sweep.invocations if g["id"] is not None]
    resumed = {"n": len(placed), "at_least": any(not g["exact"] for g in placed)} if len(placed) > 1 else None
    status_counts = trials["status"].value_counts().reindex(["done", "failed", "running", "incomplete", "unknown"]).dropna()

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["num"] = _num
    env.filters["wbr"] = _wbr
    env.filters["setting"] = setting_text
    env.filters["pct"] = lambda v: "–" if v is None or v != v else f"{float(v):.1f}%"
    env.filters["spct"] = lambda v: "–" if v is None or v != v else f"{float(v):+.1f}%"
    env.filters["yaml"] = lambda v: yaml.safe_dump(v, sort_keys=False, allow_unicode=True, width=100).rstrip()
    html_text = env.get_template(TEMPLATE).render(
        sweep_name=sweep.path.resolve().name,
        **ctx,
        trials=_records(trials),
        problems=_problems(sweep, trials),
        prov=prov,
        status_counts={str(k): int(v) for k, v in status_counts.items()},
        n_trials=len(trials),
        resumed=resumed,
        n_projected=len(proj_ids),
        n_measured=len(meas_ids),
        methods_present=stats.method_order(trials["method"].dropna().unique()),
        rungs=stats.rungs_of(trials["method"].dropna().unique()),
        ci=f"{int(stats.CI[1] - stats.CI[0])}%",
        n_boot=stats.N_BOOT,
        phase_names=[*stats.PHASES, "other"],
        proj=proj,
        pred=pred,
    )
    index = out_dir / "index.html"
    atomic_write_text(index, html_text)
    for f in [index, *(out_dir / rel for rel in ctx["traces"].values())]:
        f.chmod(0o644)  # atomic writes come out 0600; the report is meant to be shared
    return index


@dataclass
class ReportArgs:
    """The report command's ``key=value`` settings."""

    out: str | None = setting(None, "output folder; null: <sweep_dir>/report")
    hardware: str | None = setting("auto", "hardware file (a name under hardware/ or a YAML path) of the "
                                           "predicted-vs-measured section; auto: hardware/local.yaml if it "
                                           "exists; none: no prediction")


# The command's keys that were renamed: refused with one line naming the new one.
RENAMED = {"profile": Renamed("hardware", "the hardware file of the predicted-vs-measured section: a name under "
                                          "hardware/, a YAML path, auto or none")}




def main(argv: list[str] | None = None) -> int:
    return run_command("analysis.report", _report, argv)


def _report(argv: list[str]) -> int:
    form = usage("analysis.report")
    parts = split_argv(argv, positionals=1, usage=form, keys=[f.name for f in fields(ReportArgs)])
    if not parts.positionals:
        raise ConfigError(f"missing SWEEP_DIR; usage: {form}")
    args = build(ReportArgs, parts.overrides, what="report", renamed=RENAMED)
    print(build_report(parts.positionals[0], args.out, hardware=args.hardware))
    return 0


if __name__ == "__main__":
    sys.exit(main())
