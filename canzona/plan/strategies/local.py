"""TP strategy ``local``: every TP rank updates its own shard of every parameter, elementwise.

No TP communication at all; only elementwise rules (AdamW) can run so. With a matrix optimizer
at TP > 1 the combination is refused (`canzona.plan.registry.check`).
"""

from __future__ import annotations

from canzona.plan.tp import MicroGroup
from canzona.plan.types import PlanInputs

NAME = "local"
RUNG = None
MODE = "local"


def groups(items: list[int], inputs: PlanInputs, hint: dict[int, int] | None) -> list[MicroGroup]:
    return []
