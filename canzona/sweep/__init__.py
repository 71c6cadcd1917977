"""Sweeps: expand a grid of trials from ``sweeps/configs/*.yaml``, run each trial ``repeats``
times with submitit (local, debug or Slurm) or project it (simulate), keep resumable records
under ``results/<sweep>/<run>/``.

- `settings`     the sweep settings schema (cluster, rerun, repeats, slurm.*, local.*, sim.*).
- `keys`         trial keys and values as sweep files and command lines write them.
- `sweepfile`    the sweep-file YAML grammar.
- `arguments`    the command line: settings, axis selections, trial values.
- `expand`       sweep file + command line -> a validated `ExpandedSweep` (pure).
- `ids`          trial ids and run folder names.
- `trials`       `ExpandedSweep`, `SweepTrial`, `TrialRun` and the interleaved run order.
- `jobshape`     Slurm job shapes and the layout checks.
- `lock`         one sweep at a time per results folder.
- `bookkeeping`  run folders: status.json, stdout/stderr tails, what a rerun must run.
- `backend`      what the run loop needs of a cluster (`Backend`).
- `loop`         the one run loop: status.json per run, progress, failures, Ctrl-C, the closing line.
- `backends`     the submitit job callable, the local / debug / slurm backends, `make_backend`.
- `handles`      a submitted run: done or not, its error in one line.
- `slurm_state`  Slurm's end state of a job (CANCELLED, TIMEOUT, ...) for the error.
- `sbatch`       sbatch scripts of a Slurm dry run.
- `project`      ``cluster=simulate``: projections instead of runs (`SimulateBackend`).
- `dryrun`       ``cluster=dryrun``: dry runs instead of runs (`DryRunBackend`), the memory table.
- `progress`     live progress line and the end-of-sweep summary table.
- `cli`          ``python sweeps/run.py sweep=NAME [key=value ...]``.
"""
