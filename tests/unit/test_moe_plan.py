"""The expert planner: each EP rank's experts planned over its expert-data-parallel group by the
method's own strategies, every expert matrix placed once; and the planner-side loads it is
reported with agree with the counted programs on dense plans."""

from __future__ import annotations

import numpy as np
import pytest

from canzona.config import TrialConfig, load_config
from canzona.inventory import build_inventory
from canzona.plan.from_config import make_cost_model, make_plan
from canzona.plan.rank_loads import expert_rank_loads, plan_loads, step_loads
from canzona.plan.types import Plan
from canzona.program.count import compute_metrics

METHODS = ("canzona", "atomic", "sync", "layerwise", "adamw")
SMALL = ["model=qwen3-30b-a3b", "model.width_div=16", "model.num_layers=2", "model.num_experts=8", "model.top_k=2",
         "bucket.size=200000", "bucket.expert_size=30000"]
LAYOUTS = [["parallel.dp=4", "parallel.ep=2"], ["parallel.dp=4", "parallel.tp=2", "parallel.ep=2"],
           ["parallel.dp=2", "parallel.tp=2", "parallel.ep=4", "parallel.etp=1"], ["parallel.dp=4", "parallel.ep=1"]]


def _config(overrides: list[str], method: str) -> TrialConfig:
    return load_config([*overrides, f"method={method}"] + (["optimizer=adamw"] if method == "adamw" else []))


def _plan(cfg: TrialConfig) -> Plan:
    return make_plan(cfg, device="cpu", cost_model=make_cost_model("flops", cfg.optimizer.name))


