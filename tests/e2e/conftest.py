"""The one Slurm cluster of a test session, shared by every module that needs it.

A single session-scoped fixture (defining it in each module would start a cluster per module,
and a module finding another's cluster up would skip its teardown test). Tests marked
``slurm_down`` stop the cluster, so they are moved after every other test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from slurm_util import STATE_DIR, Cluster, dev_cluster, sinfo_ok


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    last = [it for it in items if it.get_closest_marker("slurm_down")]
    if last:
        items[:] = [it for it in items if not it.get_closest_marker("slurm_down")] + last


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """A reachable Slurm controller. Brings the dev cluster up if `sinfo` fails; tears it down
    at the end only if it brought it up (and the ``slurm_down`` test has not already)."""
    c = Cluster()
    old_conf = os.environ.get("SLURM_CONF")
    if not sinfo_ok():
        t0 = time.monotonic()
        r = dev_cluster("up", timeout=900)  # includes apt-get install on a bare machine
        c.up_seconds = time.monotonic() - t0
        assert r.returncode == 0, f"dev-cluster.sh up failed:\n{r.stdout}\n{r.stderr}"
        c.started_here = True
        # /etc/slurm/slurm.conf normally points here already; set it explicitly all the same.
        os.environ["SLURM_CONF"] = str(STATE_DIR / "etc" / "slurm.conf")
        assert sinfo_ok(), "sinfo still fails after dev-cluster.sh up"
    c.running = True
    yield c
    if c.started_here and c.running:
        r = dev_cluster("down", timeout=300)
        assert r.returncode == 0, f"dev-cluster.sh down failed:\n{r.stdout}\n{r.stderr}"
    if c.started_here:
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
