"""Launching trials with submitit: the job callable, one backend per cluster, sbatch files.

- ``cluster=local``  `submitit.LocalExecutor`, one job per trial. ``local.mode=spawn`` (default):
  the job's one task calls `canzona.run.run_trial`, which forks the dp x tp ranks from a
  forkserver that imports torch and megatron-core once, and kills the other ranks as soon as one
  fails; the task kills any rank left on interrupt or timeout. ``local.mode=tasks``:
  ``tasks_per_node`` = dp x tp, every task is one rank (`TorchDistributedEnvironment().export()`,
  then `canzona.run.run_rank_from_env`) -- the code path of Slurm, but every rank imports torch
  and megatron-core itself: on 2 cores about 4x the CPU time of spawn for 4-rank trials.
  ``local.parallel`` trials run at once (default 1: ranks x threads must fit the cores, §6).
- ``cluster=debug``  `submitit.DebugExecutor`: `run_trial` in this process, one trial at a time.
- ``cluster=slurm``  `submitit.AutoExecutor(cluster="slurm")`: nodes x tasks_per_node ranks per
  job, rendezvous from Slurm's environment; trials with the same job shape go out as one job
  array. The callable is checkpointable, so a preempted job is requeued (a timed-out one is not).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import submitit

from canzona.net import free_port
from canzona.sweep.expand import (
    REPO,
    JobShape,
    Plan,
    SweepSettings,
    Trial,
    config_overrides,
    slurm_shape,
    time_minutes,
)

TEMPLATE_DIR = REPO / "slurm" / "templates"
# Messages that are usually the consequence of another rank failing, not the cause.
_COLLATERAL = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl", "timed out", "socket")


class TrialTask(submitit.helpers.Checkpointable):
    """The submitit job callable for one trial.

    mode ``rank``: this process is one rank of the job (``tasks_per_node`` > 1 locally, or
    srun's tasks on Slurm): export RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from the job
    environment and run `canzona.run.run_rank_from_env`. mode ``spawn``: run `run_trial`,
    which starts the trial's ranks itself, and kill this process's descendants if it fails
    (the task is a process of its own). mode ``inproc``: `run_trial` in the caller's process
    (cluster=debug), no cleanup. Checkpointable: on preemption submitit requeues the
    job and the trial starts over (trials are short and their records are rewritten whole).
    """

    def __init__(self, config: dict[str, Any], out: str, mode: str) -> None:
        self.config = config
        self.out = out
        self.mode = mode

    def __call__(self) -> dict[str, Any]:
        threads = (self.config.get("dist") or {}).get("threads_per_rank")
        if threads:
            os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        from canzona import run as trial_run
        from canzona.config import load_config

        cfg = load_config(base=self.config)
        out = Path(self.out)
        if self.mode == "rank":
            # CUDA_VISIBLE_DEVICES left alone: the runner picks cuda:LOCAL_RANK of the node's GPUs.
            env = submitit.helpers.TorchDistributedEnvironment().export(
                set_cuda_visible_devices=False, overwrite=True
            )
            trial_run.run_rank_from_env(cfg, out)
            return {"rank": env.rank, "world_size": env.world_size}
        if self.mode == "inproc":
            trial_run.run_trial(cfg, out)
            return {"rank": 0, "world_size": cfg.world_size}
        try:
            trial_run.run_trial(cfg, out)
        except BaseException:
            # Interrupt, timeout signal or a failed rank: leave no rank process behind
            # (they are children of run_trial's forkserver, not of submitit's controller).
            kill_descendants(os.getpid())
            raise
        return {"rank": 0, "world_size": cfg.world_size}


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def kill_descendants(pid: int) -> list[int]:
    """SIGKILL every descendant of ``pid`` (Linux /proc); returns their pids."""
    if not os.path.isdir("/proc"):
        return []
    tree = _children()
    found, stack = [], list(tree.get(pid, []))
    while stack:
        p = stack.pop()
        found.append(p)
        stack.extend(tree.get(p, []))
    for p in found:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return found


# --------------------------------------------------------------------------- job handles
def headline(exc: BaseException) -> str:
    """One line from a job's error: the exception line ending its traceback if it carries one
    (submitit's FailedJobError wraps the job's trace and appends log paths), else its first line."""
    text = str(exc)
    traced = "with trace:" in text
    body = text.split("with trace:", 1)[1].split("You can check full logs", 1)[0] if traced else text
    lines = [ln.strip() for ln in body.splitlines() if ln.strip() and set(ln.strip()) - {"-", "="}]
    if not lines:
        return type(exc).__name__
    if traced:
        for ln in reversed(lines):
            if _EXC_LINE.match(ln):
                return ln[:400]
        return lines[-1][:400]
    first = lines[0][:400]
    return first if first.startswith(type(exc).__name__) else f"{type(exc).__name__}: {first}"


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Exited|Failure)\b")


def job_error(job: submitit.Job) -> str | None:
    """None if every task succeeded, else 'rank k: <error>' per failing rank, likely cause first."""
    n = job.num_tasks
    subs = [job.task(k) for k in range(n)] if n > 1 else [job]
    found: dict[str, list[int]] = {}
    for k, sub in enumerate(subs):
        try:
            exc = sub.exception()
        except Exception as e:  # noqa: BLE001 - reading the outcome itself failed
            exc = e
        if exc is not None:
            found.setdefault(headline(exc), []).append(k)
    if not found:
        return None
    items = sorted(found.items(), key=lambda kv: (any(c in kv[0].lower() for c in _COLLATERAL), kv[1][0]))
    parts = []
    for msg, ranks in items:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
        parts.append(f"{who}: {msg}" if n > 1 else msg)
    return "; ".join(parts)[:2000]


@dataclass
class Handle:
    trial: Trial
    job: Any
    trial_dir: Path
    cluster: str
    t0: float = field(default_factory=time.monotonic)
    _error: str | None = None
    _finished: bool = False

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    @property
    def log_dir(self) -> str:
        return str(self.job.paths.folder)

    def done(self) -> bool:
        if self._finished:
            return True
        if self.cluster == "debug":
            exc = self.job.exception()  # runs the trial here; exception() never enters pdb
            self._error = None if exc is None else headline(exc)
            self._finished = True
            return True
        if not self.job.done():
            return False
        self._error = job_error(self.job)
        self._finished = True
        return True

    @property
    def error(self) -> str | None:
        return self._error

    def log_paths(self) -> tuple[list[Path], list[Path]]:
        n = self.job.num_tasks
        subs = [self.job.task(k) for k in range(n)] if n > 1 else [self.job]
        return [s.paths.stdout for s in subs], [s.paths.stderr for s in subs]

    def cancel(self) -> None:
        if self.cluster == "debug":
            return
        try:
            self.job.cancel(check=False)
        except Exception:  # noqa: BLE001 - best effort on interrupt
            pass




def task_config(trial: Trial, trial_dir: Path) -> dict[str, Any]:
    d = trial.cfg.to_dict()
    d["out"] = str(trial_dir)
    return d


class Backend:
    capacity: int = 1 << 30
    cluster = ""

    def __init__(self, plan: Plan, log_root: Path) -> None:
        self.plan = plan
        self.settings: SweepSettings = plan.settings
        self.log_root = log_root

    def submit(self, trials: list[tuple[Trial, Path]]) -> tuple[list[Handle], list[tuple[Trial, str]]]:
        raise NotImplementedError

    def close(self, handles: list[Handle]) -> None:
        pass


class LocalBackend(Backend):
    cluster = "local"

    def __init__(self, plan: Plan, log_root: Path) -> None:
        super().__init__(plan, log_root)
        self.capacity = plan.settings.local.parallel

    def submit(self, trials: list[tuple[Trial, Path]]) -> tuple[list[Handle], list[tuple[Trial, str]]]:
        loc = self.settings.local
        handles, failed = [], []
        for trial, tdir in trials:
            mode = "rank" if loc.mode == "tasks" else "spawn"
            ex = submitit.LocalExecutor(folder=self.log_root / "%j", max_num_timeout=0)
            ex.update_parameters(
                nodes=1,
                tasks_per_node=trial.world_size if mode == "rank" else 1,
                timeout_min=loc.timeout_min,
                signal_delay_s=5,
            )
            saved = os.environ.get("MASTER_PORT")
            os.environ["MASTER_PORT"] = str(free_port())  # the job inherits this environment
            try:
                job = ex.submit(TrialTask(task_config(trial, tdir), str(tdir), mode))
            except Exception as e:  # noqa: BLE001 - record and go on
                failed.append((trial, f"submission failed: {type(e).__name__}: {e}"))
                continue
            finally:
                if saved is None:
                    os.environ.pop("MASTER_PORT", None)
                else:
                    os.environ["MASTER_PORT"] = saved
            handles.append(Handle(trial, job, tdir, self.cluster))
        return handles, failed

    def close(self, handles: list[Handle]) -> None:
        # submitit's local controller also creates the folder pattern itself, literally "%j"
        try:
            (self.log_root / "%j").rmdir()
        except OSError:
            pass


class DebugBackend(Backend):
    cluster = "debug"
    capacity = 1

    def submit(self, trials: list[tuple[Trial, Path]]) -> tuple[list[Handle], list[tuple[Trial, str]]]:
        handles = []
        for trial, tdir in trials:
            ex = submitit.DebugExecutor(folder=self.log_root / "debug")
            job = ex.submit(TrialTask(task_config(trial, tdir), str(tdir), "inproc"))
            handles.append(Handle(trial, job, tdir, self.cluster))
        return handles, []


def parse_extra_sbatch(items: list[str]) -> dict[str, Any]:
    """['--exclusive', '--signal=USR1@90', '--gres gpu:8'] -> submitit additional parameters."""
    out: dict[str, Any] = {}
    for item in items:
        opt = item.strip().lstrip("-")
        if "=" in opt:
            k, v = opt.split("=", 1)
        elif " " in opt:
            k, v = opt.split(None, 1)
        else:
            k, v = opt, True
        out[k.strip()] = v
    return out


def submitit_parameters(settings: SweepSettings, shape: JobShape, name: str) -> dict[str, Any]:
    s = settings.slurm
    p: dict[str, Any] = {
        "name": name,
        "nodes": shape.nodes,
        "tasks_per_node": shape.tasks_per_node,
        "cpus_per_task": shape.cpus_per_task,
        "timeout_min": time_minutes(s.time),
        "slurm_array_parallelism": s.array_parallelism,
    }
    if shape.gpus_per_node:
        p["gpus_per_node"] = shape.gpus_per_node
    for key in ("partition", "account", "qos", "constraint", "mem"):
        if getattr(s, key):
            p[f"slurm_{key}"] = getattr(s, key)
    if s.setup:
        p["slurm_setup"] = list(s.setup)
    if s.extra_sbatch:
        p["slurm_additional_parameters"] = parse_extra_sbatch(list(s.extra_sbatch))
    return p


class SlurmBackend(Backend):
    cluster = "slurm"

    def job_name(self) -> str:
        return self.settings.slurm.job_name or f"canzona-{self.plan.sweep}"

    def _executor(self, shape: JobShape) -> submitit.AutoExecutor:
        kwargs: dict[str, Any] = {"slurm_max_num_timeout": 0}
        if self.settings.slurm.python:
            kwargs["slurm_python"] = self.settings.slurm.python
        ex = submitit.AutoExecutor(folder=self.log_root / "%j", cluster="slurm", **kwargs)
        ex.update_parameters(**submitit_parameters(self.settings, shape, self.job_name()))
        return ex

    def submit(self, trials: list[tuple[Trial, Path]]) -> tuple[list[Handle], list[tuple[Trial, str]]]:
        groups: dict[JobShape, list[tuple[Trial, Path]]] = {}
        for trial, tdir in trials:
            groups.setdefault(slurm_shape(trial.cfg, self.settings.slurm), []).append((trial, tdir))
        handles, failed = [], []
        for shape, members in groups.items():
            try:
                ex = self._executor(shape)
                tasks = [TrialTask(task_config(t, d), str(d), "rank") for t, d in members]
                if self.settings.slurm.array and len(members) > 1:
                    with ex.batch():
                        jobs = [ex.submit(task) for task in tasks]
                else:
                    jobs = [ex.submit(task) for task in tasks]
            except Exception as e:  # noqa: BLE001 - e.g. sbatch refused the job: record, go on
                msg = f"submission failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                failed += [(t, msg) for t, _ in members]
                continue
            handles += [Handle(t, j, d, self.cluster) for (t, d), j in zip(members, jobs)]
        return handles, failed

    def close(self, handles: list[Handle], timeout_s: float = 60.0) -> None:
        """submitit can report a job done before its step has left Slurm: wait for squeue to
        drop our jobs, then scancel what is left, so no job step outlives the sweep."""
        ids = {h.job_id for h in handles}
        if not ids:
            return
        deadline = time.monotonic() + timeout_s
        left = _in_squeue(ids)
        while left and time.monotonic() < deadline:
            time.sleep(1.0)
            left = _in_squeue(ids)
        if left:
            subprocess.run(["scancel", *sorted(left)], capture_output=True, timeout=60)


def _in_squeue(ids: set[str]) -> set[str]:
    try:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if r.returncode != 0:
        return set()
    listed = set(r.stdout.split())
    return {i for i in ids if i in listed}


def make_backend(plan: Plan, log_root: Path) -> Backend:
    return {"local": LocalBackend, "debug": DebugBackend, "slurm": SlurmBackend}[plan.settings.cluster](
        plan, log_root
    )


def run_stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


# --------------------------------------------------------------------------- sbatch files
def render_sbatch(plan: Plan, trial: Trial, trial_dir: Path, sbatch_dir: Path) -> str:
    import jinja2

    s = plan.settings.slurm
    shape = slurm_shape(trial.cfg, s)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    name = f"{s.job_name or 'canzona-' + plan.sweep}-{trial.id}"
    return env.get_template("sbatch.sh.j2").render(
        job_name=name,
        nodes=shape.nodes,
        ntasks_per_node=shape.tasks_per_node,
        cpus_per_task=shape.cpus_per_task,
        time=s.time,
        output=str(sbatch_dir / f"{trial.id}-%j.out"),
        error=str(sbatch_dir / f"{trial.id}-%j.err"),
        partition=s.partition,
        account=s.account,
        qos=s.qos,
        constraint=s.constraint,
        mem=s.mem,
        gpus_per_node=shape.gpus_per_node or None,
        chdir=str(Path.cwd()),
        extra_sbatch=list(s.extra_sbatch),
        setup=list(s.setup),
        python=shlex.quote(s.python or sys.executable),
        overrides=[shlex.quote(o) for o in config_overrides(trial.cfg)],
        out=shlex.quote(str(trial_dir)),
    )


def write_sbatch_files(plan: Plan, trials: list[Trial]) -> Path:
    """results/<sweep>/sbatch/<trial_id>.sh for each trial + submit_all.sh; old *.sh removed."""
    from canzona.records import atomic_write_text

    rd = plan.results_dir.resolve()
    sbatch_dir = rd / "sbatch"
    sbatch_dir.mkdir(parents=True, exist_ok=True)
    for old in sbatch_dir.glob("*.sh"):
        old.unlink()
    for t in trials:
        atomic_write_text(sbatch_dir / f"{t.id}.sh", render_sbatch(plan, t, rd / t.id, sbatch_dir))
    lines = [
        "#!/bin/bash",
        "# Submit every trial of this dry run by hand: bash submit_all.sh",
        "set -e",
        'cd "$(dirname "$0")"',
    ]
    lines += [f"sbatch {t.id}.sh" for t in trials]
    atomic_write_text(sbatch_dir / "submit_all.sh", "\n".join(lines) + "\n")
    return sbatch_dir
