"""The launch environment of a rank (`canzona.launch_env`), derived without GPUs or a cluster:
torchrun's variables, a plain multi-node ``srun`` (only Slurm's own variables), and the local
CUDA device under the ways Slurm binds GPUs."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from canzona.errors import ConfigError
from canzona.launch_env import (
    LaunchEnv,
    expand_nodelist,
    launch_env,
    launched_externally,
    local_device_index,
    slurm_hostnames,
    tasks_per_node,
)

NODELISTS = {
    "gpu[01-04,07],cpu-a1": ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1"],
    "n[8-10]": ["n8", "n9", "n10"],
    "n[099-101]": ["n099", "n100", "n101"],
    "a,b,c": ["a", "b", "c"],
    "single": ["single"],
    "n[7]": ["n7"],
    "n[0-1],m[2-3]": ["n0", "n1", "m2", "m3"],
}


@pytest.mark.parametrize("text", list(NODELISTS))
def test_expand_nodelist(text: str) -> None:
    assert expand_nodelist(text) == NODELISTS[text]


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed")
@pytest.mark.parametrize("text", list(NODELISTS))
def test_expand_nodelist_agrees_with_scontrol(text: str, tmp_path, monkeypatch) -> None:
    # `show hostnames` parses locally, but scontrol wants a configuration first: a minimal one, so
    # this runs whether or not a cluster is up (slurm_hostnames' scontrol call sees it too).
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\nSlurmctldHost=localhost\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    real = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=10)
    assert real.returncode == 0, real.stderr
    assert expand_nodelist(text) == real.stdout.split() == slurm_hostnames(text)


def test_expand_nodelist_extensions_and_errors() -> None:
    assert expand_nodelist("r[1-2]n[1-2]-ib") == ["r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"]
    for bad in ("gpu[01-", "gpu[a-b]", "gpu[4-2]", "gpu]1["):
        with pytest.raises(ConfigError, match="Slurm node list"):
            expand_nodelist(bad)


def test_tasks_per_node() -> None:
    assert tasks_per_node("4(x2),3") == [4, 4, 3]
    assert tasks_per_node("8") == [8]
    with pytest.raises(ConfigError, match="tasks per node"):
        tasks_per_node("4x2")


def test_torchrun_variables() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    assert launched_externally(env)
    got = launch_env(env, hostnames=_no_lookup)
    assert got == LaunchEnv(rank=5, world=8, local_rank=1, local_world=4, master_addr="node0", master_port=29500)
    assert got.exports() == {**env}


def test_plain_multi_node_srun() -> None:
    """srun with 2 nodes x 4 tasks: no torch variables at all."""
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_JOB_ID": "123456", "SLURM_TASKS_PER_NODE": "4(x2)"}
    assert launched_externally(env)
    got = launch_env(env)
    assert got == LaunchEnv(rank=6, world=8, local_rank=2, local_world=4, master_addr="gpu03",
                            master_port=20000 + 123456 % 20000)


def test_srun_uneven_tasks_and_sbatch_exports_win() -> None:
    env = {"SLURM_PROCID": "8", "SLURM_NTASKS": "9", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
           "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "4(x2),1",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "31000"}
    got = launch_env(env, hostnames=_no_lookup)
    assert (got.local_world, got.master_addr, got.master_port) == (1, "10.0.0.1", 31000)


def test_unset_local_world_and_ntasks_per_node_forms() -> None:
    """LOCAL_WORLD_SIZE unset: SLURM_NTASKS_PER_NODE read as text (a count or Slurm's "4(x2)")."""
    base = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert launch_env({**base, "SLURM_NTASKS_PER_NODE": "4"}).local_world == 4
    assert launch_env({**base, "SLURM_NTASKS_PER_NODE": "4(x2)"}).local_world == 4
    got = launch_env(base)  # nothing says: one node holds the whole world
    assert (got.local_world, got.local_rank) == (8, 3)


def test_single_process_defaults_and_bad_values() -> None:
    assert not launched_externally({})
    assert launch_env({}) == LaunchEnv(0, 1, 0, 1, "127.0.0.1", None)
    with pytest.raises(ConfigError, match="RANK='x'"):
        launch_env({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="outside a world of 2"):
        launch_env({"RANK": "2", "WORLD_SIZE": "2"})


def test_local_device_index_under_slurm_gpu_bindings() -> None:
    assert local_device_index(3, 8) == 3  # every GPU of the node visible (torchrun, --gpus-per-node)
    assert local_device_index(3, 1) == 0  # --gpus-per-task=1: the task's own GPU is device 0
    assert local_device_index(0, 1) == 0
    with pytest.raises(ConfigError, match="LOCAL_RANK=5 but this process sees 2 CUDA devices"):
        local_device_index(5, 2)
    with pytest.raises(ConfigError, match="no CUDA device"):
        local_device_index(0, 0)


def _no_lookup(nodelist: str) -> list[str]:
    raise AssertionError(f"MASTER_ADDR was set; the node list {nodelist!r} must not be expanded")
