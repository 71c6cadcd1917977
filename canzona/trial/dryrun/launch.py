"""Running a dry run: one process per rank (forked from a preloaded zygote), the programs' cross-rank check, the report."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from canzona import CHECKOUT, pythonpath_with_checkout
from canzona.config import TrialConfig, dry_run_ranks, load_config
from canzona.trial.dryrun import fakecuda
from canzona.trial.dryrun.report import build_report, write_report
from canzona.trial.dryrun.worker import SETUP_ENV

MAX_WORKERS = 16
PLAN_FILE = "plan.pkl"  # the trial's plan, made once here, read by every rank's worker


def dry_run_trial(cfg: TrialConfig, ranks: list[int] | str | None = None, out: str | os.PathLike | None = None,
                  *, workers: int | None = None, slots: threading.Semaphore | None = None) -> dict[str, Any]:
    """Dry-run ``ranks`` (default ``dist.dry_run_ranks``) of ``cfg``'s job; the report dict
    (`canzona.trial.dryrun.report.build_report`). With ``out``, ``dryrun.json`` and
    ``dryrun.txt`` are written there -- only when ``report["errors"]`` is empty. ``workers``
    ranks run at once (default: one per core, at most `MAX_WORKERS`; a worker takes about
    0.5 GB). ``slots``: a semaphore every rank holds while it runs, shared by dry runs made at
    once from several threads (a sweep's), so that together they run no more ranks than it
    allows. ConfigError for what a dry run refuses (ranks the job does not have, ...), as
    with ``dist.dry_run=true`` on the command line."""
    from canzona.config import check_runnable

    check_runnable(cfg)
    t0 = time.perf_counter()
    chosen = dry_run_ranks(cfg.dist.dry_run_ranks if ranks is None else ranks, cfg.world_size)
    config = cfg.to_dict()
    config["dist"].update(dry_run=True, dry_run_ranks=",".join(map(str, chosen)))
    cfg = load_config(base=config)
    library = fakecuda.ensure_built()
    n = max(1, min(len(chosen), workers or min(os.cpu_count() or 1, MAX_WORKERS)))
    from canzona.plan.from_config import make_plan

    plan = make_plan(cfg, device="cuda")  # planned once: the ranks run this plan, the check lowers it
    with tempfile.TemporaryDirectory(prefix="canzona-dryrun-") as tmp:
        (Path(tmp) / PLAN_FILE).write_bytes(pickle.dumps(plan))
        with ThreadPoolExecutor(n) as pool:
            running = [pool.submit(_run_worker, Path(tmp), library, config, r, slots) for r in chosen]
            matching = _program_matching(plan)  # here, while the ranks run
            done = [f.result() for f in running]
    results = [d["result"] for d in done if d["ok"]]
    errors = [d["error"] for d in done if not d["ok"]]
    report = build_report(cfg, results, errors, matching, time.perf_counter() - t0)
    if out is not None and not report["errors"]:
        write_report(Path(out), report)
    return report


class _Zygote:
    """The running `canzona.trial.dryrun.zygote` for one fake-CUDA library: started on first use,
    reused by every later dry run of this process (a sweep's hundreds of ranks import torch once),
    restarted if it died, ended with this process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._library: Path | None = None
        self._lock = threading.Lock()

    def run(self, library: Path | None, spec: Path, result: Path, stderr: Path) -> int:
        """Run one rank in a fresh child of the zygote; its exit status."""
        with self._lock:
            proc = self._started(library)
            proc.stdin.write(f"{spec} {result} {stderr}\n")
            proc.stdin.flush()
        rc = Path(f"{result}.rc")
        while not rc.exists():
            if proc.poll() is not None:
                return proc.returncode or 1
            time.sleep(0.02)
        return int(rc.read_text())

    def _started(self, library: Path | None) -> subprocess.Popen:
        if self._proc is not None and (self._proc.poll() is not None or self._library != library):
            self.close()
        if self._proc is None:
            # the zygote imports this checkout's canzona, whatever the caller's folder or installed copy
            env = {**os.environ, "PYTHONPATH": pythonpath_with_checkout(os.environ.get("PYTHONPATH"))}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "canzona.trial.dryrun.zygote", str(library or "")],
                stdin=subprocess.PIPE, text=True, env=env, cwd=CHECKOUT,
            )
            self._library = library
        return self._proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


_ZYGOTE = _Zygote()
atexit.register(_ZYGOTE.close)


def _run_worker(tmp: Path, library: Path | None, config: dict[str, Any], rank: int,
                slots: threading.Semaphore | None = None) -> dict[str, Any]:
    spec, result, stderr = tmp / f"rank{rank}.json", tmp / f"rank{rank}.out.json", tmp / f"rank{rank}.err"
    spec.write_text(json.dumps({"library": str(library) if library else None, "config": config, "rank": rank,
                                "plan": str(tmp / PLAN_FILE), "setup": os.environ.get(SETUP_ENV)}))
    with slots if slots is not None else contextlib.nullcontext():
        code = _ZYGOTE.run(library, spec, result, stderr)
    if result.exists():
        return json.loads(result.read_text())
    lines = stderr.read_text(errors="replace").strip().splitlines() if stderr.exists() else []
    return {"ok": False, "error": f"rank {rank}: the worker process exited with {code}: {(lines or ['no output'])[-1]}"}


def _program_matching(plan: Any) -> list[str]:
    """Do the programs of *all* ranks make matching collective calls (`check_matching`)? With
    the executed ranks' calls equal to their programs', this covers the ranks not executed."""
    from canzona.program.check import check_matching
    from canzona.program.lower import lower

    return check_matching(lower(plan))
