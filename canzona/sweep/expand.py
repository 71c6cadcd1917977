"""Expansion: a sweep file and a command line -> a validated `ExpandedSweep`. Pure: reads YAML,
writes nothing.

The grammar of sweep files is in `canzona.sweep.sweepfile`, the command line in
`canzona.sweep.arguments`. Here the chosen sweep profile's axes are multiplied out, ``exclude``
entries dropped, ``include`` entries added, command-line values and then ``rules`` applied,
and every trial resolved and validated as a `TrialConfig`. Trials whose resolved configs are
equal collapse into one (same trial id).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from pathlib import Path
from typing import Any

from canzona.config import TrialConfig, validate
from canzona.errors import ConfigError
from canzona.overrides import build
from canzona.sweep.arguments import Selection, select, split_args
from canzona.sweep.ids import trial_id
from canzona.sweep.jobshape import check_layouts
from canzona.sweep.keys import (
    SCHEMA,
    as_list,
    check_trial_key,
    flatten,
    fmt_value,
    is_list_value,
    nest,
    same_value,
)
from canzona.sweep.settings import build_settings
from canzona.sweep.sweepfile import (
    CONFIGS_DIR,
    Axis,
    Rule,
    Section,
    available_sweeps,
    exclusions,
    load_sweep_file,
    merge_sections,
)
from canzona.sweep.trials import ExpandedSweep, SweepTrial


def expand_sweep(items: Sequence[str], configs_dir: Path = CONFIGS_DIR) -> ExpandedSweep:
    """Parse ``key=value`` items, load the sweep, expand and validate every trial."""
    args = split_args(items)
    first = build_settings(args.first())
    if not first.sweep:
        raise ConfigError(
            f"missing sweep=NAME; available: {', '.join(available_sweeps(configs_dir)) or '(none)'}"
        )
    sf = load_sweep_file(first.sweep, configs_dir)
    profile = first.profile or sf.default_profile
    if sf.profiles and profile not in sf.profiles:
        raise ConfigError(
            f"profile={profile!r} is not a profile of sweep {sf.name}; allowed: {', '.join(sf.profiles)}"
        )
    if not sf.profiles and first.profile:
        raise ConfigError(f"sweep {sf.name} has no profiles; drop profile={first.profile}")
    settings = build_settings(args.settings, sf.settings_layers(profile))
    settings.sweep, settings.profile = sf.name, profile

    sec = merge_sections(sf, profile)
    axes = {a.name: a.copy() for a in sec.axes}
    sel = select(args, axes, sf.name)
    where = f"sweep {sf.name}" + (f" (profile {profile})" if profile else "")
    trials = expand(sec, axes, sel, where)
    check_layouts(trials, settings)
    return ExpandedSweep(sf.name, sf.path, profile, sf.description, settings, list(axes), trials)


def expand(sec: Section, axes: dict[str, Axis], sel: Selection, where: str) -> list[SweepTrial]:
    """Every trial of a merged section under a command-line selection, in grid order."""
    trials: list[SweepTrial] = []
    seen: set[str] = set()
    for combo, extras in _combinations(sec, axes, sel.restrict, where):
        dotted = dict(sec.fixed)
        for name, label in combo.items():
            dotted.update(axes[name].values[label])
        dotted.update(extras)
        dotted.update(sel.trial_values)
        tag = f"{where}, trial {' '.join(f'{k}={v}' for k, v in combo.items()) or '(only)'}"
        cfg = resolve(dotted, tag)
        changed = False
        for rule in sec.rules:
            if _matches(cfg, rule):
                dotted.update(rule.set)
                changed = True
        if changed:
            cfg = resolve(dotted, tag)
        tid = trial_id(cfg)
        if tid in seen:
            continue
        seen.add(tid)
        if changed:  # show what the rules made of scalar axes (method=adamw -> optimizer.name=adamw)
            flat = flatten(cfg.to_dict())
            combo = {k: (fmt_value(flat[k]) if not axes[k].bundle else v) for k, v in combo.items()}
        trials.append(SweepTrial(tid, dict(combo), cfg))
    if not trials:
        raise ConfigError(f"{where}: no trials left after include/exclude and the command-line selection")
    return trials


def _combinations(
    sec: Section, axes: dict[str, Axis], restrict: dict[str, list[str]], where: str
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """(axis -> label, extra trial values) for the grid minus exclusions, then each include."""
    names = list(axes)
    lists = [restrict.get(n, list(axes[n].values)) for n in names]  # include entries add values later
    included: list[tuple[dict[str, str], dict[str, Any]]] = []
    for inc in sec.include:
        chosen: dict[str, list[str]] = {}
        extras: dict[str, Any] = {}
        for k, v in inc:
            if k in axes:
                chosen[k] = axes[k].labels_for(as_list(k, v), f"{where} include")
            else:
                check_trial_key(k, f"{where} include")
                extras[k] = v
        inc_lists = [chosen.get(n, base) for n, base in zip(names, lists)]
        for values in product(*inc_lists):
            combo = dict(zip(names, values))
            if all(combo[k] in labels for k, labels in restrict.items()):
                included.append((combo, dict(extras)))
    # A command-line value that only include entries name, and that selects some of them, selects
    # those trials and does not join the grid (``method=megatron_zero1`` on a profile that adds it
    # by include with its own optimizer); one no selected include has extends the grid as usual.
    only_included = _include_only_labels(sec)
    grid_lists = [
        [v for v in lst if not (v in only_included.get(n, ()) and any(c[n] == v for c, _ in included))]
        if n in restrict else lst
        for n, lst in zip(names, lists)
    ]
    excludes = exclusions(sec, axes, where)
    out: list[tuple[dict[str, str], dict[str, Any]]] = []
    for values in product(*grid_lists):
        combo = dict(zip(names, values))
        if any(all(combo[k] in s for k, s in ex.items()) for ex in excludes):
            continue
        out.append((combo, {}))
    return out + included


def _include_only_labels(sec: Section) -> dict[str, set[str]]:
    """Per axis, the labels some include entry names that the section's own grid does not have."""
    grid = {a.name: a for a in sec.axes}
    out: dict[str, set[str]] = {}
    for inc in sec.include:
        for k, v in inc:
            ax = grid.get(k)
            if ax is None:
                continue
            labels = {ax.label_of(x) for x in as_list(k, v)}
            out.setdefault(k, set()).update(labels - set(ax.values))
    return out


