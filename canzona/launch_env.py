"""Where this process sits in a launch, read from the launcher's environment.

A trial's ranks are started by one of four launchers, each of which describes the launch in
its own variables:

- the local launcher (`canzona.trial.launch.run_trial`) and ``torchrun`` set ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``;
- submitit's ``TorchDistributedEnvironment`` (sweeps with ``slurm.mode=tasks``) exports the same;
- the sbatch script of ``slurm/templates`` exports ``MASTER_ADDR`` / ``MASTER_PORT`` /
  ``WORLD_SIZE`` and leaves the rest to Slurm;
- a plain ``srun python -m canzona.run ...`` sets only Slurm's own variables: ``SLURM_PROCID``,
  ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_JOB_NODELIST`` (a compressed
  host list such as ``gpu[01-04,07],cpu-a1``), ``SLURM_JOB_ID`` and the tasks per node
  (``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE``, the latter like ``4(x2),3``).

`launch_env` reads whichever is there, the torch names first, into one `LaunchEnv`. Nothing
here touches torch or CUDA, so the derivation is unit-tested on any machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from canzona.errors import ConfigError

# The port both the sbatch template and `launch_env` derive from the job id, so that every task
# of a job agrees on it without talking (and two jobs sharing a node rarely collide).
PORT_BASE = 20000
PORT_SPAN = 20000
LOCAL_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class LaunchEnv:
    """One process's place in a launch (``master_port`` None: single process, pick a free port)."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int | None

    def exports(self) -> dict[str, str]:
        """The torch.distributed variables (``env://`` rendezvous) for this launch."""
        out = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(self.local_rank),
               "LOCAL_WORLD_SIZE": str(self.local_world), "MASTER_ADDR": self.master_addr}
        if self.master_port is not None:
            out["MASTER_PORT"] = str(self.master_port)
        return out


def launched_externally(env: Mapping[str, str] | None = None) -> bool:
    """True when a launcher (torchrun, Slurm, submitit) started this process as one rank."""
    env = os.environ if env is None else env
    return ("RANK" in env and "WORLD_SIZE" in env) or ("SLURM_PROCID" in env and "SLURM_NTASKS" in env)


def launch_env(env: Mapping[str, str] | None = None,
               hostnames: Callable[[str], list[str]] | None = None) -> LaunchEnv:
    """This process's `LaunchEnv` from ``env`` (default: ``os.environ``); a single process
    (rank 0 of 1 on this host) when no launcher variables are set.

    ``hostnames`` expands a Slurm node list (default `slurm_hostnames`); it is called only when
    ``MASTER_ADDR`` is unset under Slurm.
    """
    env = os.environ if env is None else env
    rank = _int(env, "RANK", "SLURM_PROCID", default=0)
    world = _int(env, "WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", default=1)
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is outside a world of {world} processes (RANK / SLURM_PROCID)")
    local_world = _local_world(env, world)
    local_rank = _int(env, "LOCAL_RANK", "SLURM_LOCALID", default=rank % local_world)
    addr = env.get("MASTER_ADDR")
    if not addr:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = (hostnames or slurm_hostnames)(nodelist)[0] if nodelist else LOCAL_ADDR
    port: int | None
    if env.get("MASTER_PORT"):
        port = _int(env, "MASTER_PORT", default=0)
    elif env.get("SLURM_JOB_ID"):
        port = PORT_BASE + _int(env, "SLURM_JOB_ID", default=0) % PORT_SPAN
    else:
        port = None
    return LaunchEnv(rank, world, local_rank, local_world, addr, port)


def _int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        text = env.get(name)
        if text is None or text == "":
            continue
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not an integer") from None
    return default


def _local_world(env: Mapping[str, str], world: int) -> int:
    """Processes on this node: LOCAL_WORLD_SIZE, else Slurm's tasks on this node, else all."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        text = env.get(name)
        if not text:
            continue
        counts = tasks_per_node(text)
        node = _int(env, "SLURM_NODEID", default=0)
        # this node's count ("4(x2),3" on node 2: 3); a single count ("8") is every node's
        return max(1, counts[node] if node < len(counts) else counts[0])
    return world


_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node string, one entry per node: ``"4(x2),3"`` -> ``[4, 4, 3]``."""
    out: list[int] = []
    for part in str(text).split(","):
        m = _COUNT.match(part.strip())
        if not m:
            raise ConfigError(f"cannot read tasks per node {text!r}; expected e.g. 8 or 4(x2),3")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list: ``scontrol show hostnames`` when it is installed (Slurm's own
    parser, which also knows site-specific syntax), else `expand_nodelist`."""
    if shutil.which("scontrol"):
        try:
            proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                  text=True, timeout=10)
            hosts = proc.stdout.split()
            if proc.returncode == 0 and hosts:
                return hosts
        except (OSError, subprocess.SubprocessError):
            pass
    return expand_nodelist(nodelist)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list in Python: ``gpu[01-04,07],cpu-a1`` -> gpu01 .. gpu04, gpu07,
    cpu-a1. Ranges keep the zero padding of their lower bound; several bracket groups in one
    name expand as their product (``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2)."""
    hosts: list[str] = []
    for item in _split_top(nodelist):
        hosts += _expand_one(item, nodelist)
    if not hosts:
        raise ConfigError(f"empty Slurm node list {nodelist!r}")
    return hosts


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text.strip():
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ConfigError(f"unbalanced brackets in Slurm node list {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ConfigError(f"unbalanced brackets in Slurm node list {text!r}")
    return [p for p in (*parts, cur) if p]


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end():]
    out: list[str] = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ConfigError(f"bad range {rng!r} in Slurm node list {whole!r}")
        for k in range(int(lo), int(hi or lo) + 1):
            out += _expand_one(f"{head}{k:0{len(lo)}d}{tail}", whole)
    return out


def local_device_index(local_rank: int, device_count: int) -> int:
    """The CUDA device this rank uses, among the ``device_count`` devices it can see.

    ``LOCAL_RANK`` counts the tasks on a node, but what a task sees depends on how GPUs were
    bound: with all of a node's GPUs visible (torchrun, ``srun --gpus-per-node``) task k uses
    device k; under ``srun --gpus-per-task=1`` (or any per-task ``CUDA_VISIBLE_DEVICES``) each
    task sees exactly its own GPU as device 0, and ``set_device(LOCAL_RANK)`` would ask task 3
    for a fourth device it cannot see. So: ``local_rank`` when it is visible, else 0 when
    exactly one device is visible; anything else is a binding this rank cannot resolve.
    """
    if device_count < 1:
        raise ConfigError("dist.device=cuda but no CUDA device is visible to this process")
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    raise ConfigError(
        f"LOCAL_RANK={local_rank} but this process sees {device_count} CUDA devices; give each task "
        "one GPU (srun --gpus-per-task=1) or all of the node's (--gpus-per-node) with one task per GPU"
    )
