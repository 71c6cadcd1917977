"""Sweeps: expand a grid of trials from ``sweeps/configs/*.yaml``, launch them with submitit
(local, debug or Slurm), keep resumable records under ``results/<sweep>/<trial_id>/``.

- `expand`      sweep files, sweep settings, CLI overrides -> validated `Trial` list (pure).
- `bookkeeping` trial folders: status.json, stdout/stderr tails, what a rerun must run.
- `launch`      the submitit job callable and the local / debug / slurm backends, sbatch files.
- `progress`    live progress line and the end-of-sweep summary table.
- `cli`         ``python sweeps/run.py sweep=NAME [key=value ...]``.
"""

from canzona.sweep.expand import Plan, SweepSettings, Trial, build_plan, trial_id

__all__ = ["Plan", "SweepSettings", "Trial", "build_plan", "trial_id"]
