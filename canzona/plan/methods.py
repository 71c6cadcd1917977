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


def make_plan(cfg: TrialConfig) -> Plan:
    """Plan one trial; the result is identical on every rank and process."""
    t0 = time.perf_counter()
    plan = replace(METHODS[cfg.method].plan(cfg), execution=Execution.from_config(cfg))
    return replace(plan, plan_seconds=time.perf_counter() - t0)
