"""Sweep files and overrides -> a validated list of trials. Pure: reads YAML, writes nothing.

A sweep file (``sweeps/configs/<name>.yaml``)::

    description: one line
    default_profile: local
    fixed: {train.steps: 5}            # trial values for every trial (dotted or nested keys)
    grid:                              # axes; the trials are their cartesian product
      method: [canzona, sync]          #   a scalar axis: named by a trial key, a list of values
      size:                            #   a bundle axis: any other name, label -> trial values
        0.6b: {model.name: qwen3-0.6b, model.width_div: 16}
    include:                           # extra trials: each entry is a small grid of its own;
      - {optimizer.name: [shampoo, soap], method: canzona}   # axes it omits take every value,
    exclude:                           # keys that are not axes are trial values for it only
      - {method: adamw, size: 0.6b}    # drops grid combinations matching every key
    rules:                             # applied last to every trial, in order
      - {when: {method: adamw}, set: {optimizer.name: adamw}}
    sweep: {cluster: local}            # sweep settings (see `SweepSettings`; cluster=simulate projects)
    profiles:                          # profile=NAME selects one; each may hold fixed, grid
      local: {...}                     # (an axis set here replaces the top-level one; null
      paper: {...}                     # removes it), include, exclude, rules, sweep, description

Precedence for a trial value: fixed < axis value < include extras < command line < rules.
Trials whose resolved configs are equal collapse into one (same trial id).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, fields
from itertools import product
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from canzona.config import TrialConfig, load_config, validate
from canzona.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO / "sweeps" / "configs"

SHORTHANDS = {"model": "model.name", "optimizer": "optimizer.name"}
CLUSTERS = ("local", "debug", "slurm", "simulate")
DEFAULT_SIM_PROFILE = "h100"
RERUN = ("failed", "all", "none")
LOCAL_MODES = ("tasks", "spawn")
_TOP_KEYS = (
    "description",
    "default_profile",
    "fixed",
    "grid",
    "include",
    "exclude",
    "rules",
    "sweep",
    "profiles",
)
_PROFILE_KEYS = ("description", "fixed", "grid", "include", "exclude", "rules", "sweep")


class SweepError(ConfigError):
    """Invalid sweep file, override or layout: a one-line message; the CLI exits 2."""


# --------------------------------------------------------------------------- settings
@dataclass
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"  # per trial: minutes, HH:MM:SS or D-HH:MM:SS
    constraint: str | None = None
    mem: str | None = None  # per node, e.g. 200G
    gpus_per_node: int = 0  # 0: CPU ranks (gloo)
    tasks_per_node: int | None = None  # default: gpus_per_node, or the trial's world size on CPU
    cpus_per_task: int = 1
    setup: list[str] = field(default_factory=list)  # shell lines before the ranks start
    extra_sbatch: list[str] = field(default_factory=list)  # raw options, e.g. "--exclusive"
    array: bool = True  # submit trials with the same job shape as one job array
    array_parallelism: int = 64
    python: str | None = None  # interpreter on the compute nodes (default: this one)
    job_name: str | None = None  # default: canzona-<sweep>


@dataclass
class LocalSettings:
    max_ranks: int = 4  # most ranks one local trial may start (dp x tp)
    parallel: int = 1  # trials at once
    mode: str = "spawn"  # spawn: one task runs run_trial (forks the ranks); tasks: a task per rank
    timeout_min: float = 20.0  # per trial


@dataclass
class SimSettings:
    """``cluster=simulate``: project every trial with `canzona.sim` instead of running it."""

    # A device profile under profiles/ (h100, h200, a100, local) or a YAML path: what
    # cluster=simulate projects with (default h100), and what the report of a measured sweep
    # predicts its trials with (default profiles/local.yaml when it exists).
    profile: str | None = None
    workers: int = 0  # processes projecting trials at once (0: one per core)


@dataclass
class SweepSettings:
    sweep: str | None = None
    profile: str | None = None
    cluster: str = "local"
    rerun: str = "failed"
    dry_run: bool = False
    results: str = "results"
    poll_s: float = 1.0
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    local: LocalSettings = field(default_factory=LocalSettings)
    sim: SimSettings = field(default_factory=SimSettings)


SETTINGS_KEYS = tuple(f.name for f in fields(SweepSettings))


def time_minutes(value: str | int | float) -> int:
    """Slurm time ('90', '30:00' = MM:SS, '01:30:00', '1-00', '1-00:00:00') -> whole minutes."""
    s = str(value).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", s)
    if not m:
        raise SweepError(f"slurm.time={s!r} is not a Slurm time; use minutes, HH:MM:SS or D-HH:MM:SS")
    parts = [int(x) for x in m.group(2).split(":")]
    if m.group(1) is None:
        if len(parts) == 1:
            minutes = float(parts[0])
        elif len(parts) == 2:  # MM:SS
            minutes = parts[0] + parts[1] / 60
        else:
            minutes = parts[0] * 60 + parts[1] + parts[2] / 60
    else:
        h, mi, se = (parts + [0, 0])[:3]
        minutes = int(m.group(1)) * 1440 + h * 60 + mi + se / 60
    return max(1, math.ceil(minutes))


# --------------------------------------------------------------------------- values
def fmt_value(v: Any) -> str:
    """A value as it is written in a ``key=value`` override (YAML reads it back unchanged)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


