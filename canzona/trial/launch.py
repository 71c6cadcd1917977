"""Starting a trial's ranks: locally (one process per rank), or as one rank of an external launch.

Failure: an exception on any rank ends the trial; locally the other ranks are killed at once and
the rank's exception is raised here; under an external launcher the other ranks fail at their
next collective (gloo reports the closed connection at once) or, at the latest, at the
collective timeout (``dist.timeout_s``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from canzona import pythonpath_with_checkout
from canzona.config import TrialConfig, load_config
from canzona.errors import ConfigError
from canzona.launch_env import LOCAL_ADDR, LaunchEnv, launch_env, launched_externally
from canzona.net import free_port
from canzona.records import SUMMARY_FILE
from canzona.trial import lifeline
from canzona.trial.rank import run_rank

__all__ = ["launched_externally", "run_rank_from_env", "run_trial"]


def run_trial(cfg: TrialConfig, out: Path) -> dict[str, Any]:
    """Launch dp×tp local ranks for one trial and return its summary (raises on failure). A peer
    (`canzona.peers`) starts its own ranks."""
    if cfg.method.peer:
        from canzona.peers.trial import run_peer_trial

        return run_peer_trial(cfg, out)
    import torch.multiprocessing as mp

    from canzona import dist_rules
    from canzona.config import check_runnable
    from canzona.plan.from_config import make_plan

    check_runnable(cfg)
    plan = make_plan(cfg)  # invalid layouts fail here, before any process starts
    out.mkdir(parents=True, exist_ok=True)
    world = cfg.world_size
    # CPU: forkserver -- the server imports torch and megatron-core once (seconds), every rank of
    # this and later trials in the same process forks from it instead of importing them again.
    # The server keeps the environment it started with, so what a rank needs travels as
    # arguments. CUDA: spawn, because a process that has touched CUDA (here: importing
    # megatron-core on a GPU machine, or timing the cost calibration) cannot fork children that
    # use it ("Cannot re-initialize CUDA in forked subprocess", seen on an H200).
    start_method = "spawn" if plan.execution.device == "cuda" else "forkserver"
    mp.set_forkserver_preload(["canzona.executor.runtime", "canzona.model.qwen3"])
    _forkserver_imports_this_checkout()
    rules = os.environ.get(dist_rules.ENV, "")
    ctx = mp.start_processes(  # the plan travels to the ranks as it is: the trial plans once
        _spawned_rank, args=(cfg.to_dict(), plan, str(out), free_port(), world, rules, lifeline.identity()),
        nprocs=world, join=False, start_method=start_method,
    )
    try:
        while not ctx.join():  # raises ProcessRaisedException / ProcessExitedException, killing the rest
            pass
    except KeyboardInterrupt:  # SIGINT, or SIGTERM where the command line maps it (canzona.run)
        stop_ranks(ctx.processes)
        raise
    return json.loads((out / SUMMARY_FILE).read_text())


def stop_ranks(processes: list[Any], grace_s: float = 5.0) -> None:
    """SIGTERM every rank still running, then SIGKILL what is left after ``grace_s``."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()


def _forkserver_imports_this_checkout() -> None:
    """Put this checkout first on ``PYTHONPATH`` for the forkserver. Python 3.11's forkserver
    ignores the parent's ``sys.path``: started from another folder (a sweep's ``cwd``) it would
    import whichever ``canzona`` is installed -- another checkout's code for the ranks -- or none."""
    os.environ["PYTHONPATH"] = pythonpath_with_checkout(os.environ.get("PYTHONPATH"))


def _spawned_rank(local_rank: int, cfg_dict: dict[str, Any], plan: Any, out: str, port: int, world: int,
                  rules: str, launcher: tuple[int, str | None]) -> None:
    from canzona import dist_rules

    lifeline.watch(launcher)  # forked from the forkserver: nothing else ends this rank with its launcher
    launch = LaunchEnv(local_rank, world, local_rank, world, LOCAL_ADDR, port)
    os.environ.update({**launch.exports(), dist_rules.ENV: rules})
    cfg = load_config(base=cfg_dict)
    run_rank(cfg, Path(out), local_world=world, plan=plan)


def run_rank_from_env(cfg: TrialConfig, out: Path) -> dict[str, Any] | None:
    """Run as one rank of an external launch (torchrun, Slurm's srun, submitit tasks); returns
    the summary on rank 0, None elsewhere."""
    if cfg.method.peer:
        from canzona.peers.trial import refuse_external_launch

        refuse_external_launch(cfg)
    launch = launch_env()
    if launch.world != cfg.world_size:
        raise ConfigError(f"the launch has {launch.world} ranks but parallel.dp*parallel.tp = {cfg.world_size}")
    os.environ.update(launch.exports())
    return run_rank(cfg, out, local_world=launch.local_world)
