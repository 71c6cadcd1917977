"""A tiny job for the Slurm e2e test: one gloo all_reduce across the job's tasks.

Kept free of test-only imports so a Slurm task can unpickle and run it.
"""

from __future__ import annotations


def allreduce_rank_plus_one() -> tuple[int, int, float]:
    """Return (rank, world_size, sum over ranks of rank + 1)."""
    import submitit
    import torch
    import torch.distributed as dist

    env = submitit.helpers.TorchDistributedEnvironment().export()
    dist.init_process_group("gloo")
    try:
        t = torch.tensor([float(env.rank + 1)])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), float(t.item())
    finally:
        dist.destroy_process_group()
