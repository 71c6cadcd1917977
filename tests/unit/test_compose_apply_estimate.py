"""Canzona's plan never projects a longer critical path than the `async` TP schedule it ablates
(issue 27 item 4): Qwen3-14B at DP 32 x TP 8 with the authors' settings (profile
ablation_projection), where the compute-only score once chose whole-tensor cuts whose many
small matrices cost more apply work than the compute they saved (canzona.plan.compose)."""

from __future__ import annotations

from canzona.config import load_config
from canzona.hardware import load_hardware
from canzona.plan.compose import elementwise_price, step_estimate
from canzona.plan.critical_path import critical_path
from canzona.plan.from_config import make_plan, plan_inputs, select_cost_model
from canzona.plan.loads import owner_loads

AUTHORS = ["model=qwen3-14b", "parallel.dp=32", "parallel.tp=8", "optimizer.name=muon", "dist.device=cuda",
           "train.seq_len=2048", "train.micro_batch=4", "optimizer.ns_dtype=bfloat16", "bucket.size=400000000",
           "model.vocab=50257", "model.tied_embeddings=true", "parallel.sequence_parallel=true"]


def _plan(method: list[str]):
    cfg = load_config(AUTHORS + method)
    cm = select_cost_model(cfg, "cuda", hardware=load_hardware("h100"))
    return make_plan(cfg, device="cuda", cost_model=cm), plan_inputs(cfg, cm)


def test_canzona_critical_path_not_above_async_at_14b_dp32_tp8():
    canzona, inputs = _plan(["method=canzona"])
    ablated, _ = _plan(["method.dp=balanced", "method.tp=async"])
    price = elementwise_price(inputs)
    assert price[1] > 0
    assert step_estimate(canzona, price) <= step_estimate(ablated, price) + 1e-12
    assert (critical_path(canzona, owner_loads(canzona)).imbalance
            <= critical_path(ablated, owner_loads(ablated)).imbalance + 1e-12)


def test_apply_work_counts_each_matrix_on_every_tp_rank_of_its_dp_owner():
    plan, inputs = _plan(["method=canzona"])
    from canzona.plan.compose import apply_loads
    loads = apply_loads(plan, (1.0, 0.0))  # one unit per matrix
    matrices = sum(1 for i in range(len(plan.params)) if plan.uses_matrix_rule(i))
    assert loads.sum() == matrices * plan.tp
    assert (loads == loads[:, :1]).all()
