"""sbatch scripts for ``cluster=slurm list=true``: one per run, to read before submitting
anything, or to submit by hand (``bash submit_all.sh``) where submitit cannot be used. Each runs
``srun python -m canzona.run <the trial's overrides> out=<its folder>``; a later sweep adopts
the records such a run leaves."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import jinja2

from canzona import CHECKOUT
from canzona.records import atomic_write_text
from canzona.sweep.jobshape import slurm_shape
from canzona.sweep.keys import config_overrides
from canzona.sweep.trials import ExpandedSweep, TrialRun

TEMPLATE_DIR = CHECKOUT / "slurm" / "templates"


def checkout_pythonpath_line() -> str:
    """The job's last setup line: import this checkout's ``canzona`` (the code that planned the
    sweep), whatever ``slurm.setup`` activated; the checkout must be on a filesystem the nodes share."""
    return f'export PYTHONPATH={shlex.quote(str(CHECKOUT))}"${{PYTHONPATH:+:$PYTHONPATH}}"'


def render_sbatch(sweep: ExpandedSweep, run: TrialRun, run_dir: Path, sbatch_dir: Path) -> str:
    s = sweep.settings.slurm
    shape = slurm_shape(run.cfg, s)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    name = f"{s.job_name or 'canzona-' + sweep.sweep}-{run.id}"
    return env.get_template("sbatch.sh.j2").render(
        job_name=name,
        nodes=shape.nodes,
        ntasks_per_node=shape.tasks_per_node,
        cpus_per_task=shape.cpus_per_task,
        time=s.time,
        output=str(sbatch_dir / f"{run.id}-%j.out"),
        error=str(sbatch_dir / f"{run.id}-%j.err"),
        partition=s.partition,
        account=s.account,
        qos=s.qos,
        constraint=s.constraint,
        mem=s.mem,
        gpus_per_node=shape.gpus_per_node or None,
        chdir=str(Path.cwd()),
        extra_sbatch=list(s.extra_sbatch),
        setup=[*s.setup, checkout_pythonpath_line()],
        python=shlex.quote(s.python or sys.executable),
        overrides=[shlex.quote(o) for o in config_overrides(run.cfg)],
        out=shlex.quote(str(run_dir)),
        peer=bool(run.cfg.method.peer),
    )


def write_sbatch_files(sweep: ExpandedSweep, runs: list[TrialRun]) -> Path:
    """results/<sweep>/sbatch/<run id>.sh for each run + submit_all.sh; old *.sh removed."""
    rd = sweep.results_dir.resolve()
    sbatch_dir = rd / "sbatch"
    sbatch_dir.mkdir(parents=True, exist_ok=True)
    for old in sbatch_dir.glob("*.sh"):
        old.unlink()
    for r in runs:
        atomic_write_text(sbatch_dir / f"{r.id}.sh", render_sbatch(sweep, r, rd / r.id, sbatch_dir))
    lines = [
        "#!/bin/bash",
        "# Submit every trial of this dry run by hand: bash submit_all.sh",
        "set -e",
        'cd "$(dirname "$0")"',
    ]
    lines += [f"sbatch {r.id}.sh" for r in runs]
    atomic_write_text(sbatch_dir / "submit_all.sh", "\n".join(lines) + "\n")
    return sbatch_dir
