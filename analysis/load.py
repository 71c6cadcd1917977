"""Load a sweep's trial records (canzona/records.py) into pandas tables.

A sweep folder ``results/<sweep>/`` holds one subfolder per run of a trial; a subfolder counts
when it has at least ``config.yaml`` or ``status.json``. Any record may be missing or the run
may have failed: loading never raises for a bad run, it notes what is missing instead. Records
written before a key was renamed are read under its new name (`canzona.config.read_config`,
`canzona.records.read_summary`).

Here every folder is a "trial" with ``trial_id`` = its folder name. A sweep with ``repeats``
> 1 runs each config several times: repetition k > 1 lives in ``<config id>-r<k>``, and its
status.json names the config (``trial_id``) and the repetition (``repeat``); these become the
columns ``config_id`` and ``repeat``, which the statistics use to pool and pair repetitions.

A peer trial (`canzona.peers`: the field's own code run as a method) has ``method.name`` = the
peer, no ``method.dp`` / ``method.tp`` and no plan; its method label is the peer's name, with
megatron_layerwise's ``peer.tp_mode`` in brackets when the sweep varies it (`peer_labels`).

Tables (all plain pandas, nothing upstream is imported except the pure model inventory for the
parameter count and the trial schema's key renames):

- ``trials``: one row per trial -- ``trial_id``, ``config_id``, ``repeat``, ``status``, ``error``, ``missing`` (record files
  absent), every config value flattened (``parallel.dp``, ``planner.alpha``, ...), provenance
  (``host``, ``device``, ``backend``, ``git``, ``torch``, ...), planned loads and imbalance.
- ``steps``: one row per trial x rank x step, the `STEP_FIELDS` of steps.jsonl (warm-up
  included, ``measured`` says which) plus ``trial_id``.
- ``events``: kept per trial in ``Sweep.events`` (trial_id -> list of step records with events),
  only for the timelines and traces.

A sweep resumed by a later command (``rerun=failed`` skips what is recorded) holds runs of
several *invocations*. `invocations` tells them apart by what status.json carries: an
``invocation`` id where the launcher records one; else the ``submitit/<stamp>/`` folder of its
logs (``log_dir``: one stamp per invocation, `canzona.sweep.backends.run_stamp`); else its
``started`` time against the ``started`` of the last invocation (sweep.json), which tells the
last invocation from earlier ones but not the earlier ones apart (a lower bound).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from canzona.config import read_config
from canzona.errors import ConfigError
from canzona.layout import RankLayout
from canzona.peers import is_peer
from canzona.records import (
    CONFIG_FILE,
    STATUS_FILE,
    STEP_FIELDS,
    STEPS_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    read_summary,
)

# The one peer whose TP mode (``peer.tp_mode``) makes a different method (`peer_labels`).
TP_MODE_PEER = "megatron_layerwise"
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster


@dataclass
class TrialRecords:
    """The records of one trial folder (one run of a config), as read from disk."""

    trial_id: str  # the folder name
    path: Path
    config: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # unreadable files

    @property
    def state(self) -> str:
        """done / failed / running from status.json, else inferred from the records present."""
        s = self.status.get("status")
        if s in ("done", "failed", "running"):
            return s
        if self.summary or self.steps:
            return "done" if self.summary and self.steps else "incomplete"
        return "unknown"

    @property
    def config_id(self) -> str:
        """The config this run measured: shared by the repetitions of one trial."""
        return str(self.status.get("trial_id") or self.trial_id)

    @property
    def repeat(self) -> int:
        """Which repetition of its config this run is (1 for a sweep without repeats)."""
        r = self.status.get("repeat")
        return int(r) if isinstance(r, int) and r >= 1 else 1


@dataclass
class Sweep:
    path: Path
    trials: list[TrialRecords]
    sweep_config: str | None  # the sweep's manifest (results/<sweep>/sweep.json) as YAML, if any
    trials_df: pd.DataFrame
    steps_df: pd.DataFrame
    config_columns: list[str] = field(default_factory=list)  # flattened config keys, in order
    # the sweep invocations its runs came from, oldest first (`invocations`)
    invocations: list[dict[str, Any]] = field(default_factory=list)

    def trial(self, trial_id: str) -> TrialRecords:
        for t in self.trials:
            if t.trial_id == trial_id:
                return t
        raise KeyError(trial_id)


def is_trial_dir(p: Path) -> bool:
    return p.is_dir() and ((p / CONFIG_FILE).is_file() or (p / STATUS_FILE).is_file())


def _read(path: Path, kind: str, trial: TrialRecords) -> Any:
    if not path.is_file():
        trial.missing.append(path.name)
        return None
    try:
        if kind == "yaml":
            return yaml.load(path.read_text(), Loader=_YAML_LOADER) or {}
        if kind == "json":
            return json.loads(path.read_text())
        rows = []
        with open(path) as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    trial.problems.append(f"{path.name}: line {i + 1} is not JSON (skipped)")
        return rows
    except (OSError, ValueError, yaml.YAMLError) as e:
        trial.problems.append(f"{path.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return None


def load_trial(path: Path) -> TrialRecords:
    t = TrialRecords(trial_id=path.name, path=path)
    t.config = _read(path / CONFIG_FILE, "yaml", t) or {}
    t.status = _read(path / STATUS_FILE, "json", t) or {}
    t.summary = _read(path / SUMMARY_FILE, "json", t) or {}
    t.steps = _read(path / STEPS_FILE, "jsonl", t) or []
    for obj, name in ((t.config, CONFIG_FILE), (t.status, STATUS_FILE), (t.summary, SUMMARY_FILE)):
        if not isinstance(obj, dict):
            t.problems.append(f"{name}: not a mapping (ignored)")
    # records of any age under today's key names (written before a rename: read as new ones)
    t.config = read_config(t.config) if isinstance(t.config, dict) else {}
    t.status = t.status if isinstance(t.status, dict) else {}
    t.summary = read_summary(t.summary) if isinstance(t.summary, dict) else {}
    if isinstance(t.summary.get("config"), dict):
        t.summary["config"] = read_config(t.summary["config"])
    if not t.config and isinstance(t.summary.get("config"), dict):
        t.config = t.summary["config"]
    t.steps = [s for s in t.steps if isinstance(s, dict)]
    return t


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"a.b": value}; lists become JSON text so every value fits one CSV cell."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(list(v))
        else:
            out[key] = v
    return out


def model_label(cfg: dict[str, Any]) -> str:
    """qwen3-0.6b, or qwen3-0.6b/w8l4 for a scaled-down variant, qwen3-8b/v50257/tied for another
    vocabulary and tying (as canzona.inventory names it)."""
    m = cfg.get("model") or {}
    name = str(m.get("name", "?"))
    div = m.get("width_div") or 1
    layers = m.get("num_layers")
    try:
        from canzona.inventory import model_config_of

        return model_config_of(m, (cfg.get("parallel") or {}).get("tp") or 1).name
    except Exception:
        if div == 1 and layers is None:
            return name
        return f"{name}/w{div}l{layers if layers is not None else 'all'}"


def model_params(cfg: dict[str, Any]) -> float:
    """Total parameter count of the trial's model (pure inventory), NaN when it can't be known; a
    vocabulary override is counted as padded for TP 1, so every layout of a model has one size."""
    m = cfg.get("model") or {}
    try:
        from canzona.inventory import build_inventory, model_config_of, total_params

        mc = model_config_of(m, 1)
        return float(total_params(build_inventory(mc)))
    except Exception:  # unknown model, or the inventory moved: the plots fall back to names
        return math.nan


def _first(*vals: Any) -> Any:
    for v in vals:
        if v is not None:
            return v
    return None


def _trial_row(t: TrialRecords) -> dict[str, Any]:
    s = t.summary
    world = s.get("world") or {}
    versions = s.get("versions") or {}
    plan = s.get("plan") or {}
    cfg = t.config
    row: dict[str, Any] = {
        "trial_id": t.trial_id,
        "config_id": t.config_id,
        "repeat": t.repeat,
        "status": t.state,
        "error": t.status.get("error") or ("; ".join(t.problems) if t.problems else None),
        "missing": ", ".join(t.missing),
        "has_events": any(bool(x.get("events")) for x in t.steps if x.get("measured")),
        "job_id": t.status.get("job_id"),
        "started": t.status.get("started"),
        "ended": t.status.get("ended"),
        "model": model_label(cfg) if cfg else None,
        "model_params": model_params(cfg) if cfg else math.nan,
        "host": s.get("host"),
        "device": world.get("device"),
        "backend": world.get("backend"),
        "world_size": world.get("world_size"),
        "git": versions.get("git"),
        "torch": versions.get("torch"),
        "megatron_core": versions.get("megatron_core"),
        "python": versions.get("python"),
        "plan_seconds": plan.get("plan_seconds"),
        "plan_imbalance_compute": (plan.get("imbalance") or {}).get("compute"),
        "plan_imbalance_memory": (plan.get("imbalance") or {}).get("memory"),
        "plan_imbalance_critical_path": (plan.get("imbalance") or {}).get("critical_path"),
        "peak_memory_mb_max": max(s["peak_memory_mb"]) if isinstance(s.get("peak_memory_mb"), list) and s["peak_memory_mb"] else None,
    }
    for k in ("iteration_ms_median", "iteration_ms_p10", "iteration_ms_p90", "optimizer_step_ms_median",
              "optimizer_step_ms_p10", "optimizer_step_ms_p90", "param_sync_ms_median"):
        row[f"summary.{k}"] = s.get(k)
    # config values as columns; summary.config fills any gaps
    flat = flatten(s.get("config") or {})
    flat.update(flatten(cfg))
    for k, v in flat.items():
        row[k] = v
    # the method as tables name it (a preset, else "<dp>+<tp>") and its rung on the authors'
    # ladder; records written before methods were DP x TP pairs hold the preset in "method"
    row["method"], row["rung"] = method_of(row)
    row.setdefault("optimizer.name", None)
    row["parallel.dp"] = _first(row.get("parallel.dp"), world.get("dp"))
    row["parallel.tp"] = _first(row.get("parallel.tp"), world.get("tp"))
    return row


def sweep_manifest_text(root: Path) -> str | None:
    """What the last sweep into ``root`` wrote of itself (``sweep.json``: sweep, profile, cluster,
    settings, when), as YAML for the report's provenance; its trial and run lists as counts."""
    try:
        manifest = json.loads((root / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    trials, order = manifest.pop("trials", None), manifest.pop("order", None)
    if isinstance(trials, list):
        manifest["trials"] = len(trials)
    if isinstance(order, list):
        manifest["runs"] = len(order)
    return yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True, width=100)


_STAMP = re.compile(r"(?:^|/)submitit/(\d{8}-\d{6}(?:-\d+)?)(?:/|$)")


def _when(v: Any) -> datetime | None:
    """An ISO time of the records (bookkeeping's are UTC with an offset; naive ones read as UTC)."""
    if not isinstance(v, str) or not v:
        return None
    try:
        t = datetime.fromisoformat(v)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def read_manifest(root: Path) -> dict[str, Any]:
    try:
        m = json.loads((Path(root) / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


def invocation_of(status: dict[str, Any], last_started: datetime | None) -> tuple[str | None, str]:
    """(invocation key, how it is known) of one run's status.json; (None, why) when unknown.

    How: ``recorded`` (status.json ``invocation``), ``log folder`` (the ``submitit/<stamp>/`` of
    ``log_dir``), ``start time`` (``started`` against the last invocation's start: the key is
    ``last`` or ``earlier``)."""
    inv = status.get("invocation")
    if isinstance(inv, str) and inv:
        return inv, "recorded"
    m = _STAMP.search(str(status.get("log_dir") or "").replace("\\", "/"))
    if m:
        return m.group(1), "log folder"
    started = _when(status.get("started"))
    if started is None:
        return None, "adopted" if status.get("adopted") else "no start time"
    if last_started is None:
        return None, "no sweep.json"
    return ("last" if started >= last_started else "earlier"), "start time"


def _label(key: str | None, manifest: dict[str, Any]) -> str | None:
    """What tables call an invocation: its key, or for those placed by start time, when."""
    if key == "last":
        return f"last ({manifest.get('started')})"
    if key == "earlier":
        return f"earlier (before {manifest.get('started')})"
    return key


def invocations(trials: list[TrialRecords], manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The invocations the runs came from, oldest first: ``id``, ``runs`` (run folders),
    ``started`` / ``ended`` (first start, last end of its runs), ``how`` it is known and
    ``exact`` (False for ``earlier``: one or more invocations before the last one), plus one
    entry ``id: None`` for runs nothing places (adopted, no start time), if any.

    A run placed by start time joins the one invocation known exactly on the same side of
    the last invocation's start, where there is one (e.g. a run whose submission failed has no
    log folder, its siblings have)."""
    last_started = _when(manifest.get("started"))
    keyed = [(t, *invocation_of(t.status, last_started)) for t in trials]
    groups: dict[str | None, dict[str, Any]] = {}
    for t, key, how in keyed:
        g = groups.setdefault(key, {"id": key, "runs": [], "started": None, "ended": None, "how": how,
                                    "exact": key not in ("earlier", None)})
        g["runs"].append(t)
        for k, pick in (("started", min), ("ended", max)):
            v = _when(t.status.get(k))
            if v is not None:
                g[k] = v if g[k] is None else pick(g[k], v)
    exact = [g for g in groups.values() if g["exact"] and g["how"] != "start time"]
    if last_started is not None and exact:
        for side in ("last", "earlier"):
            if side not in groups:
                continue
            same = [g for g in exact if g["started"] is not None and (g["started"] >= last_started) == (side == "last")]
            fallback = groups.pop(side)
            target = same[0] if len(same) == 1 else None
            if target is None:  # cannot tell which: not placed
                target = groups.setdefault(None, {"id": None, "runs": [], "started": None, "ended": None,
                                                  "how": "start time", "exact": False})
            target["runs"] += fallback["runs"]
            for k, pick in (("started", min), ("ended", max)):
                if fallback[k] is not None:
                    target[k] = fallback[k] if target[k] is None else pick(target[k], fallback[k])
    for g in groups.values():
        g["id"] = _label(g["id"], manifest)
    far = datetime.max.replace(tzinfo=timezone.utc)
    known = sorted((g for k, g in groups.items() if k is not None), key=lambda g: (g["started"] or far, str(g["id"])))
    out = [*known, *([groups[None]] if None in groups else [])]
    for g in out:
        g["run_ids"] = sorted(t.trial_id for t in g.pop("runs"))
        g["runs"] = len(g["run_ids"])
        for k in ("started", "ended"):
            g[k] = g[k].isoformat(timespec="seconds") if g[k] is not None else None
    return out


def method_of(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """(label, rung) of a flattened config row."""
    from canzona.plan import registry

    name = row.get("method.name")
    if is_peer(name):  # someone else's code: no DP/TP pair, no rung (`canzona.peers`)
        return str(name), None
    dp_strategy, tp_strategy = row.get("method.dp"), row.get("method.tp")
    if dp_strategy in registry.DP_STRATEGIES and tp_strategy in registry.TP_STRATEGIES:
        return registry.label(dp_strategy, tp_strategy), registry.rung(dp_strategy, tp_strategy)
    old = row.get("method")
    if old in registry.PRESETS:
        p = registry.PRESETS[old]
        return old, registry.rung(p.dp_strategy, p.tp_strategy)
    return (old if isinstance(old, str) else None), None


def peer_labels(trials_df: pd.DataFrame) -> pd.Series:
    """The method labels with megatron_layerwise's TP mode (``peer.tp_mode``) carried in them,
    ``megatron_layerwise[duplicated]``, when the sweep's megatron_layerwise trials differ in it:
    then each mode is a method of its own in every table."""
    labels = trials_df["method"].copy()
    if "peer.tp_mode" not in trials_df or "method.name" not in trials_df:
        return labels
    lw = (trials_df["method.name"] == TP_MODE_PEER) & trials_df["peer.tp_mode"].notna()
    if trials_df.loc[lw, "peer.tp_mode"].astype(str).nunique() > 1:
        labels[lw] = [f"{TP_MODE_PEER}[{m}]" for m in trials_df.loc[lw, "peer.tp_mode"]]
    return labels


def planned_loads(t: TrialRecords) -> pd.DataFrame:
    """Planned optimizer compute per rank: summary.json plan.ranks[*].compute, else the
    steps' ``compute_load``. Columns rank, dp_rank, tp_rank, planned."""
    ranks = (t.summary.get("plan") or {}).get("ranks")
    parallel, world = t.config.get("parallel") or {}, t.summary.get("world") or {}
    grid = RankLayout(parallel.get("dp") or world.get("dp") or 1, parallel.get("tp") or world.get("tp") or 1)
    rows = []
    if isinstance(ranks, list) and ranks:
        for i, r in enumerate(ranks):
            d, k = r.get("dp_rank"), r.get("tp_rank")
            rank = grid.rank_of(d, k) if d is not None and k is not None else i
            rows.append({"rank": rank, "dp_rank": d, "tp_rank": k, "planned": r.get("compute")})
    elif t.steps:
        seen: dict[int, dict[str, Any]] = {}
        for s in t.steps:
            if s.get("compute_load") is not None and s.get("rank") is not None:
                seen.setdefault(s["rank"], {"rank": s["rank"], "dp_rank": s.get("dp_rank"),
                                            "tp_rank": s.get("tp_rank"), "planned": s["compute_load"]})
        rows = list(seen.values())
    return pd.DataFrame(rows, columns=["rank", "dp_rank", "tp_rank", "planned"])


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """Read every trial of a sweep. Raise `ConfigError` if the folder is missing or has no trials."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise ConfigError(f"sweep folder {str(root)!r} does not exist")
    dirs = sorted(p for p in root.iterdir() if is_trial_dir(p))
    if not dirs:
        raise ConfigError(f"no trials in {str(root)!r} (no subfolder holds config.yaml or status.json)")
    trials = [load_trial(p) for p in dirs]
    trials_df = pd.DataFrame([_trial_row(t) for t in trials])
    trials_df["method"] = peer_labels(trials_df)
    step_rows = []
    for t in trials:
        for s in t.steps:
            row = {"trial_id": t.trial_id}
            row.update({k: s.get(k) for k in STEP_FIELDS})
            step_rows.append(row)
    steps_df = pd.DataFrame(step_rows, columns=["trial_id", *STEP_FIELDS])
    if not steps_df.empty:
        steps_df["measured"] = steps_df["measured"].fillna(False).astype(bool)
        for c in STEP_FIELDS:
            if c.endswith("_ms") or c in ("compute_load", "loss"):
                steps_df[c] = pd.to_numeric(steps_df[c], errors="coerce")
    config_columns: list[str] = []
    for t in trials:
        for k in flatten(t.config or t.summary.get("config") or {}):
            if k not in config_columns:
                config_columns.append(k)
    manifest = read_manifest(root)
    invs = invocations(trials, manifest)
    where = {tid: g["id"] for g in invs for tid in g["run_ids"]}
    trials_df["invocation"] = [where.get(t.trial_id) for t in trials]
    return Sweep(
        path=root,
        trials=trials,
        sweep_config=sweep_manifest_text(root),
        trials_df=trials_df,
        steps_df=steps_df,
        config_columns=config_columns,
        invocations=invs,
    )


def subset(sweep: Sweep, trial_ids: set[str]) -> Sweep:
    """The same sweep restricted to some of its trials (tables filtered, config columns of those
    trials only); used to keep projected trials apart from measured ones."""
    trials = [t for t in sweep.trials if t.trial_id in trial_ids]
    tdf = sweep.trials_df[sweep.trials_df["trial_id"].isin(trial_ids)].reset_index(drop=True)
    sdf = sweep.steps_df[sweep.steps_df["trial_id"].isin(trial_ids)].reset_index(drop=True)
    config_columns: list[str] = []
    for t in trials:
        for k in flatten(t.config or t.summary.get("config") or {}):
            if k not in config_columns:
                config_columns.append(k)
    return Sweep(path=sweep.path, trials=trials, sweep_config=sweep.sweep_config, trials_df=tdf, steps_df=sdf,
                 config_columns=config_columns, invocations=sweep.invocations)
