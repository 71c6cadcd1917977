"""Under an external launch every rank runs rank 0's plan, made with its costs, even when another rank's
calibration cache holds other numbers (another node, another cache): `canzona.trial.shared_plan`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from canzona.calibrate import cache
from canzona.calibrate.cache import this_device
from canzona.config import load_config
from canzona.plan.from_config import select_cost_model

pytestmark = pytest.mark.slow

ARGS = ["model=qwen3-0.6b", "model.width_div=8", "model.num_layers=2", "parallel.dp=2", "dist.threads_per_rank=1"]


def _ranks_plan(rank: int, world: int, dirs: list[str]) -> dict[str, Any]:
    import torch.distributed as dist

    from canzona.plan.from_config import make_plan
    from canzona.trial.shared_plan import shared_plan

    os.environ[cache.ENV] = dirs[rank]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = load_config(ARGS)

    def owners(plan) -> tuple:
        return plan.shard_ranges, plan.dp_owner, plan.tp_owner

    shared = shared_plan(cfg, "cpu", rank, 1)
    alone = make_plan(cfg, "cpu")  # what this rank would plan from its own cache
    try:  # rank 0's failure reaches every rank (nobody waits at the broadcast for it)
        shared_plan(load_config([*ARGS, "planner.cost=roofline", "planner.cost_hardware=h900"]), "cpu", rank, 1)
        failure = None
    except Exception as e:  # noqa: BLE001
        failure = f"{type(e).__name__}: {e}"
    return {"shared": owners(shared), "alone": owners(alone), "source": shared.cost_source,
            "cost": shared.cost, "failure": failure}


def test_every_rank_plans_with_rank_0s_costs(tmp_path: Path, run_ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = [tmp_path / "rank0", tmp_path / "rank1"]
    # rank 1's cache: this machine's calibration, except that elementwise updates look 1000x
    # dearer -- planning from it alone gives the embedding a rank of its own
    monkeypatch.setenv(cache.ENV, str(dirs[1]))
    select_cost_model(load_config(ARGS), "cpu", threads=1)
    path = dirs[1] / this_device("cpu", 1).file_name()
    data = yaml.safe_load(path.read_text())
    data["elementwise"]["seconds_per_element"] *= 1000
    path.write_text(yaml.safe_dump(data))
    r0, r1 = run_ranks(_ranks_plan, 2, [str(d) for d in dirs], timeout_s=120)
    assert r0["shared"] == r1["shared"] and r0["cost"] == r1["cost"]
    assert r0["source"] == r1["source"] and str(dirs[0]) in r0["source"]  # rank 0's cache, taken by rank 0
    assert r1["alone"] != r1["shared"]  # the test can fail: rank 1's own cache plans otherwise
    assert r0["failure"] == r1["failure"] and "ConfigError" in r0["failure"] and "h900" in r0["failure"]
