"""End-to-end: the local single-node Slurm cluster (slurm/dev-cluster.sh), submitit on it, and
the sbatch template.

Cluster tests skip only when `sinfo` is missing and CI is not "true"; in CI they bring the
cluster up themselves (installing Slurm if needed) and fail rather than skip (`slurm_util`).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_util import needs_slurm

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "slurm" / "templates"


def _load_job_module():
    """Import tests/e2e/slurm_job.py and make cloudpickle ship it by value, so the Slurm task
    needs no sys.path setup to unpickle the function."""
    import cloudpickle

    name = "canzona_e2e_slurm_job"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("slurm_job.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        cloudpickle.register_pickle_by_value(mod)
    return sys.modules[name]


def _render(**values) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template("sbatch.sh.j2").render(**values)


FULL_VALUES = dict(
    job_name="canzona-trial-0001",
    nodes=2,
    ntasks_per_node=4,
    gpus_per_node=4,
    cpus_per_task=8,
    partition="gpu",
    account="proj123",
    qos="normal",
    time="02:00:00",
    constraint="h100",
    mem="200G",
    output="/scratch/runs/%j.out",
    error="/scratch/runs/%j.err",
    extra_sbatch=["--exclusive", "--signal=USR1@90"],
    setup=["module load cuda/12.4", "source /opt/venv/bin/activate"],
    overrides=["method=canzona", "model=qwen3-1.7b", "dp=8"],
    out="/scratch/runs/trial-0001",
)


def test_sbatch_template_renders(tmp_path):
    text = _render(**FULL_VALUES)
    script = tmp_path / "job.sh"
    script.write_text(text)
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH")]
    # all #SBATCH lines come before the first command, as sbatch requires
    first_cmd = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(lines.index(ln) < first_cmd for ln in sbatch)
    for expected in [
        "--job-name=canzona-trial-0001",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--cpus-per-task=8",
        "--partition=gpu",
        "--account=proj123",
        "--qos=normal",
        "--time=02:00:00",
        "--constraint=h100",
        "--mem=200G",
        "--output=/scratch/runs/%j.out",
        "--error=/scratch/runs/%j.err",
        "--exclusive",
        "--signal=USR1@90",
    ]:
        assert f"#SBATCH {expected}" in sbatch, expected
    assert len(sbatch) == 15
    assert "module load cuda/12.4" in lines
    assert any(ln.startswith("export MASTER_ADDR=") and "scontrol show hostnames" in ln for ln in lines)
    assert any(ln.startswith("export MASTER_PORT=") for ln in lines)
    assert lines[-1] == (
        "srun python -m canzona.run method=canzona model=qwen3-1.7b dp=8 out=/scratch/runs/trial-0001"
    )

    # optional values left out: no line for them, still valid bash
    minimal = {
        k: FULL_VALUES[k]
        for k in (
            "job_name",
            "nodes",
            "ntasks_per_node",
            "cpus_per_task",
            "time",
            "output",
            "error",
            "overrides",
            "out",
        )
    }
    text = _render(**minimal, gpus_per_node=None, account="")
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert not any(k in text for k in ("--gpus-per-node", "--account", "--qos", "--partition", "--mem"))


@pytest.mark.slurm
@pytest.mark.slow
@needs_slurm
def test_submitit_two_task_allreduce(slurm_cluster, tmp_path):
    import submitit

    job_mod = _load_job_module()
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(nodes=1, tasks_per_node=2, cpus_per_task=1, timeout_min=5, slurm_partition="debug")
    job = ex.submit(job_mod.allreduce_rank_plus_one)

    deadline = time.monotonic() + 240
    while not job.done() and time.monotonic() < deadline:
        time.sleep(1)
    if not job.done():
        subprocess.run(["scancel", str(job.job_id)])
        pytest.fail(f"job {job.job_id} not done in 240s\nstdout:\n{job.stdout()}\nstderr:\n{job.stderr()}")

    results = sorted(job.results())
    assert results == [(0, 2, 3.0), (1, 2, 3.0)], f"{results}\nstderr:\n{job.stderr()}"


@pytest.mark.slurm
@pytest.mark.slow
@needs_slurm
def test_sbatch_template_accepted_by_slurm(slurm_cluster, tmp_path):
    """`sbatch --test-only` parses the rendered directives against the dev cluster."""
    text = _render(
        job_name="canzona-dryrun",
        nodes=1,
        ntasks_per_node=2,
        cpus_per_task=1,
        time="00:05:00",
        partition="debug",
        output=str(tmp_path / "%j.out"),
        error=str(tmp_path / "%j.err"),
        extra_sbatch=["--signal=USR1@30"],
        setup=["true"],
        overrides="method=canzona",
        out=str(tmp_path),
    )
    script = tmp_path / "job.sh"
    script.write_text(text)
    r = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "to start at" in r.stdout + r.stderr