def _matches(cfg: TrialConfig, rule: Rule) -> bool:
    flat = flatten(cfg.to_dict())
    for k, v in rule.when.items():
        allowed = v if isinstance(v, list) and not is_list_value(k) else [v]
        if not any(same_value(flat.get(k), a) for a in allowed):
            return False
    return True


def resolve(dotted: dict[str, Any], tag: str) -> TrialConfig:
    """Dotted trial values -> a validated `TrialConfig` (merged into the schema built once)."""
    try:
        obj = build(SCHEMA, base=nest(dotted), what="trial")
    except ConfigError as e:
        raise ConfigError(f"{tag}: {e}") from None
    assert isinstance(obj, TrialConfig)
    try:
        cfg = validate(obj)
    except ConfigError as e:
        raise ConfigError(f"{tag}: {_with_allowed_tp(str(e), obj)}") from None
    if cfg.method.peer:  # what the peer's own code refuses, refused before anything runs
        from canzona.peers.trial import check_peer

        try:
            check_peer(cfg)
        except ConfigError as e:
            raise ConfigError(f"{tag}: {e}") from None
    if cfg.planner.cost == "measured":  # planner.measured_table must exist and fit: check it now
        from canzona.plan.from_config import make_plan

        try:
            make_plan(cfg)
        except ConfigError as e:
            raise ConfigError(f"{tag}: {e}") from None
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