def split_top_commas(text: str) -> list[str]:
    """'a,b,[1,2]' -> ['a', 'b', '[1,2]']: commas inside brackets do not split."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


def normalize_key(key: str) -> str:
    key = key.strip()
    return SHORTHANDS.get(key, key)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if prefix:
            key = f"{prefix}.{k}"
        else:  # shorthands (model=, optimizer=) only for a value, not for a nested section
            key = str(k) if isinstance(v, dict) else normalize_key(str(k))
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SweepError(f"trial key {key!r} conflicts with a value set at {p!r}")
        node[leaf] = v
    return out


_SCHEMA = OmegaConf.structured(TrialConfig)
TRIAL_SECTIONS = tuple(sorted(_SCHEMA.keys()))


def check_trial_key(key: str, where: str) -> None:
    """Raise SweepError unless ``key`` names a TrialConfig value."""
    node: Any = _SCHEMA
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not OmegaConf.is_config(node) or part not in node:
            parent = ".".join(parts[:i])
            allowed = sorted(node.keys()) if OmegaConf.is_config(node) else []
            raise SweepError(
                f"{where}: unknown trial key {key!r}; allowed under {parent or 'top level'}: {', '.join(allowed)}"
            )
        node = node[part] if OmegaConf.is_config(node[part]) else None
    if OmegaConf.is_config(node):
        raise SweepError(
            f"{where}: {key!r} is a section; set one of its keys: {', '.join(sorted(node.keys()))}"
        )


def trial_id(cfg: TrialConfig) -> str:
    """Readable prefix + 10 hex digits of the sha256 of the resolved config (``out`` excluded)."""
    d = cfg.to_dict()
    d.pop("out", None)
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    h = hashlib.sha256(blob.encode()).hexdigest()[:10]
    model = cfg.model.name.removeprefix("qwen3-")
    return f"{model}-{cfg.method}-{cfg.optimizer.name}-dp{cfg.parallel.dp}tp{cfg.parallel.tp}-{h}"


def config_overrides(cfg: TrialConfig) -> list[str]:
    """The ``key=value`` overrides that rebuild ``cfg`` from the defaults (``out`` left out)."""
    default = flatten(TrialConfig().to_dict())
    mine = flatten(cfg.to_dict())
    return [
        f"{k}={fmt_value(v)}" for k, v in mine.items() if k != "out" and _norm(v) != _norm(default.get(k))
    ]


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


# --------------------------------------------------------------------------- sweep files
@dataclass
class Axis:
    name: str
    bundle: bool
    values: dict[str, dict[str, Any]]  # label -> dotted trial values

    def add_scalar(self, v: Any) -> str:
        label = fmt_value(v)
        self.values.setdefault(label, {self.name: v})
        return label

    def labels_for(self, items: list[Any], where: str) -> list[str]:
        """Labels for a list of values (bundle labels, or scalar values added on the fly)."""
        if self.bundle:
            bad = [str(x) for x in items if str(x) not in self.values]
            if bad:
                raise SweepError(
                    f"{where}: {self.name}={bad[0]!r} is not a value of axis {self.name}; allowed: {', '.join(self.values)}"
                )
            return [str(x) for x in items]
        return [self.add_scalar(x) for x in items]

    def existing_labels(self, items: list[Any], where: str) -> list[str]:
        """Labels of values the axis already has (exclude entries): a typo is an error."""
        labels = [str(x) if self.bundle else fmt_value(x) for x in items]
        bad = [lb for lb in labels if lb not in self.values]
        if bad:
            raise SweepError(
                f"{where}: {self.name}={bad[0]!r} is not a value of axis {self.name}; allowed: {', '.join(self.values)}"
            )
        return labels

    def copy(self) -> Axis:
        return Axis(self.name, self.bundle, dict(self.values))


def as_list(key: str, v: Any) -> list[Any]:
    """A YAML value that may be one value or a list of them -> the list of values."""
    if isinstance(v, list) and (not _is_list_value(key) or (v and isinstance(v[0], list))):
        return v
    return [v]


def _is_list_value(key: str) -> bool:
    """Trial keys whose values are themselves lists (tuples in the schema)."""
    default = flatten(TrialConfig().to_dict()).get(key)
    return isinstance(default, (list, tuple))


@dataclass
class SweepFile:
    name: str
    path: Path
    raw: dict[str, Any]

    @property
    def description(self) -> str:
        return str(self.raw.get("description") or "")

    @property
    def profiles(self) -> list[str]:
        return list((self.raw.get("profiles") or {}).keys())

    @property
    def default_profile(self) -> str | None:
        return self.raw.get("default_profile") or (self.profiles[0] if self.profiles else None)


def available_sweeps(configs_dir: Path = CONFIGS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(configs_dir).glob("*.yaml"))


def load_sweep_file(name: str, configs_dir: Path = CONFIGS_DIR) -> SweepFile:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise SweepError(f"sweep file {name!r} not found")
    else:
        path = Path(configs_dir) / f"{name}.yaml"
        if not path.is_file():
            raise SweepError(
                f"unknown sweep {name!r}; available: {', '.join(available_sweeps(configs_dir)) or '(none)'}"
            )
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: invalid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with keys {', '.join(_TOP_KEYS)}")
    _check_keys(raw, _TOP_KEYS, str(path))
    for pname, prof in (raw.get("profiles") or {}).items():
        if not isinstance(prof, dict):
            raise SweepError(
                f"{path}: profile {pname!r} must be a mapping with keys {', '.join(_PROFILE_KEYS)}"
            )
        _check_keys(prof, _PROFILE_KEYS, f"{path} profile {pname}")
    return SweepFile(path.stem, path, raw)


def _check_keys(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise SweepError(f"{where}: unknown key {k!r}; allowed: {', '.join(allowed)}")


# --------------------------------------------------------------------------- plan
@dataclass
class Trial:
    id: str
    axes: dict[str, str]  # axis name -> label
    cfg: TrialConfig

    @property
    def world_size(self) -> int:
        return self.cfg.world_size

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.axes.items())


@dataclass
class Plan:
    sweep: str
    path: Path
    profile: str | None
    description: str
    settings: SweepSettings
    axes: list[str]
    trials: list[Trial]

    @property
    def results_dir(self) -> Path:
        """``results/<sweep>``; projections (cluster=simulate) go to a folder of their own,
        ``results/<sweep>-<profile>-sim-<device profile>``, so that they never mix with -- or,
        sharing trial ids, stand in for -- measured trials, and each device profile keeps its own."""
        if self.settings.cluster == "simulate":
            parts = [
                self.sweep,
                *([self.profile] if self.profile else []),
                "sim",
                sim_profile_label(str(self.sim_profile)),
            ]
            return Path(self.settings.results) / "-".join(parts)
        return Path(self.settings.results) / self.sweep

    @property
    def sim_profile(self) -> str | None:
        """The device profile of this sweep: ``sim.profile`` if given; else h100 for
        cluster=simulate, profiles/local.yaml (if it exists) for the report of a measured sweep."""
        if self.settings.sim.profile:
            return self.settings.sim.profile
        if self.settings.cluster == "simulate":
            return DEFAULT_SIM_PROFILE
        local = REPO / "profiles" / "local.yaml"
        return str(local) if local.is_file() else None


def sim_profile_label(profile: str) -> str:
    """h100 -> h100; profiles/local.yaml -> local (a folder-name-safe label)."""
    stem = Path(str(profile)).stem if str(profile).endswith((".yaml", ".yml")) else str(profile)
    return re.sub(r"[^A-Za-z0-9_.]+", "_", stem) or "profile"


@dataclass
class _Section:
    fixed: dict[str, Any]
    axes: list[Axis]
    include: list[dict[str, Any]]
    exclude: list[dict[str, Any]]
    rules: list[dict[str, Any]]


def _merge_sections(sf: SweepFile, profile: str | None) -> _Section:
    where = str(sf.path)
    parts = [sf.raw]
    if profile is not None:
        parts.append(sf.raw["profiles"][profile])
    fixed: dict[str, Any] = {}
    axes: dict[str, Axis | None] = {}
    include: list[dict[str, Any]] = []
    exclude: list[dict[str, Any]] = []
    rules: list[dict[str, Any]] = []
    for part in parts:
        fx = part.get("fixed") or {}
        if not isinstance(fx, dict):
            raise SweepError(f"{where}: 'fixed' must be a mapping of trial keys to values")
        fixed.update(flatten(fx))
        grid = part.get("grid") or {}
        if not isinstance(grid, dict):
            raise SweepError(f"{where}: 'grid' must be a mapping of axis name to values")
        for name, vals in grid.items():
            axes.pop(normalize_key(str(name)), None)
            axes[normalize_key(str(name))] = (
                None if vals is None else _axis(normalize_key(str(name)), vals, where)
            )
        for key, dest in (("include", include), ("exclude", exclude), ("rules", rules)):
            items = part.get(key) or []
            if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
                raise SweepError(f"{where}: '{key}' must be a list of mappings")
            dest.extend(items)
    for k in fixed:
        check_trial_key(k, f"{where} fixed")
    return _Section(fixed, [a for a in axes.values() if a is not None], include, exclude, rules)


def _axis(name: str, vals: Any, where: str) -> Axis:
    if isinstance(vals, dict):
        values = {}
        for label, bundle in vals.items():
            if not isinstance(bundle, dict):
                raise SweepError(f"{where}: axis {name} value {label!r} must be a mapping of trial keys")
            flat = flatten(bundle)
            for k in flat:
                check_trial_key(k, f"{where} axis {name}.{label}")
            values[str(label)] = flat
        if not values:
            raise SweepError(f"{where}: axis {name} has no values")
        return Axis(name, True, values)
    check_trial_key(name, f"{where} axis")
    if not isinstance(vals, list) or not vals:
        raise SweepError(
            f"{where}: axis {name} must be a non-empty list of values (or a mapping label -> trial values)"
        )
    ax = Axis(name, False, {})
    for v in vals:
        ax.add_scalar(v)
    return ax


def parse_cli(items: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Split ``key=value`` items into sweep settings and the rest (axes / trial keys)."""
    settings: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for item in items:
        if "=" not in item or item.startswith("="):
            raise SweepError(f"bad argument {item!r}; expected key=value (e.g. train.steps=3), or 'list'")
        key, value = item.split("=", 1)
        key = normalize_key(key)
        if key.split(".")[0] in SETTINGS_KEYS:
            settings[key] = value
        else:
            rest.append((key, value))
    return settings, rest