def check_ownership(cfg: TrialConfig, plan: Plan) -> None:
    """Every expert matrix is in exactly one EP rank's plan (the one holding its expert), once in
    that rank's expert buffer, and -- for strategies that give whole matrices an owner -- owned by
    exactly one rank of its expert-DP group, whose shard holds it whole; shard ranges partition
    every expert bucket (each element updated once)."""
    ex = plan.experts
    assert ex is not None
    mcfg = cfg.model_cfg()
    inventory = build_inventory(mcfg)
    experts = [i for i, p in enumerate(inventory) if p.expert is not None]
    assert sorted(i for index in ex.index for i in index) == experts  # each expert matrix once over all EP ranks
    assert all(p.expert is None for p in plan.params)  # and none in the dense buffer
    lay = ex.layout
    per_ep = mcfg.num_experts // lay.ep
    for e, (index, sub) in enumerate(zip(ex.index, ex.plans)):
        assert (sub.dp, sub.tp) == (lay.edp, lay.etp) and len(index) == len(experts) // lay.ep
        assert {inventory[i].expert // per_ep for i in index} == {e}
        assert [p.name for p in sub.params] == [inventory[i].name for i in index]
        slots = {s.index: (b.index, s) for b in sub.layout.buckets for s in b.params}
        assert sorted(slots) == list(range(len(index)))  # each once in the expert buffer
        if sub.shard_ranges is not None:
            for bucket, ranges in zip(sub.layout.buckets, sub.shard_ranges):
                covered = sorted((a, b) for a, b in ranges if b > a)
                assert covered[0][0] == bucket.start and covered[-1][1] == bucket.end
                assert all(x[1] == y[0] for x, y in zip(covered, covered[1:]))
        whole = sub.param_sync != "none" and not sub.elementwise_on_shards
        for k in range(len(index)):
            owner = sub.dp_owner[k]
            assert (owner is not None) == whole, (cfg.method.label, k)
            if whole:
                assert 0 <= owner < lay.edp
                b, slot = slots[k]
                if sub.shard_ranges is not None:
                    lo, hi = sub.shard_ranges[b][owner]
                    assert lo <= slot.start and slot.end <= hi
                ranks = ex.computing_ranks(e, owner, sub.tp_owner[k] if sub.uses_matrix_rule(k) else None)
                # one rank of each expert-DP group of this EP rank computes it
                for t in range(lay.etp):
                    group = lay.edp_group(e, t)
                    assert sum(r in group for r in ranks) == (1 if sub.tp_owner[k] in (None, t) else 0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "-".join(v.split("=")[1] for v in x))
@pytest.mark.parametrize("method", METHODS)
def test_every_expert_matrix_placed_once(method: str, layout: list[str]) -> None:
    cfg = _config(SMALL + layout, method)
    plan = _plan(cfg)
    check_ownership(cfg, plan)
    assert len(plan.experts.plans[0].layout.buckets) > 1  # several expert buckets: the split is exercised


def test_expert_buffer_takes_its_own_bucket_size() -> None:
    small = _plan(_config(SMALL + ["parallel.dp=4", "parallel.ep=2"], "canzona")).experts
    big = _plan(_config(SMALL + ["parallel.dp=4", "parallel.ep=2", "bucket.expert_size=10000000"], "canzona")).experts
    assert len(big.plans[0].layout.buckets) == 1 < len(small.plans[0].layout.buckets)
    assert small.bucket_size == 30000 and small.plans[0].layout.numel % 128 == 0


def test_dense_part_is_the_dense_plan_of_the_same_buffer() -> None:
    """The experts leave the dense buffer; what remains is planned exactly as before."""
    cfg = _config(SMALL + ["parallel.dp=4", "parallel.ep=2"], "canzona")
    plan = _plan(cfg)
    dense = [p for p in build_inventory(cfg.model_cfg()) if p.expert is None]
    assert [p.name for p in plan.params] == [p.name for p in dense]
    assert any(p.name.endswith("mlp.router.weight") for p in plan.params)


def test_canzona_balances_experts_better_than_atomic() -> None:
    over = SMALL + ["parallel.dp=8", "parallel.ep=2", "bucket.expert_size=400000"]
    worst = {}
    for method in ("canzona", "atomic"):
        loads = expert_rank_loads(_plan(_config(over, method)).experts)
        worst[method] = loads.max() / loads.mean()
    assert worst["canzona"] <= worst["atomic"]


def test_qwen3_235b_full_scale() -> None:
    cfg = _config(["model=qwen3-235b-a22b", "parallel.dp=32", "parallel.ep=8"], "canzona")
    plan = _plan(cfg)
    check_ownership(cfg, plan)
    ex = plan.experts
    assert (ex.layout.edp, len(ex.index[0])) == (4, 94 * 16 * 2)
    assert len({id(p.layout) for p in ex.plans}) == 1  # the EP ranks' identical buffers planned once
    loads = step_loads(plan)
    assert loads.shape == (32,) and loads.min() > 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layout", [["parallel.dp=2", "parallel.tp=2"], ["parallel.dp=4"]])
def test_planner_loads_match_counted_programs_on_dense_plans(method: str, layout: list[str]) -> None:
    cfg = _config(["model=qwen3-0.6b", "model.width_div=8", "model.num_layers=2", "bucket.size=100000", *layout],
                  method)
    plan = make_plan(cfg, device="cpu", cost_model=make_cost_model("flops", cfg.optimizer.name))
    metrics = compute_metrics(plan)
    compute, numel = plan_loads(plan)
    np.testing.assert_allclose(compute, metrics.compute, rtol=1e-9)
    np.testing.assert_allclose(numel, metrics.numel, rtol=1e-9)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layout", LAYOUTS[1:3])
def test_planner_step_loads_match_counted_programs_on_moe_plans(method: str, layout: list[str]) -> None:
    """`step_loads` (the plan's dense and expert work per global rank, no programs) equals what
    counting the lowered programs gives (`compute_metrics`), at expert-TP = TP and at 1."""
    plan = _plan(_config([*SMALL, *layout, "parallel.sequence_parallel=true"], method))
    np.testing.assert_allclose(step_loads(plan), compute_metrics(plan).compute.reshape(-1), rtol=1e-9)


def test_an_moe_trial_at_tp_without_sequence_parallelism_is_refused_in_one_line(tmp_path, capsys) -> None:
    from canzona.run import main as run_main

    out = tmp_path / "trial"
    assert run_main([*SMALL, "parallel.dp=2", "parallel.tp=2", "parallel.ep=2", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "parallel.sequence_parallel=true only" in err and "\n" not in err and not out.exists()
