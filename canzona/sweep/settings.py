"""Sweep settings: how a sweep runs, as opposed to what its trials are.

The schema (`SweepSettings` and its ``slurm`` / ``local`` / ``sim`` sections) is merged from
the sweep file's ``sweep:`` section, the chosen sweep profile's ``sweep:`` section and the
command line, in that order, by `canzona.overrides.build`: an unknown key is refused with the
keys allowed at its level, a value of the wrong type names the key, a renamed key (`RENAMED`)
says what it is now. Settings never enter a trial's config, so they never change a trial id.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from canzona.errors import ConfigError
from canzona.overrides import Renamed, build
from canzona.schema_doc import check_choices, key_docs, setting

CLUSTERS = ("local", "debug", "slurm", "simulate", "dryrun")
RERUN = ("failed", "all", "none")
LOCAL_MODES = ("worker", "spawn", "tasks")


@dataclass
class SlurmSettings:
    partition: str | None = setting(None, "Slurm partition (sbatch --partition)")
    account: str | None = setting(None, "Slurm account (--account)")
    qos: str | None = setting(None, "Slurm QOS (--qos)")
    time: str = setting("01:00:00", "time limit per trial: minutes, HH:MM:SS or D-HH:MM:SS")
    constraint: str | None = setting(None, "node features (--constraint)")
    mem: str | None = setting(None, "memory per node, e.g. 200G (--mem)")
    gpus_per_node: int = setting(0, "GPUs per node; 0: CPU ranks over gloo")
    tasks_per_node: int | None = setting(None, "ranks per node; null: gpus_per_node, or the trial's world size "
                                               "on CPU")
    cpus_per_task: int = setting(1, "cores per rank (--cpus-per-task)")
    setup: list[str] = setting(help="shell lines run before the ranks start (e.g. [module load cuda])",
                               default_factory=list)
    extra_sbatch: list[str] = setting(help="raw sbatch options, e.g. [--exclusive]", default_factory=list)
    array: bool = setting(True, "submit trials of the same job shape as one job array")
    array_parallelism: int = setting(64, "array tasks running at once")
    python: str | None = setting(None, "interpreter on the compute nodes; null: this one")
    job_name: str | None = setting(None, "job name; null: canzona-<sweep>")


@dataclass
class LocalSettings:
    max_ranks: int = setting(4, "most ranks one local trial may start (dp x tp)")
    parallel: int = setting(1, "trials run at once")
    mode: str = setting("worker", "worker: long-lived processes run one run after another (torch and the ranks' "
                                  "forkserver start once); spawn: a submitit job per run whose task forks the "
                                  "ranks; tasks: a submitit task per rank (the Slurm code path)", choices=LOCAL_MODES)
    timeout_min: float = setting(20.0, "minutes a trial may run before it is killed with its ranks")


@dataclass
class SimSettings:
    """``cluster=simulate``: project every trial with `canzona.sim` instead of running it."""

    hardware: str | None = setting(None, "hardware file (h100, h200, a100, local, or a YAML path) that "
                                         "cluster=simulate projects with (default h100) and that the report of a "
                                         "measured sweep predicts with (default hardware/local.yaml if present)")
    workers: int = setting(0, "processes projecting trials at once; 0: one per core")
    calibrate: bool = setting(True, "cluster=local with no sim.hardware and no hardware/local.yaml: calibrate this "
                                    "machine once (in slices between the runs, sim.calibrate_slices; reused after, "
                                    "per host, CPU and torch) so the report predicts the measured trials "
                                    "(canzona.calibrate.machine)")
    calibrate_slices: int = setting(5, "sim.calibrate: the calibration in this many slices spread between the "
                                       "sweep's runs (about 1.5 min each on 2 cores), their median kept "
                                       "(1: once, after the runs)")
    calibrate_quick: bool = setting(False, "sim.calibrate: quick calibration slices (half the time, rougher)")


@dataclass
class SweepSettings:
    sweep: str | None = setting(None, "the sweep: a name under sweeps/configs/ or a YAML path")
    profile: str | None = setting(None, "a variant of the sweep defined in its file (e.g. paper, ablation)")
    cluster: str = setting("local", "where trials run: local processes, debug (submitit in-process), slurm, "
                                    "simulate (projected with canzona.sim), dryrun (fake CUDA devices)",
                           choices=CLUSTERS)
    rerun: str = setting("failed", "which trials with records run again: failed ones, all, none", choices=RERUN)
    list: bool = setting(False, "list the runs (and, with cluster=slurm, write the sbatch scripts) and run "
                                "nothing")
    results: str = setting("results", "the results folder; a sweep writes into <results>/<sweep>/ (cluster=simulate: "
                                      "<sweep>-<profile>-sim-<hardware>/, dryrun: <sweep>-<profile>-dryrun/)")
    poll_s: float = setting(1.0, "seconds between checks of running trials")
    repeats: int = setting(1, "runs of every trial, interleaved round-robin; repetition k > 1 goes to "
                              "<trial_id>-r<k>/ and the report pools them")
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    local: LocalSettings = field(default_factory=LocalSettings)
    sim: SimSettings = field(default_factory=SimSettings)


# Keys that were renamed (`canzona.overrides.Renamed`): given the old way, on the command line or
# in a sweep file's ``sweep:`` section, one line says what to write instead.
RENAMED = {
    "dry_run": Renamed("list", "list=true lists the runs and runs nothing; a dry run on fake CUDA devices is "
                               "cluster=dryrun"),
    "sim.profile": Renamed("sim.hardware", "the hardware file: h100, h200, a100, local, or a YAML path; profile= "
                                           "stays the sweep profile"),
}


SETTINGS_KEYS = tuple(f.name for f in fields(SweepSettings))
SETTINGS_DOCS = tuple(key_docs(SweepSettings))
SECTIONS = ("slurm", "local", "sim")


def is_settings_key(key: str) -> bool:
    """Whether a command-line key belongs to the sweep settings (else: an axis or trial key)."""
    return key.split(".")[0] in SETTINGS_KEYS or key in RENAMED


def settings_names() -> list[str]:
    """The settings keys as an error message lists them (sections as ``slurm.*``)."""
    return [f"{k}.*" if k in SECTIONS else k for k in SETTINGS_KEYS]


def build_settings(
    overrides: Iterable[tuple[str, str]] = (), layers: Iterable[Mapping[str, Any] | None] = ()
) -> SweepSettings:
    """Merge the YAML ``layers`` then the command-line ``(key, text)`` overrides into a
    validated `SweepSettings`; any bad key or value is a one-line `ConfigError`."""
    obj = build(SweepSettings, overrides, layers=layers, what="sweep", renamed=RENAMED)
    check_choices(obj, SETTINGS_DOCS)
    if obj.repeats < 1:
        raise ConfigError(f"repeats={obj.repeats} is not allowed; it must be >= 1 (runs of every trial)")
    if obj.sim.workers < 0:
        raise ConfigError("sim.workers must be >= 0 (0: one per core)")
    if obj.sim.calibrate_slices < 1:
        raise ConfigError(f"sim.calibrate_slices={obj.sim.calibrate_slices} is not allowed; it must be >= 1")
    if obj.local.max_ranks < 1 or obj.local.parallel < 1:
        raise ConfigError("local.max_ranks and local.parallel must be >= 1")
    if obj.slurm.gpus_per_node < 0 or obj.slurm.cpus_per_task < 1:
        raise ConfigError("slurm.gpus_per_node must be >= 0 and slurm.cpus_per_task >= 1")
    time_minutes(obj.slurm.time)
    return obj


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
