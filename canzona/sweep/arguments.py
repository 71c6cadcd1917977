"""The sweep command line: ``key=value`` items -> settings overrides, axis selections and
trial values.

`canzona.overrides.split_argv` splits the items (``model=``/``optimizer=`` shorthands
applied, anything that is not ``key=value`` refused). A key is then, in this order:

- a sweep setting (`canzona.sweep.settings`): typed by that schema;
- an axis of the sweep (``method=canzona,sync``, ``size=8b``): keeps those values;
- a trial key (``train.steps=3``): a value for every trial, typed by `TrialConfig`;

and anything else is refused with the keys of all three kinds listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from canzona.config import RENAMED as TRIAL_RENAMED
from canzona.config import SHORTHANDS
from canzona.errors import ConfigError
from canzona.overrides import split_argv, typed_value
from canzona.sweep.keys import (
    TRIAL_SECTIONS,
    check_trial_key,
    fmt_value,
    is_list_value,
    parse_value,
    same_value,
    split_top_commas,
    trial_key_names,
)
from canzona.sweep.settings import is_settings_key, settings_names
from canzona.sweep.sweepfile import Axis

USAGE_HINT = "or 'list'"


@dataclass
class SweepArgs:
    """A sweep command line, split by kind (trial keys and axes resolved against the sweep)."""

    settings: list[tuple[str, str]] = field(default_factory=list)
    rest: list[tuple[str, str]] = field(default_factory=list)  # axes or trial keys, in order

    def first(self) -> list[tuple[str, str]]:
        """The settings needed to find the sweep file (``sweep=``, ``profile=``)."""
        return [(k, v) for k, v in self.settings if k in ("sweep", "profile")]


def split_args(items: Sequence[str]) -> SweepArgs:
    parts = split_argv(items, shorthands=SHORTHANDS, usage=USAGE_HINT)
    out = SweepArgs()
    for key, value in parts.overrides:
        (out.settings if is_settings_key(key) else out.rest).append((key, value))
    return out


@dataclass
class Selection:
    """Axis labels the command line keeps, and trial values it sets for every trial."""

    restrict: dict[str, list[str]] = field(default_factory=dict)
    trial_values: dict[str, Any] = field(default_factory=dict)


def select(args: SweepArgs, axes: dict[str, Axis], sweep_name: str) -> Selection:
    """Resolve the non-settings items against the sweep's ``axes`` (which may gain scalar
    values: ``optimizer=shampoo`` on an ``optimizer.name`` axis that lacks it)."""
    sel = Selection()
    for key, value in args.rest:
        if key in axes:
            ax = axes[key]
            parts = [value] if is_list_value(key) else split_top_commas(value)
            # scalar axis values go through YAML, as the sweep file's did, so `2` finds label 2
            values = [p if ax.bundle else parse_value(p) for p in parts]
            sel.restrict[key] = ax.labels_for(values, "command line")
            continue
        if key.split(".")[0] not in TRIAL_SECTIONS and key not in TRIAL_RENAMED:
            raise ConfigError(
                f"unknown key {key!r}; sweep keys: {', '.join(settings_names())}; "
                f"axes of {sweep_name}: {', '.join(axes) or '(none)'}; trial keys: {', '.join(trial_key_names())}"
            )
        check_trial_key(key, "command line")
        sel.trial_values[key] = typed_value(value)  # typed by TrialConfig when the trial resolves
    for key, value in sel.trial_values.items():
        _refuse_contradicted_axis(key, value, axes, sel.restrict)
    return sel


def _refuse_contradicted_axis(key: str, value: Any, axes: dict[str, Axis], restrict: dict[str, list[str]]) -> None:
    """A trial key that an axis value of the chosen trials sets otherwise would make trials whose
    names and axis columns say one thing and whose config another (``size=0.6b`` running 8B)."""
    for ax in axes.values():
        if not ax.bundle:
            continue
        for label in restrict.get(ax.name, list(ax.values)):
            if key in ax.values[label] and not same_value(ax.values[label][key], parse_value(fmt_value(value))):
                raise ConfigError(
                    f"command line: {key}={fmt_value(value)} contradicts axis {ax.name}={label}, which sets "
                    f"{key}={fmt_value(ax.values[label][key])}; select another value of axis {ax.name} "
                    f"(allowed: {', '.join(ax.values)}) or change the sweep file"
                )
