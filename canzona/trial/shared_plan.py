"""One plan for every rank of a trial, made once.

Measured costs are timings, and two processes timing the same shapes get different numbers; a
rank on another node may see another calibration cache, or none. So the ranks never plan on
their own: under an external launch rank 0 selects the cost model (`canzona.plan.from_config.select_cost_model`:
loading this machine's calibration, or taking it), plans, and broadcasts the plan -- plain data,
over the CPU (gloo) half of the default group. A local launch (`canzona.trial.launch.run_trial`)
plans before the ranks start and hands them its plan. A failure on rank 0 (a bad
``planner.cost_hardware``) reaches every rank at once instead of leaving them waiting at the
broadcast.
"""

from __future__ import annotations

from typing import Any


def shared_plan(cfg: Any, device: str, rank: int, threads: int) -> Any:
    """Rank 0's plan of ``cfg`` on ``device``, on every rank (a collective: every rank of the
    default group calls it). ``threads``: the torch threads of a rank."""
    import torch.distributed as dist

    from canzona.plan.from_config import make_plan

    box: list[Any] = [None]
    if rank == 0:
        try:
            box[0] = make_plan(cfg, device=device, threads=threads)
        except Exception as e:  # noqa: BLE001 - handed to every rank, raised there
            box[0] = e
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]
