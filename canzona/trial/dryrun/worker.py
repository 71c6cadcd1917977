"""A dry-run rank's process: ``python -m canzona.trial.dryrun.worker SPEC.json RESULT.json``.

SPEC holds ``{"library": path or null, "config": TrialConfig dict, "rank": int, "plan": path of
the trial's pickled plan or null (then the rank plans), "setup": hook or null}``. The fake
CUDA device is loaded before anything imports torch (`canzona.trial.dryrun.fakecuda.preload`:
that is why each rank runs in a fresh process; forked from `canzona.trial.dryrun.zygote`, which
loaded it already, or started on its own), then `execute.run_rank` runs the rank. RESULT
gets ``{"ok": true, "result": {...}}``, or ``{"ok": false, "error": "<one line>"}`` naming the
rank, the exception and the innermost harness frame; the exit status is 0 or 1.

Test hook: ``CANZONA_DRYRUN_SETUP=FILE.py:FUNCTION`` in the environment of the process that
starts the dry run (`launch` passes it in SPEC: the zygote's environment is older) calls that function (no arguments) after
the imports and before the rank runs, e.g. to plant a violation the dry run must report.
"""

from __future__ import annotations

import json
import pickle
import sys
import traceback
from pathlib import Path

from canzona.layout import RankLayout
from canzona.trial.dryrun import fakecuda

SETUP_ENV = "CANZONA_DRYRUN_SETUP"


def describe(rank: int, grid: RankLayout, e: BaseException) -> str:
    """One line: the rank, what went wrong and where in the harness."""
    first = (str(e).strip().splitlines() or [""])[0]
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "/canzona/" in f.filename and "/trial/dryrun/" not in f.filename and not f.filename.endswith("dist_rules.py")]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} in {f.name})"
    d, t = grid.coords(rank)
    return f"rank {rank} (dp {d}, tp {t}): {type(e).__name__}: {first}{where}"


def _setup_hook(spec: str | None) -> None:
    if not spec:
        return
    import importlib.util

    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("canzona_dryrun_setup", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    getattr(module, name)()


def main(argv: list[str], cache_out: str | None = None) -> int:
    """Run the rank of SPEC (``argv[0]``) into RESULT (``argv[1]``); the exit status. With
    ``cache_out`` (the zygote's child), the fake-tensor cache entries the rank added are
    written there for the zygote to pass on (`canzona.trial.dryrun.fakecache`)."""
    spec = json.loads(Path(argv[0]).read_text())
    rank = spec["rank"]
    grid = RankLayout(spec["config"]["parallel"]["dp"], spec["config"]["parallel"]["tp"])
    inherited = None
    try:
        fakecuda.preload(spec["library"])
        from canzona.trial.dryrun import fakecache

        inherited = fakecache.size()
        from canzona.config import load_config
        from canzona.trial.dryrun.execute import run_rank

        cfg = load_config(base=spec["config"])
        plan = pickle.loads(Path(spec["plan"]).read_bytes()) if spec.get("plan") else None
        _setup_hook(spec.get("setup"))
        out = {"ok": True, "result": run_rank(cfg, rank, plan)}
        code = 0
    except Exception as e:  # noqa: BLE001 - every failure of the rank is its dry-run error
        traceback.print_exc()
        out, code = {"ok": False, "error": describe(rank, grid, e)}, 1
    Path(argv[1]).write_text(json.dumps(out))
    if cache_out and inherited is not None:
        try:
            fakecache.export(cache_out, inherited)
        except Exception:  # noqa: BLE001 - sharing the cache is an optimisation, never the rank's error
            pass
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
