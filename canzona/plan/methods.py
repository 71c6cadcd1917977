"""The method registry: every method is one planner module with ``NAME``, ``SUMMARY`` and
``plan(cfg) -> Plan`` (pure, rank-independent). Adding a method: write the module, list it in
`_MODULES`. Nothing downstream branches on method names: the plan says what runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from baselines import layerwise, sync
from canzona.cost import select_cost_model
from canzona.plan import method_adamw, method_canzona
from canzona.plan.common import costs_from
from canzona.plan.types import Execution, Plan

if TYPE_CHECKING:
    from canzona.config import TrialConfig
    from canzona.cost import CostModel

_MODULES = (method_canzona, sync, layerwise, method_adamw)
METHODS: dict[str, object] = {m.NAME: m for m in _MODULES}


def make_plan(cfg: TrialConfig, device: str | None = None, cost_model: CostModel | None = None) -> Plan:
    """Plan one trial for a device kind (``cpu``/``cuda``; default: what ``dist.device`` means
    on this machine) with ``cost_model`` (default: `canzona.cost.select_cost_model`'s for that
    device, which may time missing shapes into this machine's calibration cache first). With the
    same cost model the result is identical on every rank and process."""
    from canzona.devices import trial_device

    device = device or trial_device(cfg)
    model = cost_model or select_cost_model(cfg, device)
    t0 = time.perf_counter()  # planning time: the calibration above is not part of it
    ex = Execution.from_config(cfg, device)
    with costs_from(model):
        plan = METHODS[cfg.method].plan(cfg)
    return replace(plan, execution=ex, cost_source=model.source, plan_seconds=time.perf_counter() - t0)
