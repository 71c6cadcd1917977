"""Static plots (matplotlib Agg + seaborn styling) for the report; each returns SVG text or None
when there is nothing to draw."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from analysis.stats import METHODS, METRICS, PHASES, method_order  # noqa: E402

METHOD_COLORS = {"canzona": "#1b9e77", "atomic": "#a6761d", "sync": "#d95f02", "layerwise": "#7570b3",
                 "adamw": "#666666"}
CAT_COLORS = {"compute": "#2a9d8f", "comm": "#e76f51", "wait": "#c9c9c9", "model": "#8da0cb"}
# a distinct colour per phase, then grey for "other"; the barrier (a wait, like "other") in a light grey
PHASE_COLORS = {**dict(zip([p for p in PHASES if p != "barrier"], sns.color_palette("tab10", 10).as_hex())),
                "barrier": "#e0e0e0", "other": "#c7c7c7"}
# methods without a colour of their own (the ladder's rungs, other DP x TP pairs), in order
EXTRA_COLORS = ("#e7298a", "#66a61e", "#e6ab02", "#1f78b4", "#b15928", "#6a3d9a", "#fb9a99", "#17becf")
OPTIMIZER_MARKERS = {"muon": "o", "shampoo": "s", "soap": "^", "adamw": "D"}
MAX_GANTT_RANKS = 16
METRIC_LABELS = {"iteration_ms": "iteration time (ms)", "optimizer_step_ms": "optimizer step latency (ms)"}

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.95)
plt.rcParams.update({"svg.hashsalt": "canzona", "figure.dpi": 100, "axes.titleweight": "bold"})


def _rank(method: Any) -> int:
    return METHODS.index(method) if method in METHODS else len(METHODS)


_EXTRA: dict[str, str] = {}


def _color(method: str) -> Any:
    """The method's colour: the presets' fixed ones, then a distinct one per other method in
    the order first asked for (the report asks in method order, so it is stable per sweep)."""
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    if method not in _EXTRA:
        _EXTRA[method] = EXTRA_COLORS[len(_EXTRA) % len(EXTRA_COLORS)]
    return _EXTRA[method]


def _marker(optimizer: Any) -> str:
    return OPTIMIZER_MARKERS.get(str(optimizer), "v")


def _svg(fig: plt.Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _layout_label(row: pd.Series, cols: list[str], with_optimizer: bool = True) -> str:
    # adamw is the elementwise reference whatever optimizer name its trials carry
    parts = [f"{row['optimizer.name']}"] if with_optimizer and row.get("method") != "adamw" else []
    parts.append(f"dp {row['parallel.dp']} × tp {row['parallel.tp']}")
    parts += [f"{c}={row[c]}" for c in cols if c not in ("model", "optimizer.name", "parallel.dp", "parallel.tp")]
    return " ".join(parts)


def latency_vs_size(groups: pd.DataFrame, point_cols: list[str]) -> str | None:
    """Median (p10-p90 bars) iteration time and optimizer step latency vs model size, one
    column of panels per layout (dp x tp, plus any other point value)."""
    if groups.empty:
        return None
    g = groups.copy()
    g["layout"] = g.apply(lambda r: _layout_label(r, point_cols, with_optimizer=False), axis=1)
    use_params = g["model_params"].notna().all()
    if not use_params:
        order = list(dict.fromkeys(g.sort_values("model")["model"]))
        g["x"] = g["model"].map({m: i for i, m in enumerate(order)})
    else:
        g["x"] = g["model_params"] / 1e6
    layouts = list(dict.fromkeys(g.sort_values(["parallel.dp", "parallel.tp"])["layout"]))
    n = len(layouts)
    if n == 1:  # one layout: the two metrics side by side
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), squeeze=False)
    else:
        fig, axes = plt.subplots(2, n, figsize=(min(20.0, max(12.0, 4.2 * n)), 7.6), squeeze=False)
    for col, layout in enumerate(layouts):
        for row, metric in enumerate(METRICS):
            ax = axes[row, col] if n > 1 else axes[0, row]
            lg = g[g["layout"] == layout]
            series = lg.groupby(["method", "optimizer.name", "variant"], dropna=False, sort=False)
            for (method, opt, variant), d in sorted(series, key=lambda kv: (_rank(kv[0][0]), str(kv[0][1:]))):
                d = d.sort_values("x")
                y = d[f"{metric}_median"]
                err = np.vstack([y - d[f"{metric}_p10"], d[f"{metric}_p90"] - y]).clip(min=0)
                label = method if method == "adamw" else f"{method} ({opt}{', ' + variant if variant else ''})"
                ax.errorbar(d["x"], y, yerr=err, marker=_marker(opt), capsize=3, color=_color(method),
                            linestyle="-" if method != "adamw" else "--", label=label)
            ax.set_title(f"{METRIC_LABELS[metric].split(' (')[0]} — {layout}", fontsize=10)
            ax.set_ylabel(METRIC_LABELS[metric] if col == 0 or n == 1 else "")
            if use_params:
                ax.set_xscale("log")
                ticks = sorted(lg["x"].unique())
                ax.set_xticks(ticks)
                ax.set_xticklabels([f"{lg.loc[lg['x'] == t, 'model'].iloc[0]}\n{t:.3g}M params" for t in ticks], fontsize=7)
                ax.minorticks_off()
            else:
                ax.set_xticks(range(len(order)))
                ax.set_xticklabels(order, fontsize=7)
            ax.set_xlabel("model (log scale of parameters)" if use_params and (row == 1 or n == 1) else "")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
    fig.suptitle("Median per-step time vs model size (step = max over ranks; bars: p10–p90 of steps)", fontsize=11)
    fig.tight_layout()
    return _svg(fig)


def speedup_bars(speedups: pd.DataFrame, point_cols: list[str]) -> str | None:
    """canzona's speedup over sync and layerwise per point (horizontal bars), 90% bootstrap CI
    as error bars."""
    sp = speedups[speedups["kind"] == "speedup"].dropna(subset=["value"])
    if sp.empty:
        return None
    sp = sp.copy()
    sp["point"] = sp.apply(lambda r: _point_label(r, point_cols), axis=1)
    sp["comp"] = sp["comparison"] + sp["baseline_variant"].map(lambda v: f" ({v})" if v else "")
    points = list(dict.fromkeys(sp["point"]))
    comps = list(dict.fromkeys(sp["comp"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 1.6 + 0.32 * len(points) * max(1, len(comps))), sharey=True)
    height = 0.8 / max(1, len(comps))
    for ax, metric in zip(axes, METRICS):
        d = sp[sp["metric"] == metric]
        for ci, comp in enumerate(comps):
            dc = d[d["comp"] == comp].set_index("point").reindex(points)
            yy = np.arange(len(points)) + (ci - (len(comps) - 1) / 2) * height
            v = dc["value"].to_numpy(dtype=float)
            lo, hi = dc["ci_low"].to_numpy(dtype=float), dc["ci_high"].to_numpy(dtype=float)
            err = np.nan_to_num(np.vstack([v - lo, hi - v]).clip(min=0))
            base = comp.split(" vs ")[-1].split(" (")[0]
            ax.barh(yy, v, height=height * 0.92, xerr=err, capsize=2, color=_color(base), alpha=0.85, label=comp)
            for y1, v1, h1 in zip(yy, v, np.fmax(v, hi)):
                if not math.isnan(v1):
                    ax.annotate(f"{v1:.2f}×", (h1, y1), textcoords="offset points", xytext=(3, 0), va="center", fontsize=7)
        ax.axvline(1.0, color="black", linewidth=1, linestyle="--")
        ax.set_yticks(np.arange(len(points)))
        ax.set_yticklabels(points, fontsize=8)
        ax.set_xlabel("speedup = baseline median ÷ canzona median")
        ax.set_title(METRIC_LABELS[metric].split(" (")[0])
        top = np.nanmax(d["ci_high"].to_numpy(dtype=float)) if len(d) else 1.0
        ax.set_xlim(0, max(1.2, float(np.nan_to_num(top, nan=1.0))) * 1.15)
    axes[0].invert_yaxis()  # shared y: once inverts both; first point on top
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle("Speedup of canzona (> 1: canzona faster; dashed: parity); error bars: 90% two-level bootstrap CI", fontsize=11)
    fig.tight_layout()
    return _svg(fig)


def _point_label(row: pd.Series, cols: list[str]) -> str:
    s = f"{row['model']} · {row['optimizer.name']} · dp {row['parallel.dp']} × tp {row['parallel.tp']}"
    extra = [f"{c}={row[c]}" for c in cols if c not in ("model", "optimizer.name", "parallel.dp", "parallel.tp")]
    if row.get("canzona_variant"):
        extra.append(f"canzona {row['canzona_variant']}")
    return s + ("\n" + " ".join(extra) if extra else "")


def rank_load_bars(loads: dict[str, pd.DataFrame], labels: dict[str, str]) -> str | None:
    """Per method (one trial each): planned vs measured optimizer compute per rank, each as a
    share of its mean over ranks (1 = perfectly even)."""
    items = [(m, d) for m, d in loads.items() if not d.empty and (d["planned_rel"].notna().any() or d["measured_rel"].notna().any())]
    if not items:
        return None
    n = len(items)
    fig, axes = plt.subplots(1, n, figsize=(max(4.0, 3.6 * n), 3.8), sharey=True, squeeze=False)
    for ax, (method, d) in zip(axes[0], items):
        x = np.arange(len(d))
        ax.bar(x - 0.2, d["planned_rel"].fillna(0), width=0.4, color=_color(method), alpha=0.45, label="planned")
        ax.bar(x + 0.2, d["measured_rel"].fillna(0), width=0.4, color=_color(method), label="measured")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        if len(d) <= 16:
            ax.set_xticks(x)
            ax.set_xticklabels([f"r{_i(r)}\n({_i(dp)},{_i(tp)})" for r, dp, tp in zip(d["rank"], d["dp_rank"], d["tp_rank"])], fontsize=7)
        pi, mi = _imb(d["planned"]), _imb(d["measured_ms"])
        ax.set_title(f"{method}\nimbalance planned {pi} · measured {mi}", fontsize=9)
        ax.set_xlabel("rank (dp, tp)" if len(d) <= 16 else "rank", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("load ÷ mean over ranks")
    fig.suptitle("Per-rank optimizer compute: planned (plan.ranks compute) vs measured (median compute_ms)", fontsize=11)
    fig.tight_layout()
    return _svg(fig)


def _i(v: Any) -> str:
    try:
        return str(int(v))
    except (TypeError, ValueError):
        return "?"


def _imb(v: pd.Series) -> str:
    v = pd.to_numeric(v, errors="coerce").dropna()
    return f"{v.max() / v.mean():.2f}" if len(v) and v.mean() > 0 else "n/a"


def phase_stack(phases: pd.DataFrame) -> str | None:
    """Stacked horizontal bars per method: mean over the trials of the per-phase medians (ms)."""
    if phases.empty:
        return None
    order = method_order(phases["method"].unique())
    d = phases.groupby("method")[[*PHASES, "other"]].mean().reindex(order)
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.6 * len(order)))
    left = np.zeros(len(order))
    y = np.arange(len(order))
    for p in [*PHASES, "other"]:
        v = d[p].fillna(0).to_numpy()
        if not v.any():
            continue
        ax.barh(y, v, left=left, color=PHASE_COLORS[p], label=p, edgecolor="white", linewidth=0.5)
        left += v
    for yi, total in zip(y, left):
        ax.annotate(f"{total:.1f} ms", (total, yi), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(order)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per step (mean over ranks, median over measured steps)")
    ax.set_xlim(right=left.max() * 1.12 if left.max() > 0 else 1)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase", title_fontsize=8)
    ax.set_title("Phase breakdown per method")
    fig.tight_layout()
    return _svg(fig)


def gantt(timelines: dict[str, tuple[list[dict[str, Any]], str]]) -> str | None:
    """One panel per method: per rank, compute/wait (upper lane) and communication (lower
    lane) of one measured optimizer step, 0 = the step's first optimizer event. Shared x axis,
    so the panel lengths compare directly."""
    items = []
    for m, (evs, title) in timelines.items():
        ranks = sorted({e["rank"] for e in evs}, key=lambda r: (r is None, r))
        if len(ranks) > MAX_GANTT_RANKS:  # a big job: show the first ranks only
            keep = set(ranks[:MAX_GANTT_RANKS])
            evs = [e for e in evs if e["rank"] in keep]
            title += f" — first {MAX_GANTT_RANKS} of {len(ranks)} ranks"
        if evs:
            items.append((m, evs, title))
    if not items:
        return None
    heights = [max(1, len({e["rank"] for e in evs})) for _, evs, _ in items]
    fig, axes = plt.subplots(len(items), 1, figsize=(12, 1.0 + sum(0.42 * h + 0.7 for h in heights)), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [h + 1.2 for h in heights]})
    for ax, (method, evs, title) in zip(axes[:, 0], items):
        ranks = sorted({e["rank"] for e in evs}, key=lambda r: (r is None, r))
        pos = {r: i for i, r in enumerate(ranks)}
        for e in evs:
            y = pos[e["rank"]]
            cat = e.get("cat", "compute")
            if cat == "comm":
                ax.broken_barh([(e["start_ms"], e["dur_ms"])], (y + 0.02, 0.36), facecolors=CAT_COLORS["comm"],
                               edgecolor="white", linewidth=0.4)
            else:
                ax.broken_barh([(e["start_ms"], e["dur_ms"])], (y - 0.4, 0.4), facecolors=CAT_COLORS.get(cat, "#999999"),
                               edgecolor="white", linewidth=0.4, hatch="//" if cat == "wait" else None)
        end = max(e["start_ms"] + e["dur_ms"] for e in evs)
        ax.axvline(end, color=_color(method), linestyle="--", linewidth=1)
        ax.annotate(f"{end:.1f} ms", (end, len(ranks) - 0.5), textcoords="offset points", xytext=(3, 0), fontsize=8,
                    color=_color(method), va="top")
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"rank {r}" for r in ranks], fontsize=8)
        ax.set_ylim(len(ranks) - 0.45, -0.55)
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(axis="y", visible=False)
    axes[-1, 0].set_xlabel("ms since the start of the optimizer step")
    axes[-1, 0].set_xlim(left=0)
    cats = {e.get("cat") for _, evs, _ in items for e in evs}
    handles = [Patch(facecolor=CAT_COLORS[c], label=lab, hatch="//" if c == "wait" else None)
               for c, lab in (("compute", "compute (upper lane)"), ("wait", "wait (upper lane)"),
                              ("comm", "communication (lower lane)"), ("model", "model (upper lane)"))
               if c in cats or c in ("compute", "comm")]
    axes[0, 0].legend(handles=handles, fontsize=8, ncol=4, loc="lower right", bbox_to_anchor=(1.0, 1.12))
    fig.suptitle("Per-rank timeline of one measured optimizer step (the step nearest the trial's median)", fontsize=11, x=0.4)
    fig.tight_layout()
    return _svg(fig)


def ladder_bars(ladder: list[dict[str, Any]]) -> str | None:
    """Per point (one panel each), the projected optimizer step and iteration time of every rung
    of the authors' ladder present, as horizontal bars (rungs top to bottom, sync first)."""
    rows = [{"point": f"{p['point'].get('model')}, dp {p['point'].get('parallel.dp')} × tp {p['point'].get('parallel.tp')}",
             "rung": f"{s['rung']} {s['method']}", "metric": METRIC_LABELS[m], "ms": s[m]}
            for p in ladder for s in p["steps"] for m in ("optimizer_step_ms", "iteration_ms") if s[m] == s[m]]
    if not rows:
        return None
    d = pd.DataFrame(rows)
    points = list(dict.fromkeys(d["point"]))
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points), 0.8 + 0.45 * d["rung"].nunique()),
                             sharey=True, squeeze=False)
    for ax, pt in zip(axes[0], points):
        sns.barplot(data=d[d["point"] == pt], y="rung", x="ms", hue="metric", ax=ax, orient="h",
                    palette=["#1b9e77", "#7570b3"], order=list(dict.fromkeys(d["rung"])))
        ax.set_title(pt, fontsize=9)
        ax.set_xlabel("ms (projected)")
        ax.set_ylabel("")
        if ax is not axes[0][-1]:
            ax.get_legend().remove()
        else:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _svg(fig)
