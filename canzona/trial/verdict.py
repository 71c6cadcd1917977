"""Rank 0's verdict on a check every rank of an external launch needs, handed to the others.

Under ``torchrun`` or Slurm every rank runs the same command line, and so every rank would run
its checks that touch the filesystem: checking (making, probing) ``out`` from several processes
at once raced on the folders they made. `rank_zero_verdict` runs such a check on rank 0 alone
and hands its outcome, "ok" or the check's one-line `ConfigError`, to every rank; each then goes
on or reports that same line.

The verdict travels through the launch's rendezvous store: the `torch.distributed.TCPStore` at
``MASTER_ADDR:MASTER_PORT`` that the process group's ``env://`` rendezvous uses right after. No
process group exists yet, and no file has to be seen by every rank (``out`` may be a folder on
rank 0's node only, or one rank 0 cannot make). Under ``torchrun`` the agent hosts that store and
every rank is its client (``TORCHELASTIC_USE_AGENT_STORE=True``); otherwise (a plain ``srun``,
submitit, the sbatch template) rank 0 hosts it and keeps it open, and the process group's
rendezvous shares it (torch opens rank 0's store with ``multi_tenant=True`` too). The others
wait for the verdict up to ``timeout_s`` (``dist.timeout_s``, the time they would wait for rank 0
at the rendezvous anyway). A failing rank 0 (any exception of the check, told as one line)
waits, up to ``timeout_s``, until every rank has read its verdict before it raises, so that no
rank is left waiting on a store that closed.

Only `rank_zero_verdict` imports torch, and only for a launch of more than one rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from canzona.errors import ConfigError
from canzona.launch_env import LaunchEnv

KEY = "canzona/verdict"  # rank 0's verdict: {"error": null | "the one line"}
READ = "canzona/verdict_read/"  # + rank: set by each other rank once it has read the verdict

_open_stores: list[Any] = []  # rank 0's store, kept open for the process group's rendezvous


def rank_zero_verdict(check: Callable[[], None], launch: LaunchEnv, timeout_s: float) -> None:
    """Run ``check`` on rank 0 only; on every rank of ``launch``, return if it passed and raise
    its `ConfigError` (the same message) if it failed. One rank: ``check()`` itself."""
    if launch.world == 1:
        check()
        return
    store = _store(launch, timeout_s)
    if launch.rank == 0:
        try:
            check()
        except Exception as e:
            error = str(e) if isinstance(e, ConfigError) else f"rank 0's check failed: {type(e).__name__}: {e}"
            store.set(KEY, json.dumps({"error": error}))
            _wait(store, [f"{READ}{r}" for r in range(1, launch.world)], timeout_s)  # then fail anyway
            raise
        store.set(KEY, json.dumps({"error": None}))
        _open_stores.append(store)
        return
    waited = _wait(store, [KEY], timeout_s)
    if waited is not None:
        raise ConfigError(f"no verdict from rank 0 on the command line's checks within {timeout_s:.0f} s "
                          f"(dist.timeout_s): under an external launch rank 0 alone checks `out`; see its "
                          f"output ({waited})")
    verdict = json.loads(store.get(KEY))
    store.set(f"{READ}{launch.rank}", "1")
    if verdict["error"] is not None:
        raise ConfigError(verdict["error"])


def _store(launch: LaunchEnv, timeout_s: float) -> Any:
    """The launch's rendezvous store (see the module docstring), its keys under this attempt's
    prefix (torchrun's agent keeps its store across restarts of the workers)."""
    from torch.distributed import PrefixStore, TCPStore

    if launch.master_port is None:
        raise ConfigError("MASTER_PORT is not set for a multi-process run (and no SLURM_JOB_ID to derive it)")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store = TCPStore(launch.master_addr, launch.master_port, is_master=launch.rank == 0 and not agent,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True)
    except (RuntimeError, OSError) as e:  # DistNetworkError / DistStoreError are RuntimeErrors
        raise ConfigError(f"rank {launch.rank}: cannot reach the launch's rendezvous store at "
                          f"{launch.master_addr}:{launch.master_port} ({_first_line(e)})") from None
    return PrefixStore(f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _wait(store: Any, keys: list[str], timeout_s: float) -> str | None:
    """Wait until ``keys`` are set: None, or why not (timed out, or the store went away)."""
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError as e:  # DistStoreError
        return _first_line(e)
    return None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
