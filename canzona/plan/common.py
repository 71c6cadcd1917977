"""What every method's planner starts from: the inventory, the buffer layout and the costs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.cost import make_cost_model
from canzona.inventory import ParamSpec, build_inventory
from canzona.plan.buckets import BufferLayout, build_layout

if TYPE_CHECKING:
    from canzona.config import TrialConfig


def common_inputs(cfg: TrialConfig) -> tuple[list[ParamSpec], BufferLayout, dict[int, float], str]:
    """Inventory, buffer layout and per-param costs: what every planner starts from."""
    mcfg = cfg.model_cfg()
    params = build_inventory(mcfg, split_fused=cfg.model.split_fused, matrix_embeddings=cfg.model.matrix_embeddings)
    layout = build_layout(params, dp=cfg.parallel.dp, tp=cfg.parallel.tp, bucket_size=cfg.bucket_size())
    opt = "adamw" if cfg.method == "adamw" else cfg.optimizer.name
    model = make_cost_model(
        cfg.canzona.cost,
        opt,
        profile=cfg.canzona.measured_profile,
        elementwise_flops=cfg.canzona.elementwise_flops,
        settings=cfg.optimizer,
    )
    cost = {i: model.cost(p) for i, p in enumerate(params)}
    return params, layout, cost, model.name


def matrix_rule_enabled(cfg: TrialConfig) -> bool:
    return cfg.method != "adamw" and cfg.optimizer.name != "adamw"
