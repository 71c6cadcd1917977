"""The report's Peers section: the field's own code (`canzona.peers`) beside the harness's
strategies that mirror it, and Canzona.

Per layout (the point without the optimizer: megatron_zero1 and adamw run AdamW, the others
Muon), one row per peer present (a method label: ``megatron_layerwise[duplicated]`` when the
sweep varies ``peer.tp_mode``, `analysis.load.peer_labels`): the original's median optimizer
step and iteration [p10–p90], its mirror's (`MIRRORS`), the ratio mirror ÷ original and
canzona ÷ original with the report's interval (`analysis.stats._ratio`, the comparisons'
function: the two-level bootstrap, paired where the repetitions allow), a note where a mirror's
optimizer step or iteration is not within `WITHIN` of its original's, and the parity status
(`PARITY`). Under the table: what the CPU shim changed and each peer's versions, from the peer
trials' summary.json ``peer`` block.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis import stats
from analysis.load import Sweep
from canzona.peers import PEERS

# What the test suite checks of each peer's update against the harness's single-process
# optimizer, keyed by (peer, peer.tp_mode; None where the peer has no TP mode). A statement of
# the tests (tests/peers/ runs in the peer environment, beside the paper job in .ci/run), not a
# result of this sweep: keep it in step with those tests.
PARITY: dict[tuple[str, str | None], str] = {
    ("megatron_layerwise", "duplicated"): "bit for bit at fp32 Newton–Schulz (tests/peers/test_megatron_peer.py)",
    ("megatron_layerwise", "distributed"): "derived tolerance: Gram all-reduces sum in another order "
                                           "(tests/peers/test_megatron_peer.py); its mirror's Newton–Schulz "
                                           "equals it bit for bit at TP 2 (tests/peers/test_gram_mirror.py)",
    ("megatron_layerwise", "blockwise"): "different update (per-shard NS), checked against a per-shard "
                                         "definition (tests/peers/test_megatron_peer.py)",
    ("megatron_zero1", None): "within one bf16 ulp of the harness's AdamW (tests/peers/test_megatron_peer.py)",
    ("torchtitan_distmuon", None): "bit for bit but fc1 within a derived bound (tests/dist/test_peer_distmuon.py)",
}
# The harness preset that mirrors each original (docs/design.md §1), by the same key; a peer
# without one is shown with its ratio to canzona only.
MIRRORS: dict[tuple[str, str | None], str] = {
    ("megatron_layerwise", "duplicated"): "layerwise_sharded",  # megatron-core 0.19's layout, TP duplicated
    ("megatron_layerwise", "distributed"): "layerwise_sharded_gram",  # the same layout, TP distributed
    ("megatron_zero1", None): "adamw",  # ZeRO-1 AdamW
}
WITHIN = 1.2  # a mirror's step within this factor of its original's (either way) needs no note


def _key(name: str, mode: Any) -> tuple[str, str | None]:
    return name, (str(mode) if name == "megatron_layerwise" and isinstance(mode, str) else None)


def _spread(per_step: pd.DataFrame, g: pd.DataFrame) -> dict[str, float]:
    """The group's pooled median / p10 / p90 of each metric (as `stats.group_table`), n_trials."""
    ps = per_step[per_step["trial_id"].isin(g["trial_id"])]
    out: dict[str, float] = {"n_trials": len(g)}
    for m in stats.METRICS:
        out[f"{m}_median"], out[f"{m}_p10"], out[f"{m}_p90"] = stats._pct(ps[m])
    return out


