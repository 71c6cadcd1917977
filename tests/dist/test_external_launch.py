"""An external launch (torchrun, Slurm) checks ``out`` once: rank 0 prepares it and hands its
verdict to every rank (`canzona.trial.verdict`) before any process group exists (issue 29: every
rank checking a new ``out`` at once raced on the folders they made)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.errors import ConfigError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "parallel.dp=2", "train.steps=1"]


def _verdict_then_group(rank: int, world: int, folder: str, fail: bool) -> str:
    """`rank_zero_verdict` on ranks that the ``run_ranks`` fixture starts with the torch variables
    only (as submitit or a plain srun): rank 0 hosts the store, and the process group's
    rendezvous on the same port comes after it."""
    import torch
    import torch.distributed as dist

    from canzona.launch_env import launch_env
    from canzona.trial.verdict import rank_zero_verdict

    def check() -> None:
        (Path(folder) / f"checked-by-rank-{rank}").touch()
        if fail:
            raise ConfigError("out=somewhere: cannot write there (Permission denied)")

    try:
        rank_zero_verdict(check, launch_env(), timeout_s=60)
    except ConfigError as e:
        return f"error: {e}"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(1)
    dist.all_reduce(t)
    return f"ok {int(t.item())}"


@pytest.mark.parametrize("fail", [False, True])
def test_only_rank_0_checks_and_every_rank_gets_its_verdict(run_ranks, tmp_path: Path, fail: bool) -> None:
    results = run_ranks(_verdict_then_group, 2, str(tmp_path), fail)
    want = "error: out=somewhere: cannot write there (Permission denied)" if fail else "ok 2"
    assert results == [want, want]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checked-by-rank-0"]


def _torchrun(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "-m", "canzona.run", *args], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=timeout)


def test_torchrun_into_a_new_out_folder(tmp_path: Path) -> None:
    """A torchrun launch of a one-step trial into a nested path that does not exist yet runs
    (before, one launch in about 10 to 40 had a rank refuse ``out`` with "File exists" or "No such
    file or directory"; a few launches cannot catch that, so one shows the path works end to end
    and the race itself is caught every time by
    tests/unit/test_cli_paths.py::test_writable_folder_from_several_processes_at_once)."""
    for i in range(1):
        out = tmp_path / f"launch{i}" / "NEW" / "PATH"
        r = _torchrun(*TINY, f"out={out}")
        assert r.returncode == 0 and "error:" not in r.stderr, r.stderr[-3000:]
        assert (out / "summary.json").is_file()
        # the summary line names the batch each rank ran (the trial default: 2 sequences)
        assert "(median of 1; micro-batch 2 x " in r.stdout and " tokens per rank); records in " in r.stdout, r.stdout


def test_torchrun_every_rank_reports_rank_0s_verdict(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "a-file" / "out"
    r = _torchrun(*TINY, f"out={out}")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode != 0
    assert errors == [f"error: out={out}: cannot write there (Not a directory); give a folder this user can write"] * 2
