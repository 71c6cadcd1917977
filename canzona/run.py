"""One trial: ``python -m canzona.run key=value ... out=DIR``.

Started plainly it launches its own ranks (one process per rank, dp×tp of them, over gloo on
CPU or NCCL on GPUs) and waits for them; under ``torchrun`` or Slurm (``RANK``/``WORLD_SIZE``
or ``SLURM_PROCID``/``SLURM_NTASKS`` in the environment) this process is one rank of that
launch. Each rank builds the Qwen3 shard, the plan's distributed optimizer, and runs
``train.warmup`` + ``train.steps`` steps, timing each phase; rank 0 writes the records of
`canzona.records` into ``out``. The work is done by `canzona.trial`; this module is the command
line (and keeps the names the sweep launcher and the benchmarks call).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from canzona.config import parse_cli
from canzona.errors import ConfigError
from canzona.trial.launch import launched_externally, run_rank_from_env, run_trial

__all__ = ["launched_externally", "main", "run_rank_from_env", "run_trial"]

USAGE = "usage: python -m canzona.run [key=value ...] out=DIR   (see README: configuration)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    try:
        cfg, _ = parse_cli(argv)
        if not cfg.out:
            raise ConfigError("out=DIR is required: where the trial writes its records")
        from canzona.plan.methods import make_plan

        make_plan(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(cfg.out)
    try:
        summary = run_rank_from_env(cfg, out) if launched_externally() else run_trial(cfg, out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - report any rank failure as one trial failure
        print(f"trial failed: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        return 1
    if summary is not None:
        print(
            f"{cfg.method} {cfg.optimizer.name} dp={cfg.parallel.dp} tp={cfg.parallel.tp}: "
            f"iteration {summary['iteration_ms_median']:.1f} ms, optimizer step {summary['optimizer_step_ms_median']:.1f} ms "
            f"(median of {cfg.train.steps}); records in {out}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
