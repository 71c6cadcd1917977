"""One cost model for every rank of a trial, so that every rank makes the same plan.

Measured costs are timings, and two processes timing the same shapes get different numbers; a
rank on another node may see another calibration cache, or none. So the ranks never choose
their costs on their own: rank 0 selects the cost model (`canzona.cost.select_cost_model`:
loading this machine's calibration, or taking it) and broadcasts it -- a picklable object,
over the CPU (gloo) half of the default group -- before anyone plans. A local launch
(`canzona.trial.launch.run_trial`) has already calibrated before the ranks started, so rank 0
only reads the cache there. A failure on rank 0 (a bad ``canzona.cost_profile``) reaches every
rank at once instead of leaving them waiting at the broadcast.
"""

from __future__ import annotations

from typing import Any


def shared_cost_model(cfg: Any, device: str, rank: int, threads: int) -> Any:
    """Rank 0's cost model for a plan of ``cfg`` on ``device``, on every rank (a collective:
    every rank of the default group calls it). ``threads``: the torch threads of a rank."""
    import torch.distributed as dist

    from canzona.cost import select_cost_model

    box: list[Any] = [None]
    if rank == 0:
        try:
            box[0] = select_cost_model(cfg, device, threads=threads)
        except Exception as e:  # noqa: BLE001 - handed to every rank, raised there
            box[0] = e
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]