def build_settings(cli: dict[str, str], *layers: dict[str, Any]) -> SweepSettings:
    merged = OmegaConf.structured(SweepSettings)
    try:
        for layer in layers:
            merged = OmegaConf.merge(merged, layer or {})
        for key, value in cli.items():
            # Typed by the schema, not by YAML (YAML reads slurm.time=01:00:00 as 3600).
            v = (
                parse_value(value)
                if value.strip()[:1] == "[" or value.strip() in ("", "null", "~")
                else value
            )
            OmegaConf.update(merged, key, v, merge=True, force_add=False)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise SweepError(_settings_error(e)) from None
    assert isinstance(obj, SweepSettings)
    _choice("cluster", obj.cluster, CLUSTERS)
    _choice("rerun", obj.rerun, RERUN)
    _choice("local.mode", obj.local.mode, LOCAL_MODES)
    if obj.sim.workers < 0:
        raise SweepError("sim.workers must be >= 0 (0: one per core)")
    if obj.local.max_ranks < 1 or obj.local.parallel < 1:
        raise SweepError("local.max_ranks and local.parallel must be >= 1")
    if obj.slurm.gpus_per_node < 0 or obj.slurm.cpus_per_task < 1:
        raise SweepError("slurm.gpus_per_node must be >= 0 and slurm.cpus_per_task >= 1")
    time_minutes(obj.slurm.time)
    return obj


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SweepError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _settings_error(e: OmegaConfBaseException) -> str:
    msg = str(e).splitlines()[0].strip()
    key = getattr(e, "full_key", None) or ""
    if "not in" in msg and key:
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node: Any = OmegaConf.structured(SweepSettings)
        for p in filter(None, parent.split(".")):
            node = node[p]
        return f"unknown sweep key {key!r}; allowed under {parent or 'top level'}: {', '.join(sorted(node.keys()))}"
    return f"{key}: {msg}" if key else msg


