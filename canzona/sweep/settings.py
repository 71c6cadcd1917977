"""Sweep settings: how a sweep runs, as opposed to what its trials are.

The schema (`SweepSettings` and its ``slurm`` / ``local`` / ``sim`` sections) is merged from
the sweep file's ``sweep:`` section, the chosen profile's ``sweep:`` section and the command
line, in that order, by `canzona.overrides.build`: an unknown key is refused with the keys
allowed at its level, a value of the wrong type names the key. Settings never enter a trial's
config, so they never change a trial id.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from canzona.errors import ConfigError
from canzona.overrides import build

CLUSTERS = ("local", "debug", "slurm", "simulate", "dryrun")
RERUN = ("failed", "all", "none")
LOCAL_MODES = ("worker", "spawn", "tasks")
DEFAULT_SIM_PROFILE = "h100"


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
    # worker: long-lived processes run one run after another (torch and the ranks' forkserver
    # start once); spawn: a submitit job per run whose task forks the ranks; tasks: a submitit
    # task per rank (the Slurm code path)
    mode: str = "worker"
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
    # Runs of every trial, interleaved round-robin (see `SweepPlan.runs`): a measurement is
    # only as decisive as its spread across runs, and on a shared machine load drifts.
    repeats: int = 1
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    local: LocalSettings = field(default_factory=LocalSettings)
    sim: SimSettings = field(default_factory=SimSettings)


SETTINGS_KEYS = tuple(f.name for f in fields(SweepSettings))
SECTIONS = ("slurm", "local", "sim")


def is_settings_key(key: str) -> bool:
    """Whether a command-line key belongs to the sweep settings (else: an axis or trial key)."""
    return key.split(".")[0] in SETTINGS_KEYS


def settings_names() -> list[str]:
    """The settings keys as an error message lists them (sections as ``slurm.*``)."""
    return [f"{k}.*" if k in SECTIONS else k for k in SETTINGS_KEYS]


def build_settings(
    overrides: Iterable[tuple[str, str]] = (), layers: Iterable[Mapping[str, Any] | None] = ()
) -> SweepSettings:
    """Merge the YAML ``layers`` then the command-line ``(key, text)`` overrides into a
    validated `SweepSettings`; any bad key or value is a one-line `ConfigError`."""
    obj = build(SweepSettings, list(overrides), layers=list(layers), what="sweep")
    _choice("cluster", obj.cluster, CLUSTERS)
    _choice("rerun", obj.rerun, RERUN)
    _choice("local.mode", obj.local.mode, LOCAL_MODES)
    if obj.repeats < 1:
        raise ConfigError(f"repeats={obj.repeats} is not allowed; it must be >= 1 (runs of every trial)")
    if obj.sim.workers < 0:
        raise ConfigError("sim.workers must be >= 0 (0: one per core)")
    if obj.local.max_ranks < 1 or obj.local.parallel < 1:
        raise ConfigError("local.max_ranks and local.parallel must be >= 1")
    if obj.slurm.gpus_per_node < 0 or obj.slurm.cpus_per_task < 1:
        raise ConfigError("slurm.gpus_per_node must be >= 0 and slurm.cpus_per_task >= 1")
    time_minutes(obj.slurm.time)
    return obj


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def time_minutes(value: str | int | float) -> int:
    """Slurm time ('90', '30:00' = MM:SS, '01:30:00', '1-00', '1-00:00:00') -> whole minutes."""
    s = str(value).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", s)
    if not m:
        raise ConfigError(f"slurm.time={s!r} is not a Slurm time; use minutes, HH:MM:SS or D-HH:MM:SS")
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
