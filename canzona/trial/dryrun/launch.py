"""Running a dry run: one worker process per rank, the programs' cross-rank check, the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from canzona.config import TrialConfig, dry_run_ranks, load_config
from canzona.trial.dryrun import fakecuda
from canzona.trial.dryrun.report import build_report, write_report

_REPO = Path(__file__).resolve().parents[3]
MAX_WORKERS = 16


def dry_run_trial(cfg: TrialConfig, ranks: list[int] | str | None = None, out: str | os.PathLike | None = None,
                  *, workers: int | None = None) -> dict[str, Any]:
    """Dry-run ``ranks`` (default ``dist.dry_run_ranks``) of ``cfg``'s job; the report dict
    (`canzona.trial.dryrun.report.build_report`). With ``out``, ``dryrun.json`` and
    ``dryrun.txt`` are written there -- only when ``report["errors"]`` is empty. ``workers``
    ranks run at once (default: one per core, at most `MAX_WORKERS`; a worker takes about
    0.5 GB). ConfigError for what a dry run refuses (ranks the job does not have, ...), as
    with ``dist.dry_run=true`` on the command line."""
    t0 = time.perf_counter()
    chosen = dry_run_ranks(cfg.dist.dry_run_ranks if ranks is None else ranks, cfg.world_size)
    config = cfg.to_dict()
    config["dist"].update(dry_run=True, dry_run_ranks=",".join(map(str, chosen)))
    cfg = load_config(base=config)
    library = fakecuda.ensure_built()
    n = max(1, min(len(chosen), workers or min(os.cpu_count() or 1, MAX_WORKERS)))
    with tempfile.TemporaryDirectory(prefix="canzona-dryrun-") as tmp:
        with ThreadPoolExecutor(n) as pool:
            done = list(pool.map(lambda r: _run_worker(Path(tmp), library, config, r), chosen))
    results = [d["result"] for d in done if d["ok"]]
    errors = [d["error"] for d in done if not d["ok"]]
    report = build_report(cfg, results, errors, _program_matching(cfg), time.perf_counter() - t0)
    if out is not None and not report["errors"]:
        write_report(Path(out), report)
    return report


def _run_worker(tmp: Path, library: Path | None, config: dict[str, Any], rank: int) -> dict[str, Any]:
    spec, result = tmp / f"rank{rank}.json", tmp / f"rank{rank}.out.json"
    spec.write_text(json.dumps({"library": str(library) if library else None, "config": config, "rank": rank}))
    # the worker imports this checkout's canzona, whatever the caller's folder or installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(_REPO), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-m", "canzona.trial.dryrun.worker", str(spec), str(result)],
                          capture_output=True, text=True, env=env, cwd=_REPO)
    if result.exists():
        return json.loads(result.read_text())
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"ok": False, "error": f"rank {rank}: the worker process exited with {done.returncode}: {tail}"}


def _program_matching(cfg: TrialConfig) -> list[str]:
    """Do the programs of *all* ranks make matching collective calls (`check_matching`)? With
    the executed ranks' calls equal to their programs', this covers the ranks not executed."""
    from canzona.plan.methods import make_plan
    from canzona.program.check import check_matching
    from canzona.program.lower import lower

    return check_matching(lower(make_plan(cfg, device="cuda")))
