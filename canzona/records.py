"""On-disk records of a trial: the contract between the trial runner, sweeps and analysis.

A trial folder (``results/<sweep>/<trial_id>/`` in a sweep, ``out=DIR`` for one trial) holds:

- ``config.yaml``  the resolved TrialConfig (every value, defaults included).
- ``steps.jsonl``  one JSON object per rank per step (warm-up steps included, ``measured``
  false), with the keys of `STEP_FIELDS` (milliseconds unless named otherwise) and ``events``:
  a list of ``{"name", "cat", "phase", "start_ms", "dur_ms"}`` relative to the iteration's start,
  the per-rank timeline of the iteration (cat is one of compute, comm, wait, model; phase the
  executor's phase the block was timed as, one of `PHASES` or another step phase). A CPU
  rank's row also has ``step_thread_cpu_ms`` / ``step_other_threads_cpu_ms`` and the same for
  ``iteration_``: the CPU its main thread and its other threads (gloo's) spent in the span
  (`canzona.executor.timing.StepTimer.cpu_between`).
- ``summary.json`` the trial's aggregates (medians and p10/p90 over measured steps of the max over
  ranks, the plan, the world, versions, host and the resolved config; on a CPU the step's use
  of the cores, `canzona.trial.summary.cpu_use`).
- ``status.json``  written by the sweep launcher: ``status`` (done | failed | running), ``error``,
  ``job_id``, ``started``, ``ended``, ``cluster``, ``host``, ``wall_s``, ``trial_id``, ``repeat``,
  ``repeats`` (field by field: `canzona.sweep.bookkeeping`).
- ``stdout.txt`` / ``stderr.txt`` tails written by the sweep launcher.
- ``trace.json``   a Chrome-trace (Perfetto) file of the measured steps, one process per rank
  (`canzona.trial.trace`).

The file names are the ``*_FILE`` constants below; `write_records` writes a trial's records
(the trial runner's and the simulator's). Every file is written atomically (temp file + rename)
so a crash never leaves half a record.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

# Per rank per step. *_ms are wall-clock milliseconds on that rank.
STEP_FIELDS = (
    "step",  # 0-based, warm-up steps included
    "measured",  # False for warm-up steps
    "rank",
    "dp_rank",
    "tp_rank",
    "iteration_ms",  # forward + backward + exposed grad reduction + optimizer step + exposed param sync
    "forward_ms",
    "backward_ms",  # includes reduction work issued from hooks that overlapped backward
    "grad_reduce_ms",  # exposed (not hidden behind backward) gradient reduction
    "barrier_ms",  # the wait at the barrier before the step's timer starts (`dist.step_barrier`): the
    #                ranks' skew on arriving, outside the step as in Megatron's timers
    "clip_grad_ms",  # gradient-norm clipping inside the optimizer step: local norm, its all-reduce, scaling
    "optimizer_step_ms",  # docs/design.md §6: grads reduced -> every owned param updated
    "step_start_ms",  # where this rank's optimizer step begins on the clock of its `events` (ms from
    #                   its iteration start): the step is [step_start_ms, + optimizer_step_ms]
    "gather_ms",  # packing and issuing TP gathers to owners (baselines: the whole TP all-gather)
    "compute_ms",  # owner optimizer maths
    "scatter_ms",  # packing and issuing TP scatters back to shard holders
    "apply_ms",  # applying updates to local shards
    "param_sync_ms",  # exposed DP parameter all-gather: the wait after the step, or (overlapped) the
    #                   waits in the next forward's pre-hooks
    "wait_ms",  # blocked on in-flight TP gathers/scatters of the micro-group pipeline
    "param_gather_ms",  # the parameter all-gathers' own time, issue to completion (null where the backend
    #                     reports no completion), whether or not it was hidden behind the forward
    "param_sync_peer_ms",  # of param_sync_ms, the wait before the last DP peer issued the gather (that
    #                        peer still in its optimizer step: step imbalance, not communication);
    #                        projections only (null when measured: ranks' clocks are not compared)
    "compute_load",  # planned optimizer compute load of this rank (cost-model units)
    "loss",
)

# The phases every rank's step is split into (`*_ms` columns of steps.jsonl, in timeline order).
PHASES = ("forward", "backward", "grad_reduce", "barrier", "clip_grad", "gather", "compute", "scatter", "apply", "param_sync",
          "wait")

# Phase name -> timeline event category (the colour a Gantt chart gives it); shared by the
# executor's timers and the simulator's timelines.
CATEGORY = {
    "forward": "model",
    "backward": "model",
    "grad_reduce": "comm",
    "barrier": "wait",
    "clip_grad": "compute",
    "gather": "comm",
    "compute": "compute",
    "scatter": "comm",
    "apply": "compute",
    "param_sync": "comm",
    "wait": "wait",
}

# The files of a trial folder (see the module docstring); every reader and writer names them here.
CONFIG_FILE = "config.yaml"
STEPS_FILE = "steps.jsonl"
TRACE_FILE = "trace.json"
SUMMARY_FILE = "summary.json"
STATUS_FILE = "status.json"  # the sweep launcher's (`canzona.sweep.bookkeeping`)
DRYRUN_JSON, DRYRUN_TEXT = "dryrun.json", "dryrun.txt"  # a dry run's report (`canzona.trial.dryrun.report`)
STDOUT_FILE, STDERR_FILE = "stdout.txt", "stderr.txt"  # a run's log tails, kept by the sweep launcher

# The files of a sweep's results folder (`canzona.sweep`).
SWEEP_FILE = "sweep.json"  # the sweep's manifest
HARDWARE_FILE = "hardware.yaml"  # a projected sweep's hardware description (provenance)
OLD_HARDWARE_FILE = "profile.yaml"  # its name before "profile" meant only a sweep variant
DRYRUN_CSV = "dryrun.csv"  # a dry-run sweep's memory table

# What a trial writes into its ``out`` folder (a trial's records, and a dry run's report).
RECORD_FILES = (CONFIG_FILE, STEPS_FILE, TRACE_FILE, SUMMARY_FILE, DRYRUN_JSON, DRYRUN_TEXT)


# summary.json keys renamed since records were first written: old dotted key -> new one (its
# ``config`` is a trial config, read by `canzona.config.read_config`).
SUMMARY_RENAMED = {"profile": "hardware", "profile_inputs": "hardware_inputs", "versions.profile": "versions.hardware"}


def read_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary.json's content, whenever it was written, under today's key names: every reader
    goes through this, so results folders written before a rename read as new ones; writers
    write only the new names."""
    from canzona.overrides import move_keys

    return move_keys(summary, SUMMARY_RENAMED)


