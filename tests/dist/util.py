"""Run a function on N local gloo ranks (torch.multiprocessing, forkserver start method).

``run_ranks(fn, world, *args, timeout_s=60)`` starts ``world`` processes, each with the caller's
environment as of the call and the usual launcher variables (``MASTER_ADDR``, ``MASTER_PORT`` of a free port, ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``) and one torch thread, calls ``fn(rank, world, *args)`` and returns the results
in rank order. ``fn`` must be a module-level function; it initialises its own process group
(e.g. ``canzona.model.init_parallel``) and its result must be torch.save-able. With
``CANZONA_NCCL_RULES=1`` in the environment (``conftest.py`` sets it for every test here) each
child installs `canzona.dist_rules` before calling ``fn``: a collective NCCL would refuse raises
`canzona.dist_rules.NcclRuleError` in the child, re-raised here as `ChildError`.
``global_rel`` is the training-parity tests' distance between two parameter dicts. A child's
exception is re-raised here with the child's traceback; a run that exceeds ``timeout_s`` is
killed (its stacks are dumped to stderr shortly before) and raises ``TimeoutError``. The ranks
fork from one forkserver per test session that has imported torch, megatron-core and the
harness (`PRELOAD`), rather than each importing them again: a module a test changes on disk
during a session is not seen by ranks whose server imported it before.
"""

from __future__ import annotations

import faulthandler
import io
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from canzona import dist_rules
from canzona.net import free_port


class ChildError(RuntimeError):
    """A rank raised; the message carries its traceback."""


# Imported once by the forkserver every rank forks from, instead of by each spawned rank (torch,
# megatron-core and the harness take seconds of CPU per process; a slow pass starts hundreds).
PRELOAD = ["torch", "torch.distributed", "megatron.core.parallel_state", "megatron.core.tensor_parallel",
           "canzona.model.qwen3", "canzona.executor.runtime", "canzona.plan.from_config", "canzona.program.lower"]


def _context():
    import torch

    if torch.cuda.is_available():
        # a preloaded module (megatron-core's) initialises CUDA in the fork server, and CUDA cannot
        # be initialised again in a process forked from it: the GPU tests' ranks start fresh
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _child(rank: int, world: int, port: int, fn: Callable, args: tuple, q, timeout_s: float,
           env: dict[str, str]) -> None:
    # the forkserver keeps the environment it started with: the caller's, as of this call, instead
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist_rules.install_from_env()
    faulthandler.dump_traceback_later(max(1.0, timeout_s - 3), exit=False)
    try:
        result = fn(rank, world, *args)
        buf = io.BytesIO()
        torch.save(result, buf)
        q.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit
        q.put((rank, False, f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        faulthandler.cancel_dump_traceback_later()
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def global_rel(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """||got - want|| / ||want|| over the whole parameter vector (L2)."""
    num = sum(((got[n] - w).double() ** 2).sum() for n, w in want.items()) ** 0.5
    den = sum((w.double() ** 2).sum() for w in want.values()) ** 0.5
    return float(num / den)


def run_ranks(fn: Callable, world: int, *args: Any, timeout_s: float = 60.0) -> list[Any]:
    ctx = _context()
    q = ctx.Queue()
    port = free_port()
    env = dict(os.environ)
    procs = [
        ctx.Process(target=_child, args=(r, world, port, fn, args, q, timeout_s, env), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{world}-rank run of {fn.__name__} exceeded {timeout_s:.0f}s; "
                    f"ranks done: {sorted(results)}"
                )
            try:
                rank, ok, payload = q.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                if dead:
                    raise ChildError(
                        f"rank(s) {dead} of {fn.__name__} died with exit codes "
                        f"{[procs[r].exitcode for r in dead]} and no report"
                    ) from None
                continue
            if not ok:
                raise ChildError(payload)
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) == world else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        q.close()
    return [results[r] for r in range(world)]
