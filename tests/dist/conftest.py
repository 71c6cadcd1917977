"""Multi-process (gloo) test helpers: the ``run_ranks`` fixture spawns N local ranks.

Every test here runs under NCCL's rules (`canzona.dist_rules`): ``CANZONA_NCCL_RULES=1`` is set
for each test, so the ranks ``run_ranks`` spawns and the ranks of every trial a test launches
(`canzona.trial.launch`) check each collective as NCCL would, and the rules are installed in
this process for the test's duration (for the in-process single-rank tests). See ``util.py`` (importable as
``util`` from this folder) for the contract.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from util import run_ranks as _run_ranks

from canzona import dist_rules


@pytest.fixture(autouse=True)
def nccl_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """NCCL's rules on for every rank a test here starts, and in this process."""
    monkeypatch.setenv(dist_rules.ENV, "1")
    was = dist_rules.installed()
    dist_rules.install()
    yield
    if not was:
        dist_rules.uninstall()


@pytest.fixture
def run_ranks():
    """``run_ranks(fn, world, *args, timeout_s=60) -> [result of rank 0, ...]``."""
    return _run_ranks