def _ratios(num: pd.DataFrame, den: pd.DataFrame, per_step: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """median(num) ÷ median(den) per metric with its interval: the comparisons' own `_ratio`
    (kind ``overhead``: numerator over denominator)."""
    out = {}
    for m in stats.METRICS:
        r = stats._ratio(num, den, m, "overhead", per_step)
        out[m] = {"value": r.value, "ci_low": r.ci_low, "ci_high": r.ci_high, "paired": r.paired}
    return out


# The phases each metric's gap is split into, in timeline order (canzona/records.py); the step's
# rest is what the step spent outside them, the iteration's the step itself.
GAP_PHASES = {
    "optimizer_step_ms": ("clip_grad", "gather", "compute", "scatter", "apply", "wait"),
    "iteration_ms": ("forward", "backward", "grad_reduce", "param_sync"),
}


def gap_breakdown(per_step: pd.DataFrame, original: pd.DataFrame, mirror: pd.DataFrame, metric: str) -> str:
    """Where original and mirror differ in ``metric``: the difference of the pooled medians
    (original − mirror) split over the phases both record (`GAP_PHASES`, mean over ranks, median
    over steps), largest first, and the rest; phases within 0.05 ms left out. Measured in the same
    run as the ratio it explains."""
    def medians(g: pd.DataFrame) -> dict[str, float]:
        ps = per_step[per_step["trial_id"].isin(g["trial_id"])]
        out = {metric: stats._pct(ps[metric])[1]}
        for ph in GAP_PHASES[metric]:
            col = f"{ph}_ms_mean"
            out[ph] = stats._pct(ps[col])[1] if col in ps else math.nan
        if metric == "iteration_ms":
            out["optimizer_step"] = stats._pct(ps["optimizer_step_ms"])[1]
        return out

    a, b = medians(original), medians(mirror)
    total = a[metric] - b[metric]
    if total != total:
        return ""
    parts = [(k, a[k] - b[k]) for k in a if k != metric and a[k] == a[k] and b[k] == b[k]]
    one_sided = [k.replace("_", " ") for k in a if k != metric and (a[k] == a[k]) != (b[k] == b[k])]
    rest = total - sum(d for _, d in parts)
    parts.append(("rest", rest))
    shown = sorted((x for x in parts if abs(x[1]) >= 0.05), key=lambda x: -abs(x[1]))
    if not shown:
        return ""
    text = f"original − mirror {total:+.1f} ms: " + ", ".join(f"{k.replace('_', ' ')} {d:+.1f}" for k, d in shown)
    return text + (f"; in the rest, recorded by one side only: {', '.join(one_sided)}" if one_sided else "")


def _far(value: float) -> bool:
    return value == value and not (1 / WITHIN <= value <= WITHIN)


def _versions(v: Any) -> str:
    return ", ".join(f"{k} {x}" for k, x in v.items()) if isinstance(v, dict) and v else "not recorded"


def peer_section(sweep: Sweep, trials: pd.DataFrame, per_step: pd.DataFrame) -> dict[str, Any] | None:
    """The Peers section's content, None when the sweep has no peer trial. ``layouts``: per
    layout its ``point`` and ``rows`` (peer, follows, parity, mirror, medians, ratios, notes);
    ``peers``: per peer name its follows, versions and shim texts; ``csv``: the rows flat."""
    names = trials.get("method.name", pd.Series(dtype=object))
    is_peer = names.isin(list(PEERS))
    if not is_peer.any():
        return None
    pcols = [c for c in trials.attrs["point_columns"] if not c.startswith("optimizer.")]
    ok = trials[trials["source"] == "steps"]
    peers_ok = ok[is_peer.reindex(ok.index, fill_value=False)]
    layouts, flat = [], []
    for key, at in peers_ok.groupby(pcols, dropna=False, sort=False):
        point = dict(zip(pcols, key if isinstance(key, tuple) else (key,)))
        here = stats._at_point(ok, point, pcols)
        canzona = here[here["method"] == "canzona"]
        if len(canzona):  # canzona's default variant, else its first
            first = "" if (canzona["variant"] == "").any() else sorted(canzona["variant"])[0]
            canzona = canzona[canzona["variant"] == first]
        rows = []
        for (label, variant), og in at.groupby(["method", "variant"], dropna=False, sort=False):
            name = str(og["method.name"].iloc[0])
            pk = _key(name, og["peer.tp_mode"].iloc[0] if "peer.tp_mode" in og else None)
            mirror = MIRRORS.get(pk)
            mg = here[here["method"] == mirror] if mirror else here.iloc[:0]
            row: dict[str, Any] = {
                "method": str(label), "variant": str(variant), "peer": name, "tp_mode": pk[1],
                "follows": PEERS[name].follows, "parity": PARITY.get(pk, "not checked"),
                "original": _spread(per_step, og), "mirror": mirror,
                "mirror_stats": _spread(per_step, mg) if len(mg) else None,
                "mirror_ratio": _ratios(mg, og, per_step) if len(mg) else None,
                "canzona": _spread(per_step, canzona) if len(canzona) else None,
                "canzona_ratio": _ratios(canzona, og, per_step) if len(canzona) else None,
                "notes": [],
            }
            if mirror is None:
                row["notes"].append("no harness strategy mirrors it")
            elif not len(mg):
                row["notes"].append(f"its mirror {mirror} has no trial with measured steps here")
            else:
                for m, what in (("optimizer_step_ms", "optimizer step"), ("iteration_ms", "iteration")):
                    v = row["mirror_ratio"][m]["value"]
                    if _far(v):
                        why = gap_breakdown(per_step, og, mg, m)
                        row["notes"].append(f"{mirror}'s {what} is {v:.2f}× {label}'s: not within {WITHIN}×"
                                            + (f" ({why})" if why else ""))
            rows.append(row)
            flat.append({**point, "method": row["method"], "variant": row["variant"], "follows": row["follows"],
                         "mirror": mirror, "parity": row["parity"],
                         **{f"original_{k}": v for k, v in row["original"].items()},
                         **{f"mirror_{m}_{k}": (row["mirror_ratio"] or {}).get(m, {}).get(k, math.nan)
                            for m in stats.METRICS for k in ("value", "ci_low", "ci_high")},
                         **{f"canzona_{m}_{k}": (row["canzona_ratio"] or {}).get(m, {}).get(k, math.nan)
                            for m in stats.METRICS for k in ("value", "ci_low", "ci_high")},
                         "notes": "; ".join(row["notes"])})
        rows.sort(key=lambda r: stats.method_rank(r["method"]))
        layouts.append({"point": point, "rows": rows})
    layouts.sort(key=lambda x: (str(x["point"].get("model")), *(np.nan_to_num(float(x["point"].get(c) or 0))
                                                                for c in ("parallel.dp", "parallel.tp"))))
    peers: dict[str, dict[str, Any]] = {}
    for t in sweep.trials:
        p = t.summary.get("peer")
        if not isinstance(p, dict):
            continue
        name = str(p.get("name") or t.config.get("method", {}).get("name"))
        e = peers.setdefault(name, {"follows": p.get("follows") or (PEERS[name].follows if name in PEERS else None),
                                    "versions": set(), "shims": set(), "no_shim": 0})
        e["versions"].add(_versions(p.get("versions")))
        if p.get("shim"):
            e["shims"].add(str(p["shim"]))
        else:
            e["no_shim"] += 1
    order = {n: i for i, n in enumerate(PEERS)}
    peer_list = [{"name": n, "follows": e["follows"], "versions": sorted(e["versions"]), "shims": sorted(e["shims"]),
                  "no_shim": e["no_shim"]} for n, e in sorted(peers.items(), key=lambda kv: order.get(kv[0], 99))]
    return {"layouts": layouts, "peers": peer_list, "within": WITHIN, "pcols": pcols,
            "n_trials": int(is_peer.sum()), "n_usable": len(peers_ok), "csv": pd.DataFrame(flat)}
