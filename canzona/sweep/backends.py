"""Launching runs: one backend per cluster, and the submitit job callable.

Every run (one repetition of a trial, `canzona.sweep.trials.TrialRun`) is one job; a backend
(`canzona.sweep.backend.Backend`) submits runs and returns a `canzona.sweep.handles.RunHandle`
per job, which the run loop (`canzona.sweep.loop`) polls. `make_backend` also gives the
backends of ``cluster=simulate`` (`canzona.sweep.project`) and ``cluster=dryrun``
(`canzona.sweep.dryrun`).

- ``cluster=local``  ``local.mode=worker`` (default): `canzona.sweep.worker` -- long-lived
  worker processes, each running `canzona.trial.launch.run_trial` for one run after another, so
  that torch, megatron-core and the ranks' forkserver start once per sweep, not once per run
  (seconds a run; most of a local sweep with repeats). The other modes are
  `submitit.LocalExecutor`, one job per run. ``local.mode=spawn``:
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
  A job Slurm ends (scancel, time limit, node failure, OOM) is recorded with Slurm's state.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any

import submitit

from canzona.hardware import Hardware
from canzona.net import free_port
from canzona.sweep.backend import Backend, Submitted
from canzona.sweep.dryrun import DryRunBackend
from canzona.sweep.handles import JobHandle, RunHandle, traceback_line
from canzona.sweep.jobshape import JobShape, slurm_shape
from canzona.sweep.procs import kill_descendants
from canzona.sweep.project import SimulateBackend
from canzona.sweep.sbatch import checkout_pythonpath_line
from canzona.sweep.settings import SweepSettings, time_minutes
from canzona.sweep.slurm_state import SlurmStates
from canzona.sweep.trials import ExpandedSweep, TrialRun
from canzona.sweep.worker import Worker


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
        from canzona.config import load_config
        from canzona.trial import launch as trial_run

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


def task_config(run: TrialRun, run_dir: Path) -> dict[str, Any]:
    d = run.cfg.to_dict()
    d["out"] = str(run_dir)
    return d


class LocalBackend(Backend):
    cluster = "local"

    def __init__(self, sweep: ExpandedSweep, log_root: Path) -> None:
        super().__init__(sweep, log_root)
        self.capacity = sweep.settings.local.parallel

    def describe(self) -> str:
        return f", {self.capacity} at a time" if self.capacity > 1 else ""

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        loc = self.settings.local
        handles, failed = [], []
        for run, rdir in runs:
            mode = "rank" if loc.mode == "tasks" else "spawn"
            ex = submitit.LocalExecutor(folder=self.log_root / "%j", max_num_timeout=0)
            ex.update_parameters(
                nodes=1,
                tasks_per_node=run.world_size if mode == "rank" else 1,
                timeout_min=loc.timeout_min,
                signal_delay_s=5,
            )
            saved = os.environ.get("MASTER_PORT")
            os.environ["MASTER_PORT"] = str(free_port())  # the job inherits this environment
            try:
                job = ex.submit(TrialTask(task_config(run, rdir), str(rdir), mode))
            except Exception as e:  # noqa: BLE001 - record and go on
                failed.append((run, f"submission failed: {type(e).__name__}: {e}"))
                continue
            finally:
                if saved is None:
                    os.environ.pop("MASTER_PORT", None)
                else:
                    os.environ["MASTER_PORT"] = saved
            handles.append(JobHandle(run, job, rdir, self.cluster))
        return handles, failed

    def close(self, handles: list[JobHandle]) -> None:
        # submitit's local controller also creates the folder pattern itself, literally "%j"
        try:
            (self.log_root / "%j").rmdir()
        except OSError:
            pass


@dataclass
class WorkerRunHandle:
    """A run handed to a `Worker` (``local.mode=worker``); the worker is the backend's again
    once the run succeeds, and is killed -- with its forkserver and any rank left -- otherwise."""

    run: TrialRun
    run_dir: Path
    backend: WorkerBackend
    worker: Worker
    job_id: str
    stdout: Path
    stderr: Path
    timeout_s: float
    cluster: str = "local"
    t0: float = field(default_factory=time.monotonic)
    error: str | None = None
    _finished: bool = False

    @property
    def log_dir(self) -> str:
        return str(self.stdout.parent)

    def done(self) -> bool:
        if self._finished:
            return True
        finished, text = self.worker.result()
        if not finished and time.monotonic() - self.t0 > self.timeout_s:
            finished, text = True, f"TimeoutError: the run took more than local.timeout_min={self.timeout_s / 60:g}"
        if finished:
            self.error = None if text is None else traceback_line(text)
            self.backend.release(self.worker, reuse=text is None)
            self._finished = True
        return self._finished

    def log_paths(self) -> tuple[list[Path], list[Path]]:
        return [self.stdout], [self.stderr]

    def cancel(self) -> None:
        if not self._finished:
            self._finished = True
            self.backend.release(self.worker, reuse=False)


class WorkerBackend(LocalBackend):
    """``local.mode=worker``: up to ``local.parallel`` long-lived `Worker` processes, each
    running one run at a time (see `canzona.sweep.worker` for why)."""

    def __init__(self, sweep: ExpandedSweep, log_root: Path) -> None:
        super().__init__(sweep, log_root)
        self._idle: list[Worker] = []
        self._all: list[Worker] = []

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        logs = self.log_root / "worker"
        logs.mkdir(parents=True, exist_ok=True)
        handles: list[RunHandle] = []
        failed = []
        for run, rdir in runs:
            out, err = logs / f"{run.id}.out", logs / f"{run.id}.err"
            try:
                worker = self._idle.pop() if self._idle else self._new()
                job_id = worker.start(task_config(run, rdir), rdir, out, err)
            except Exception as e:  # noqa: BLE001 - record and go on
                failed.append((run, f"submission failed: {type(e).__name__}: {e}"))
                continue
            timeout_s = self.settings.local.timeout_min * 60
            handles.append(WorkerRunHandle(run, rdir, self, worker, job_id, out, err, timeout_s))
        return handles, failed

    def wait(self, running: list[RunHandle], timeout_s: float) -> None:
        """Until a worker reports its run or exits, or the first run's timeout falls due; at most
        `timeout_s` (the next run starts as soon as one ends, not at the next poll)."""
        workers = [h for h in running if isinstance(h, WorkerRunHandle) and not h._finished]
        if not workers:
            time.sleep(timeout_s)
            return
        now = time.monotonic()
        due = min(h.t0 + h.timeout_s - now for h in workers)
        wait_ready([x for h in workers for x in h.worker.waitables()], timeout=max(0.0, min(timeout_s, due)))

    def _new(self) -> Worker:
        w = Worker()
        self._all.append(w)
        return w

    def release(self, worker: Worker, reuse: bool) -> None:
        if reuse and worker.alive():
            self._idle.append(worker)
        else:
            worker.kill()

    def close(self, handles: list[RunHandle]) -> None:
        for h in handles:
            h.cancel()
        for w in self._all:
            if w in self._idle:
                w.close()
            elif w.alive():
                w.kill()


class DebugBackend(Backend):
    cluster = "debug"
    capacity = 1

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        handles = []
        for run, rdir in runs:
            ex = submitit.DebugExecutor(folder=self.log_root / "debug")
            job = ex.submit(TrialTask(task_config(run, rdir), str(rdir), "inproc"))
            handles.append(JobHandle(run, job, rdir, self.cluster))
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
    p["slurm_setup"] = [*s.setup, checkout_pythonpath_line()]
    if s.extra_sbatch:
        p["slurm_additional_parameters"] = parse_extra_sbatch(list(s.extra_sbatch))
    return p


class SlurmBackend(Backend):
    cluster = "slurm"

    def __init__(self, sweep: ExpandedSweep, log_root: Path) -> None:
        super().__init__(sweep, log_root)
        # Slurm's view of our jobs, for those that end without a result (scancel, time limit)
        self.states = SlurmStates(interval_s=max(5.0, sweep.settings.poll_s))

    def job_name(self) -> str:
        return self.settings.slurm.job_name or f"canzona-{self.sweep.sweep}"

    def _executor(self, shape: JobShape) -> submitit.AutoExecutor:
        kwargs: dict[str, Any] = {"slurm_max_num_timeout": 0}
        if self.settings.slurm.python:
            kwargs["slurm_python"] = self.settings.slurm.python
        ex = submitit.AutoExecutor(folder=self.log_root / "%j", cluster="slurm", **kwargs)
        ex.update_parameters(**submitit_parameters(self.settings, shape, self.job_name()))
        return ex

    def submit(self, runs: list[tuple[TrialRun, Path]]) -> Submitted:
        groups: dict[JobShape, list[tuple[TrialRun, Path]]] = {}
        for run, rdir in runs:
            groups.setdefault(slurm_shape(run.cfg, self.settings.slurm), []).append((run, rdir))
        handles, failed = [], []
        for shape, members in groups.items():
            try:
                ex = self._executor(shape)
                # one task per rank; a peer's one task starts its ranks itself
                tasks = [TrialTask(task_config(t, d), str(d), "spawn" if t.cfg.method.peer else "rank")
                         for t, d in members]
                if self.settings.slurm.array and len(members) > 1:
                    with ex.batch():
                        jobs = [ex.submit(task) for task in tasks]
                else:
                    jobs = [ex.submit(task) for task in tasks]
            except Exception as e:  # noqa: BLE001 - e.g. sbatch refused the job: record, go on
                msg = f"submission failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                failed += [(t, msg) for t, _ in members]
                continue
            handles += [JobHandle(r, j, d, self.cluster, self.states) for (r, d), j in zip(members, jobs)]
        return handles, failed

    def close(self, handles: list[JobHandle], timeout_s: float = 60.0) -> None:
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


def backend_class(settings: SweepSettings) -> type[Backend]:
    """The backend of ``cluster`` (and ``local.mode``)."""
    if settings.cluster == "local" and settings.local.mode == "worker":
        return WorkerBackend
    return {"local": LocalBackend, "debug": DebugBackend, "slurm": SlurmBackend, "simulate": SimulateBackend,
            "dryrun": DryRunBackend}[settings.cluster]


def make_backend(sweep: ExpandedSweep, log_root: Path, sim_hardware: Hardware | None = None) -> Backend:
    """The sweep's backend; `sim_hardware`: the hardware a ``cluster=simulate`` sweep projects with."""
    cls = backend_class(sweep.settings)
    if cls is SimulateBackend:
        if sim_hardware is None:
            raise ValueError("cluster=simulate needs the hardware to project with")
        return SimulateBackend(sweep, log_root, sim_hardware)
    return cls(sweep, log_root)


def run_stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