def build_plan(items: list[str], configs_dir: Path = CONFIGS_DIR) -> Plan:
    """Parse ``key=value`` items, load the sweep, expand and validate every trial."""
    cli_settings, rest = parse_cli(items)
    first = build_settings({k: v for k, v in cli_settings.items() if k in ("sweep", "profile")})
    if not first.sweep:
        raise SweepError(
            f"missing sweep=NAME; available: {', '.join(available_sweeps(configs_dir)) or '(none)'}"
        )
    sf = load_sweep_file(first.sweep, configs_dir)
    profile = first.profile or sf.default_profile
    if sf.profiles and profile not in sf.profiles:
        raise SweepError(
            f"profile={profile!r} is not a profile of sweep {sf.name}; allowed: {', '.join(sf.profiles)}"
        )
    if not sf.profiles and first.profile:
        raise SweepError(f"sweep {sf.name} has no profiles; drop profile={first.profile}")
    layers = [sf.raw.get("sweep") or {}]
    if profile is not None:
        layers.append(sf.raw["profiles"][profile].get("sweep") or {})
    settings = build_settings(cli_settings, *layers)
    settings.sweep, settings.profile = sf.name, profile

    sec = _merge_sections(sf, profile)
    axes = {a.name: a.copy() for a in sec.axes}
    restrict: dict[str, list[str]] = {}
    cli_trial: dict[str, Any] = {}
    for key, value in rest:
        if key in axes:
            ax = axes[key]
            parts = [value] if _is_list_value(key) else split_top_commas(value)
            restrict[key] = ax.labels_for([p if ax.bundle else parse_value(p) for p in parts], "command line")
        else:
            if key.split(".")[0] not in TRIAL_SECTIONS:
                raise SweepError(
                    f"unknown key {key!r}; sweep keys: {', '.join(_settings_names())}; "
                    f"axes of {sf.name}: {', '.join(axes) or '(none)'}; trial keys: {', '.join(_trial_names())}"
                )
            check_trial_key(key, "command line")
            cli_trial[key] = parse_value(value)

    where = f"sweep {sf.name}" + (f" (profile {profile})" if profile else "")
    combos = _combinations(sec, axes, restrict, where)
    rules = [_rule(r, where) for r in sec.rules]
    trials: list[Trial] = []
    seen: set[str] = set()
    for combo, extras in combos:
        dotted = dict(sec.fixed)
        for name, label in combo.items():
            dotted.update(axes[name].values[label])
        dotted.update(extras)
        dotted.update(cli_trial)
        tag = f"{where}, trial {' '.join(f'{k}={v}' for k, v in combo.items()) or '(only)'}"
        cfg = _resolve(dotted, tag)
        changed = False
        for when, sets in rules:
            if _matches(cfg, when):
                dotted.update(sets)
                changed = True
        if changed:
            cfg = _resolve(dotted, tag)
        tid = trial_id(cfg)
        if tid in seen:
            continue
        seen.add(tid)
        if changed:  # show what the rules made of scalar axes (method=adamw -> optimizer.name=adamw)
            flat = flatten(cfg.to_dict())
            combo = {k: (fmt_value(flat[k]) if not axes[k].bundle else v) for k, v in combo.items()}
        trials.append(Trial(tid, dict(combo), cfg))
    if not trials:
        raise SweepError(f"{where}: no trials left after include/exclude and the command-line selection")
    plan = Plan(sf.name, sf.path, profile, sf.description, settings, list(axes), trials)
    check_layouts(plan)
    return plan


