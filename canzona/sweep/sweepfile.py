"""The sweep-file grammar: ``sweeps/configs/<name>.yaml`` -> a checked `Section` per profile.

A sweep file::

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
    sweep: {cluster: local, repeats: 1}  # sweep settings (`canzona.sweep.settings.SweepSettings`)
    profiles:                          # profile=NAME selects one; each may hold fixed, grid
      local: {...}                     # (an axis set here replaces the top-level one; null
      paper: {...}                     # removes it), include, exclude, rules, sweep, description

Precedence for a trial value: fixed < axis value < include extras < command line < rules.
This module reads and checks the file (every trial key exists, every entry has the right
shape); `canzona.sweep.expand` turns a `Section` into trials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from canzona import CHECKOUT
from canzona.errors import ConfigError
from canzona.sweep.keys import as_list, check_trial_key, flatten, fmt_value, normalize_key

CONFIGS_DIR = CHECKOUT / "sweeps" / "configs"
TOP_KEYS = (
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
PROFILE_KEYS = ("description", "fixed", "grid", "include", "exclude", "rules", "sweep")


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

    def settings_layers(self, profile: str | None) -> list[dict[str, Any]]:
        """The file's ``sweep:`` settings, then the profile's: merged in that order."""
        layers = [self.raw.get("sweep") or {}]
        if profile is not None:
            layers.append(self.raw["profiles"][profile].get("sweep") or {})
        return layers


def available_sweeps(configs_dir: Path = CONFIGS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(configs_dir).glob("*.yaml"))


def load_sweep_file(name: str, configs_dir: Path = CONFIGS_DIR) -> SweepFile:
    """A sweep by name (under ``configs_dir``) or by path; its top-level and profile keys checked."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"sweep file {name!r} not found")
    else:
        path = Path(configs_dir) / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"unknown sweep {name!r}; available: {', '.join(available_sweeps(configs_dir)) or '(none)'}"
            )
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
        raise ConfigError(f"{path}: invalid YAML{where}: {what or str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with keys {', '.join(TOP_KEYS)}")
    check_keys(raw, TOP_KEYS, str(path))
    for pname, prof in (raw.get("profiles") or {}).items():
        if not isinstance(prof, dict):
            raise ConfigError(f"{path}: profile {pname!r} must be a mapping with keys {', '.join(PROFILE_KEYS)}")
        check_keys(prof, PROFILE_KEYS, f"{path} profile {pname}")
    return SweepFile(path.stem, path, raw)


def check_keys(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown key {k!r}; allowed: {', '.join(allowed)}")


# --------------------------------------------------------------------------- axes
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
                raise ConfigError(
                    f"{where}: {self.name}={bad[0]!r} is not a value of axis {self.name}; allowed: {', '.join(self.values)}"
                )
            return [str(x) for x in items]
        return [self.add_scalar(x) for x in items]

    def label_of(self, item: Any) -> str:
        """The label a value of this axis goes by (a bundle's name, a scalar's formatted value)."""
        return str(item) if self.bundle else fmt_value(item)

    def existing_labels(self, items: list[Any], where: str) -> list[str]:
        """Labels of values the axis already has (exclude entries): a typo is an error."""
        labels = [self.label_of(x) for x in items]
        bad = [lb for lb in labels if lb not in self.values]
        if bad:
            raise ConfigError(
                f"{where}: {self.name}={bad[0]!r} is not a value of axis {self.name}; allowed: {', '.join(self.values)}"
            )
        return labels

    def copy(self) -> Axis:
        return Axis(self.name, self.bundle, dict(self.values))


def _axis(name: str, vals: Any, where: str) -> Axis:
    if isinstance(vals, dict):
        values = {}
        for label, bundle in vals.items():
            if not isinstance(bundle, dict):
                raise ConfigError(f"{where}: axis {name} value {label!r} must be a mapping of trial keys")
            flat = flatten(bundle)
            for k in flat:
                check_trial_key(k, f"{where} axis {name}.{label}")
            values[str(label)] = flat
        if not values:
            raise ConfigError(f"{where}: axis {name} has no values")
        return Axis(name, True, values)
    check_trial_key(name, f"{where} axis")
    if not isinstance(vals, list) or not vals:
        raise ConfigError(
            f"{where}: axis {name} must be a non-empty list of values (or a mapping label -> trial values)"
        )
    ax = Axis(name, False, {})
    for v in vals:
        ax.add_scalar(v)
    return ax


# --------------------------------------------------------------------------- sections
@dataclass
class Rule:
    when: dict[str, Any]  # dotted trial key -> value or list of values
    set: dict[str, Any]  # dotted trial key -> value


@dataclass
class Section:
    """A sweep file with its chosen profile merged in: what expansion works from."""

    fixed: dict[str, Any]
    axes: list[Axis]
    include: list[list[tuple[str, Any]]]  # per entry: (normalized key, value) pairs
    exclude: list[dict[str, Any]]
    rules: list[Rule]


def merge_sections(sf: SweepFile, profile: str | None) -> Section:
    """The top level, then the profile: ``fixed`` and ``grid`` merge key by key (an axis set to
    null in the profile is removed), ``include``/``exclude``/``rules`` append."""
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
            raise ConfigError(f"{where}: 'fixed' must be a mapping of trial keys to values")
        fixed.update(flatten(fx))
        grid = part.get("grid") or {}
        if not isinstance(grid, dict):
            raise ConfigError(f"{where}: 'grid' must be a mapping of axis name to values")
        for name, vals in grid.items():
            key = normalize_key(str(name))
            axes.pop(key, None)
            axes[key] = None if vals is None else _axis(key, vals, where)
        for key, dest in (("include", include), ("exclude", exclude), ("rules", rules)):
            items = part.get(key) or []
            if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
                raise ConfigError(f"{where}: '{key}' must be a list of mappings")
            dest.extend(items)
    for k in fixed:
        check_trial_key(k, f"{where} fixed")
    return Section(
        fixed,
        [a for a in axes.values() if a is not None],
        [_include_items(inc) for inc in include],
        exclude,
        [_rule(r, where) for r in rules],
    )


def _include_items(inc: dict[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for k, v in inc.items():
        key = normalize_key(str(k))
        if isinstance(v, dict):
            items.extend(flatten(v, key).items())
        else:
            items.append((key, v))
    return items


def _rule(r: dict[str, Any], where: str) -> Rule:
    check_keys(r, ("when", "set"), f"{where} rule")
    when, sets = flatten(r.get("when") or {}), flatten(r.get("set") or {})
    for k in [*when, *sets]:
        check_trial_key(k, f"{where} rule")
    return Rule(when, sets)


def exclusions(sec: Section, axes: dict[str, Axis], where: str) -> list[dict[str, set[str]]]:
    """The ``exclude`` entries as axis -> excluded labels (an entry drops a combination that
    matches all of its axes); a key that is not an axis or a value it does not have is an error."""
    out = []
    for ex in sec.exclude:
        sel = {}
        for k, v in ex.items():
            k = normalize_key(str(k))
            if k not in axes:
                raise ConfigError(
                    f"{where}: exclude key {k!r} is not an axis; axes: {', '.join(axes) or '(none)'}"
                )
            sel[k] = set(axes[k].existing_labels(as_list(k, v), f"{where} exclude"))
        out.append(sel)
    return out
