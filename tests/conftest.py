"""Test-wide settings.

The planner's default cost model measures this machine into a calibration cache outside the
repository (`canzona.calibrate.cache`); the tests keep theirs in one temporary folder per
session (``CANZONA_CACHE_DIR``, inherited by every process a test starts), so they never
read a user's cache nor write into it, and a session times each shape once.

`quick_calibration`: ``python -m canzona.calibrate quick=true device=cpu`` run once per session
(about 20 s on 2 cores) for every test that checks or uses its hardware file; they only read it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from canzona.calibrate.cache import ENV as CACHE_ENV


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test.sh, ``--dist loadgroup``) every worker would make its own
    copy of a shared fixture for the tests it was dealt: the users of `quick_calibration` (the
    two-trial sweep's among them) go to one worker, and the tests sharing a module-scoped
    fixture's instance (the module and the fixture's parameter) to one worker, each in one xdist
    group. The Slurm tests' group: tests/e2e/conftest.py.

    ``pytest -m "paper or peers" -n 2 --dist loadgroup`` runs in two groups: the paper profile's
    dry run of every trial (the longest test by far, its ranks on every core) on one worker,
    every other paper and peers test on the other, beside it (.ci/run runs the step on one
    worker: faster on CI's machine, .ci/run says by how much)."""
    for it in items:
        if it.get_closest_marker("paper") or it.get_closest_marker("peers"):
            long_pole = it.name == "test_every_paper_trial_passes_the_dry_run"
            it.add_marker(pytest.mark.xdist_group("paper-dry-run" if long_pole else "paper-and-peers"))
            continue
        if it.get_closest_marker("xdist_group"):
            continue
        if "quick_calibration" in getattr(it, "fixturenames", ()):
            it.add_marker(pytest.mark.xdist_group("quick_calibration"))
            continue
        defs = getattr(getattr(it, "_fixtureinfo", None), "name2fixturedefs", {})
        shared = sorted(name for name in it.fixturenames if any(d.scope == "module" for d in defs.get(name, ())))
        if not shared:
            continue
        params = getattr(getattr(it, "callspec", None), "params", {})
        instance = ",".join(f"{n}={params[n]}" for n in shared if n in params)
        it.add_marker(pytest.mark.xdist_group(f"{it.module.__name__}[{instance}]"))


@pytest.fixture(autouse=True, scope="session")
def calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("calibration-cache"))
    yield os.environ[CACHE_ENV]
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@dataclass(frozen=True)
class Calibration:
    """The quick calibration's command line result and the hardware file it wrote (``quick.yaml``,
    so the hardware is named ``quick``)."""

    path: Path
    proc: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def quick_calibration(tmp_path_factory: pytest.TempPathFactory, calibration_cache: str) -> Calibration:
    out = tmp_path_factory.mktemp("quick-calibration") / "quick.yaml"
    proc = subprocess.run([sys.executable, "-m", "canzona.calibrate", f"out={out}", "quick=true", "device=cpu"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    return Calibration(out, proc)


@pytest.fixture(scope="session")
def machine_calibration(quick_calibration: Calibration) -> Path:
    """The session's quick calibration placed where `canzona.calibrate.machine` keeps this
    machine's hardware file (in the session's cache folder), so that a measured local sweep's
    report reuses it instead of taking the full minute-long calibration in every test."""
    import shutil

    from canzona.calibrate.machine import machine_hardware_path

    assert quick_calibration.proc.returncode == 0, quick_calibration.proc.stderr[-2000:]
    path = machine_hardware_path(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(quick_calibration.path, path)
    return path


@pytest.fixture(scope="session")
def records_gen():
    """`tests/fixtures/records_gen.py` as a module (synthetic trial records for the analysis and
    report tests), loaded once: `tests/fixtures` is not a package."""
    import importlib.util

    name = "canzona_records_gen"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "fixtures" / "records_gen.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
