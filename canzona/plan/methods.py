"""The method registry: every method is one planner module with ``NAME``, ``SUMMARY`` and
``plan(cfg) -> Plan`` (pure, rank-independent). Adding a method: write the module, list it in
`_MODULES`. Nothing downstream branches on method names: the plan says what runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from baselines import layerwise, sync
from canzona.plan import method_adamw, method_canzona
from canzona.plan.types import Execution, Plan

if TYPE_CHECKING:
    from canzona.config import TrialConfig

_MODULES = (method_canzona, sync, layerwise, method_adamw)
METHODS: dict[str, object] = {m.NAME: m for m in _MODULES}


def make_plan(cfg: TrialConfig, device: str | None = None) -> Plan:
    """Plan one trial for a device kind (``cpu``/``cuda``; default: what ``dist.device`` means
    on this machine); the result is identical on every rank and process."""
    from canzona.devices import trial_device

    t0 = time.perf_counter()
    ex = Execution.from_config(cfg, device or trial_device(cfg))
    plan = replace(METHODS[cfg.method].plan(cfg), execution=ex)
    return replace(plan, plan_seconds=time.perf_counter() - t0)