def writable_folder(path: str | os.PathLike, key: str) -> Path:
    """Check that ``path`` is, or can be made, a folder this process can write into; else a
    one-line `ConfigError` naming ``key`` (an existing file, a path under something that is not
    a folder, no permission, a read-only or virtual filesystem). Leaves nothing behind: a probe
    file is written and removed, and so are the folders made for it (the run makes its own).

    Safe to call from several processes on the same path at once: a folder another caller made
    in the meantime is taken as found, one that another caller removed before this one's probe
    went in is made again (`_PROBE_TRIES` times), and only folders this call made are removed,
    once empty (a concurrent caller's probe in one is given a moment to go; a folder that stays
    full is left)."""
    from canzona.errors import ConfigError

    p = Path(path)
    if _is_other_than_folder(p):
        raise ConfigError(f"{key}={path}: exists and is not a folder; give a folder (or a new path)")
    made: list[Path] = []
    try:
        for attempt in range(_PROBE_TRIES):
            try:
                _make_folders(p, made)
                with tempfile.NamedTemporaryFile(dir=p, prefix=".write-probe-"):
                    break
            except FileNotFoundError:  # a concurrent caller removed a folder it had made: again
                if attempt == _PROBE_TRIES - 1:
                    raise
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot write there ({e.strerror or e}); give a folder this user can write") from None
    finally:
        for d in sorted(set(made), key=lambda d: len(d.parts), reverse=True):  # deepest first
            _remove_empty(d)
    return p


_PROBE_TRIES = 5


def _remove_empty(folder: Path, tries: int = 20, pause_s: float = 0.005) -> None:
    """Remove ``folder`` if empty; while a concurrent caller's probe is in it, try again a few
    times (its probe lives a moment), then leave it (it holds something else, or that caller
    is slow)."""
    for _ in range(tries):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                return
        time.sleep(pause_s)


def _make_folders(path: Path, made: list[Path]) -> None:
    """Make ``path`` and its missing parents (``mkdir -p``: a folder made meanwhile by another
    process is taken as found), adding to ``made`` each folder this call made."""
    missing = []
    anc = path
    while not anc.exists():
        missing.append(anc)
        anc = anc.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if _is_other_than_folder(d):
                raise
            continue  # made by another process (and maybe removed since: the next step retries)
        made.append(d)


def _is_other_than_folder(path: Path) -> bool:
    """True when ``path`` is there and is not a folder (one stat, so a folder that another
    process removes meanwhile reads as missing, never as a file)."""
    try:
        return not stat.S_ISDIR(path.stat().st_mode)
    except OSError:  # missing, or under something that is not a folder: the mkdir tells which
        return False


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename (never half a file)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_records(out: str | os.PathLike[str], config: dict[str, Any], rows: list[dict[str, Any]],
                  summary: dict[str, Any], trace: dict[str, Any] | None = None) -> None:
    """A trial's records in ``out``: config.yaml (``config``, the resolved config as a dict),
    steps.jsonl (``rows``), trace.json (``trace``, when given) and summary.json last, so that its
    presence means the trial finished (measured by the trial runner or projected by the simulator)."""
    import yaml

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))
    atomic_write_text(out / STEPS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    if trace is not None:
        atomic_write_json(out / TRACE_FILE, trace)
    atomic_write_json(out / SUMMARY_FILE, summary)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
