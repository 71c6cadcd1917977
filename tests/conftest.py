"""Test-wide settings.

The planner's default cost model measures this machine into a calibration cache outside the
repository (`canzona.calibrate.cache`); the tests keep theirs in one temporary folder per
session (``CANZONA_CACHE_DIR``, inherited by every process a test starts), so they never
read a user's cache nor write into it, and a session times each shape once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from canzona.calibrate.cache import ENV as CACHE_ENV


@pytest.fixture(autouse=True, scope="session")
def calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("calibration-cache"))
    yield os.environ[CACHE_ENV]
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before
