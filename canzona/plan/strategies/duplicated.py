"""TP strategy ``duplicated``: every TP rank all-gathers each TP-sharded matrix and computes it.

The authors' ``SyncGroupExecutor`` (``--use-tp-sync-opt``) and Megatron-LM's ``duplicated`` TP
mode for Muon: one matrix at a time, its gradient all-gathered over TP, the whole update computed
on every TP rank, each keeping its slice. TP times the compute, and full-matrix optimizer state
on every TP rank.
"""

from __future__ import annotations

from canzona.plan.tp import MicroGroup
from canzona.plan.types import PlanInputs

NAME = "duplicated"
RUNG = "0_0"  # the authors' USE_TP_ASYNC_OPT=0 (--use-tp-sync-opt)
MODE = "duplicated"


def groups(items: list[int], inputs: PlanInputs, hint: dict[int, int] | None) -> list[MicroGroup]:
    return []
