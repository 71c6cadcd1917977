"""What an expanded sweep is: a `ExpandedSweep` of `SweepTrial`s, each run ``repeats`` times.

The launcher, the bookkeeping and the progress line work on `TrialRun`s (one folder each);
`ExpandedSweep.runs` orders them so that repeated measurements can be compared fairly: see there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canzona.config import TrialConfig
from canzona.sweep.ids import run_id
from canzona.sweep.settings import SweepSettings


@dataclass
class SweepTrial:
    """One trial of a sweep: a resolved config, its id and the axis labels that made it."""

    id: str
    axes: dict[str, str]  # axis name -> label
    cfg: TrialConfig

    @property
    def world_size(self) -> int:
        return self.cfg.world_size

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.axes.items())


@dataclass(frozen=True)
class TrialRun:
    """One repetition of a trial: what is launched, recorded and resumed as a unit."""

    trial: SweepTrial
    repeat: int  # 1-based
    repeats: int

    @property
    def id(self) -> str:
        """The run's folder name under the results folder (see `canzona.sweep.ids`)."""
        return run_id(self.trial.id, self.repeat)

    @property
    def cfg(self) -> TrialConfig:
        return self.trial.cfg

    @property
    def axes(self) -> dict[str, str]:
        return self.trial.axes

    @property
    def world_size(self) -> int:
        return self.trial.world_size

    def record(self) -> dict[str, Any]:
        """The fields status.json carries so that analysis can pool the repetitions of a trial."""
        return {"trial_id": self.trial.id, "repeat": self.repeat, "repeats": self.repeats}


@dataclass
class ExpandedSweep:
    sweep: str
    path: Path
    profile: str | None  # the sweep profile (a variant of the sweep file)
    description: str
    settings: SweepSettings
    axes: list[str]
    trials: list[SweepTrial]

    @property
    def repeats(self) -> int:
        """Runs per trial: ``repeats``, except that a projection is deterministic (one run)."""
        return 1 if self.settings.cluster in ("simulate", "dryrun") else self.settings.repeats

    def runs(self) -> list[TrialRun]:
        """Every run, in the order they are launched: repetition by repetition; within one, the
        trials of a point (same model, layout and training settings) back to back, those that
        differ only in their method next to each other, in the sweep's order in odd repetitions
        and reversed in even ones (A B C, C B A, A B C, ...).

        Load on a shared machine drifts; a method whose runs all fell in a slow stretch would
        look slower than it is. Run this way, the methods compared at a point run seconds
        apart in every repetition, so drift hits them alike (and the report pairs their
        repetitions); the reversal cancels a steady trend within a point and keeps any method
        from always running first; and the spread across repetitions, which the report's
        intervals resample, sees the drift instead of hiding it."""
        points: dict[str, list[SweepTrial]] = {}
        for t in self.trials:
            points.setdefault(_point_key(t.cfg), []).append(t)
        for key, group in points.items():  # trials compared with one another: adjacent
            rank = {c: i for i, c in enumerate(dict.fromkeys(_comparison_key(t.cfg) for t in group))}
            points[key] = sorted(group, key=lambda t: rank[_comparison_key(t.cfg)])
        out = []
        for rep in range(1, self.repeats + 1):
            for group in points.values():
                order = group if rep % 2 else group[::-1]
                out += [TrialRun(t, rep, self.repeats) for t in order]
        return out

    @property
    def results_dir(self) -> Path:
        """``results/<sweep>``; projections (cluster=simulate) go to a folder of their own,
        ``results/<sweep>-<profile>-sim-<hardware>``, so that they never mix with -- or, sharing
        trial ids, stand in for -- measured trials, and each hardware keeps its own."""
        if self.settings.cluster == "simulate":
            parts = [
                self.sweep,
                *([self.profile] if self.profile else []),
                "sim",
                sim_hardware_label(str(self.sim_hardware)),
            ]
            return Path(self.settings.results) / "-".join(parts)
        if self.settings.cluster == "dryrun":  # dry runs: a folder of their own too
            return Path(self.settings.results) / "-".join([self.sweep, *([self.profile] if self.profile else []), "dryrun"])
        return Path(self.settings.results) / self.sweep

    @property
    def sim_hardware(self) -> str | None:
        """The hardware of this sweep: ``sim.hardware`` if given; else the default (h100) for
        cluster=simulate, hardware/local.yaml (if it exists) for the report of a measured sweep."""
        from canzona.hardware import DEFAULT_HARDWARE, local_file

        if self.settings.sim.hardware:
            return self.settings.sim.hardware
        if self.settings.cluster == "simulate":
            return DEFAULT_HARDWARE

        local = local_file()
        return str(local) if local is not None else None


def _point_key(cfg: TrialConfig) -> str:
    """What the methods compared at one point share: model, layout and training settings."""
    return repr((cfg.model, cfg.parallel, cfg.train))


def _comparison_key(cfg: TrialConfig) -> str:
    """A trial's config but for its method: trials equal in it are compared with one another."""
    d = cfg.to_dict()
    d.pop("method", None)
    d.pop("out", None)
    return repr(d)


def sim_hardware_label(hardware: str) -> str:
    """h100 -> h100; hardware/local.yaml -> local (a folder-name-safe label)."""
    stem = Path(str(hardware)).stem if str(hardware).endswith((".yaml", ".yml")) else str(hardware)
    return re.sub(r"[^A-Za-z0-9_.]+", "_", stem) or "hardware"
