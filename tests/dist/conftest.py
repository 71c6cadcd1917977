"""Multi-process (gloo) test helpers: the ``run_ranks`` fixture spawns N local ranks.

See ``util.py`` (importable as ``util`` from this folder) for the contract.
"""

from __future__ import annotations

import pytest
from util import run_ranks as _run_ranks


@pytest.fixture
def run_ranks():
    """``run_ranks(fn, world, *args, timeout_s=60) -> [result of rank 0, ...]``."""
    return _run_ranks
