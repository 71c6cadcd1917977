"""What every method's planner starts from: the inventory, the buffer layout and the costs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from canzona.cost import CostModel, select_cost_model
from canzona.inventory import ParamSpec, build_inventory
from canzona.plan.buckets import BufferLayout, build_layout

if TYPE_CHECKING:
    from canzona.config import TrialConfig

# The cost model `canzona.plan.methods.make_plan` chose for the plan being made. Every method
# module calls `common_inputs(cfg)` with the config alone; the model travels beside it so that
# a caller can hand every rank the same model (rank 0's calibration, broadcast) and the
# planners stay pure functions of their inputs.
_MODEL: ContextVar[CostModel | None] = ContextVar("canzona_cost_model", default=None)


@contextmanager
def costs_from(model: CostModel) -> Iterator[CostModel]:
    """Plan with ``model``'s costs inside the block."""
    token = _MODEL.set(model)
    try:
        yield model
    finally:
        _MODEL.reset(token)


def common_inputs(cfg: TrialConfig) -> tuple[list[ParamSpec], BufferLayout, dict[int, float], str]:
    """Inventory, buffer layout and per-param costs: what every planner starts from. The costs
    come from the model `costs_from` set, else from `canzona.cost.select_cost_model` for the
    device the config runs on here."""
    mcfg = cfg.model_cfg()
    params = build_inventory(mcfg, split_fused=cfg.model.split_fused, matrix_embeddings=cfg.model.matrix_embeddings,
                             sequence_parallel=cfg.sequence_parallel)
    layout = build_layout(params, dp=cfg.parallel.dp, tp=cfg.parallel.tp, bucket_size=cfg.bucket_size())
    model = _MODEL.get()
    if model is None:
        from canzona.devices import trial_device

        model = select_cost_model(cfg, trial_device(cfg))
    cost = {i: model.cost(p) for i, p in enumerate(params)}
    return params, layout, cost, model.name


def matrix_rule_enabled(cfg: TrialConfig) -> bool:
    return cfg.method != "adamw" and cfg.optimizer.name != "adamw"