def _settings_names() -> list[str]:
    return [f"{k}.*" if k in ("slurm", "local", "sim") else k for k in SETTINGS_KEYS]


def _trial_names() -> list[str]:
    return [f"{k}.*" if OmegaConf.is_config(_SCHEMA[k]) else k for k in TRIAL_SECTIONS]


def _combinations(
    sec: _Section, axes: dict[str, Axis], restrict: dict[str, list[str]], where: str
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    names = list(axes)
    lists = [restrict.get(n, list(axes[n].values)) for n in names]  # include entries add values later
    excludes = []
    for ex in sec.exclude:
        sel = {}
        for k, v in ex.items():
            k = normalize_key(str(k))
            if k not in axes:
                raise SweepError(
                    f"{where}: exclude key {k!r} is not an axis; axes: {', '.join(names) or '(none)'}"
                )
            sel[k] = set(axes[k].existing_labels(as_list(k, v), f"{where} exclude"))
        excludes.append(sel)
    out: list[tuple[dict[str, str], dict[str, Any]]] = []
    for values in product(*lists):
        combo = dict(zip(names, values))
        if any(all(combo[k] in s for k, s in sel.items()) for sel in excludes):
            continue
        out.append((combo, {}))
    for inc in sec.include:
        sel: dict[str, list[str]] = {}
        extras: dict[str, Any] = {}
        for k, v in _inc_items(inc):
            if k in axes:
                sel[k] = axes[k].labels_for(as_list(k, v), f"{where} include")
            else:
                check_trial_key(k, f"{where} include")
                extras[k] = v
        inc_lists = [sel.get(n, base) for n, base in zip(names, lists)]
        for values in product(*inc_lists):
            combo = dict(zip(names, values))
            if all(combo[k] in labels for k, labels in restrict.items()):
                out.append((combo, dict(extras)))
    return out


def _inc_items(inc: dict[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for k, v in inc.items():
        key = normalize_key(str(k))
        if isinstance(v, dict):
            items.extend(flatten(v, key).items())
        else:
            items.append((key, v))
    return items


def _rule(r: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    _check_keys(r, ("when", "set"), f"{where} rule")
    when, sets = flatten(r.get("when") or {}), flatten(r.get("set") or {})
    for k in [*when, *sets]:
        check_trial_key(k, f"{where} rule")
    return when, sets


def _matches(cfg: TrialConfig, when: dict[str, Any]) -> bool:
    flat = flatten(cfg.to_dict())
    for k, v in when.items():
        allowed = v if isinstance(v, list) and not _is_list_value(k) else [v]
        if _norm(flat.get(k)) not in [_norm(a) for a in allowed]:
            return False
    return True


def _resolve(dotted: dict[str, Any], tag: str) -> TrialConfig:
    """load_config(base=...) with the structured schema built once (4x faster for big sweeps);
    an invalid value goes through load_config itself so its error reads the same."""
    base = nest(dotted)
    try:
        obj = OmegaConf.to_object(OmegaConf.merge(_SCHEMA, base))
        assert isinstance(obj, TrialConfig)
        cfg = validate(obj)
    except ConfigError as e:
        raise SweepError(f"{tag}: {_with_allowed_tp(str(e), obj)}") from None
    except OmegaConfBaseException:
        try:
            cfg = load_config([], base=base)
        except ConfigError as e:
            raise SweepError(f"{tag}: {e}") from None
    if cfg.canzona.cost == "measured":  # the profile file must exist and fit: check it now
        from canzona.plan.methods import make_plan

        try:
            make_plan(cfg)
        except ConfigError as e:
            raise SweepError(f"{tag}: {e}") from None
    return cfg


def _with_allowed_tp(msg: str, cfg: TrialConfig) -> str:
    """Append the TP sizes the model allows to a 'parallel.tp=N does not divide ...' error."""
    if not msg.startswith("parallel.tp="):
        return msg
    from canzona.inventory import check_tp

    try:
        mcfg = cfg.model_cfg()
    except ConfigError:
        return msg
    ok = []
    for tp in range(1, 129):
        try:
            check_tp(mcfg, tp)
            ok.append(str(tp))
        except ConfigError:
            pass
    return f"{msg}; allowed parallel.tp for {mcfg.name}: {', '.join(ok)}"


# --------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class JobShape:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int


def slurm_shape(cfg: TrialConfig, s: SlurmSettings) -> JobShape:
    world = cfg.world_size
    tpn = s.tasks_per_node or (s.gpus_per_node if s.gpus_per_node else world)
    tpn = min(tpn, world)
    if s.gpus_per_node and tpn > s.gpus_per_node:
        raise SweepError(
            f"slurm.tasks_per_node={tpn} exceeds slurm.gpus_per_node={s.gpus_per_node} (one rank per GPU)"
        )
    if world % tpn:
        raise SweepError(
            f"dp x tp = {cfg.parallel.dp} x {cfg.parallel.tp} = {world} ranks do not fill whole nodes of "
            f"{tpn} tasks; choose dp x tp a multiple of {tpn} or set slurm.tasks_per_node"
        )
    return JobShape(world // tpn, tpn, s.gpus_per_node if s.gpus_per_node else 0, s.cpus_per_task)


def check_layouts(plan: Plan) -> None:
    s = plan.settings
    if s.cluster == "simulate":  # any layout can be projected
        return
    for t in plan.trials:
        if s.cluster in ("local", "debug"):
            if t.world_size > s.local.max_ranks:
                raise SweepError(
                    f"trial {t.id} needs dp x tp = {t.world_size} ranks; cluster={s.cluster} allows at most "
                    f"local.max_ranks={s.local.max_ranks} (raise it, pick a smaller layout, or use cluster=slurm)"
                )
        else:
            try:
                slurm_shape(t.cfg, s.slurm)
            except SweepError as e:
                raise SweepError(f"trial {t.id}: {e}") from None
