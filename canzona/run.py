"""One trial: ``python -m canzona.run key=value ... out=DIR``.

Started plainly it launches its own ranks (one process per rank, dp×tp of them, over gloo on
CPU or NCCL on GPUs) and waits for them; under ``torchrun`` or Slurm (``RANK``/``WORLD_SIZE``
or ``SLURM_PROCID``/``SLURM_NTASKS`` in the environment) this process is one rank of that
launch, and rank 0 alone checks and prepares ``out`` and hands its verdict to the others
(`canzona.trial.verdict`), which go on or report the same one line. Each rank builds the Qwen3
shard, the plan's distributed optimizer, and runs ``train.warmup`` + ``train.steps`` steps,
timing each phase; rank 0 writes the records of `canzona.records` into ``out``. The work is
done by `canzona.trial`; this module is the command line (and keeps the names the sweep
launcher and the benchmarks call).

With ``dist.dry_run=true`` nothing trains: the ranks ``dist.dry_run_ranks`` of the job run here
on fake CUDA tensors (`canzona.trial.dryrun`), ``out`` gets ``dryrun.json`` and ``dryrun.txt``
(memory per rank and category, collectives), and the exit status is 1 with one ``error:`` line
per failing rank (nothing written) if a rank breaks a rule or would run out of memory.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from canzona.cli import refuse, run_command, say
from canzona.config import parse_cli
from canzona.errors import ConfigError
from canzona.launch_env import launched_externally
from canzona.records import RECORD_FILES, SUMMARY_FILE, writable_folder

__all__ = ["main"]
_LAUNCH = ("run_rank_from_env", "run_trial")


def __getattr__(name: str) -> Any:
    """`canzona.trial.launch`'s entry points, imported on first use: the command line checks its
    arguments without loading torch."""
    if name in _LAUNCH:
        from canzona.trial import launch

        return getattr(launch, name)
    raise AttributeError(f"module 'canzona.run' has no attribute {name!r}")

def main(argv: list[str] | None = None) -> int:
    return run_command("canzona.run", _run, argv)


def _run(argv: list[str]) -> int:
    cfg, args = parse_cli(argv, flags=("--overwrite",))
    if not cfg.out:
        raise ConfigError("out=DIR is required: where the trial writes its records")
    from canzona.cost import NumelCost
    from canzona.plan.from_config import plan_inputs

    # the layout check only, no plan: the trial plans once, where its costs are chosen (the
    # local launcher, or rank 0 of an external launch, which hands the plan to every rank)
    if not cfg.method.peer:  # a peer plans inside its own code
        plan_inputs(cfg, NumelCost())
    out = Path(cfg.out)
    prepare = partial(prepare_out, cfg.out, overwrite="--overwrite" in args.flags)
    if launched_externally():  # rank 0 prepares `out`; every rank goes on or reports its error
        from canzona.launch_env import launch_env
        from canzona.trial.verdict import rank_zero_verdict

        rank_zero_verdict(prepare, launch_env(), cfg.dist.timeout_s)
    else:
        prepare()
    if cfg.dist.dry_run:
        return dry_run_main(cfg, out)
    from canzona.trial.launch import run_rank_from_env, run_trial

    signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's or kill's SIGTERM: stop as on Ctrl-C
    started = time.time()
    try:
        summary = run_rank_from_env(cfg, out) if launched_externally() else run_trial(cfg, out)
    except KeyboardInterrupt:
        summary_file = out / SUMMARY_FILE
        stale = summary_file.is_file() and summary_file.stat().st_mtime < started
        print("interrupted: the trial's ranks were stopped; this run wrote no records"
              + (f" ({summary_file} is an earlier run's)" if stale else ""), file=sys.stderr)
        return 130
    except ConfigError:
        raise  # a misuse a rank found: `run_command`'s one line, exit 2
    except Exception as e:  # noqa: BLE001 - report any rank failure as one trial failure
        say(failure_text(e))
        return 1
    if summary is not None:
        print(
            f"{cfg.method.label} {cfg.optimizer.name} dp={cfg.parallel.dp} tp={cfg.parallel.tp}"
            f"{f' ep={cfg.parallel.ep}' if cfg.parallel.ep > 1 else ''}: "
            f"iteration {summary['iteration_ms_median']:.1f} ms, optimizer step {summary['optimizer_step_ms_median']:.1f} ms "
            f"(median of {cfg.train.steps}; {_batch_text(cfg)}); records in {out}"
        )
    return 0


def prepare_out(path: str, overwrite: bool) -> None:
    """Check that ``out`` is a folder this process can write (`writable_folder`) that holds no
    earlier run's records, or, with ``overwrite``, remove those records (gone before this run
    starts, so a run that fails leaves none that look complete); else a one-line `ConfigError`.
    Under an external launch only rank 0 runs this (`canzona.trial.verdict`)."""
    out = writable_folder(path, "out")
    earlier = [name for name in RECORD_FILES if (out / name).exists()]
    if earlier and not overwrite:
        raise ConfigError(f"out={path} holds an earlier run's records ({', '.join(earlier)}); give a new "
                          f"out=DIR, or --overwrite to replace them")
    for name in earlier:
        (out / name).unlink(missing_ok=True)


def failure_text(error: BaseException) -> str:
    """A failed trial, told once: a rank's failure as that rank's own traceback (the launcher's
    frames, which only say that it waited, left out), anything else with its traceback."""
    from torch.multiprocessing import ProcessRaisedException

    if isinstance(error, ProcessRaisedException):
        rank_traceback = str(error).split("terminated with the following error:", 1)[-1].strip()
        return f"trial failed: rank {error.error_index} raised\n{rank_traceback}"
    lines = traceback.format_exception(error)
    return f"trial failed: {type(error).__name__}: {error}\n" + "".join(lines[:-1]).rstrip()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def dry_run_main(cfg, out: Path) -> int:
    """``dist.dry_run=true``: the report on stdout and in ``out``, or the errors (exit 1)."""
    from canzona.trial.dryrun import dry_run_trial
    from canzona.trial.dryrun.fakecuda import FakeCudaError
    from canzona.trial.dryrun.report import format_table

    try:
        report = dry_run_trial(cfg, out=out)
    except (ConfigError, FakeCudaError) as e:
        return refuse(e)
    if report["errors"]:
        for e in report["errors"]:
            say(f"error: dry run: {e}")
        return 1
    print(format_table(report), end="")
    print(f"dry run report in {out} ({report['seconds']:.0f} s)")
    return 0


def _batch_text(cfg: Any) -> str:
    """What each rank ran per step, so that a by-hand run is compared at the sweep's batch (the
    trial default is 2 sequences a micro-batch; the README's local sweep runs 1)."""
    t = cfg.train
    accum = f" x {t.grad_accum} micro-batches" if t.grad_accum > 1 else ""
    return f"micro-batch {t.micro_batch} x {t.seq_len} tokens{accum} per rank"


if __name__ == "__main__":
    sys.exit(main())
