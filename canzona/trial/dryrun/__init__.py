"""The dry run: one or more ranks of a full-size job, executed on this CPU on fake CUDA tensors.

``python -m canzona.run model=qwen3-32b parallel.dp=32 parallel.tp=8 method=canzona
dist.dry_run=true dist.dry_run_ranks=0,255 out=DIR``, or from Python
``dry_run_trial(cfg, ranks, out) -> report``. Each rank runs the real code of a GPU rank --
process groups at the job's world size (torch's ``fake`` backend), Megatron's groups, the model
build, the flat buffers and hooks, every collective with its real shapes, forward, backward,
clipping, the optimizer step and the parameter gather -- on fake tensors, which have shapes and
devices but no memory. It reports each rank's peak device memory by category against the
device (``dist.dry_run_memory_gb``; 80 and 141 GiB always shown) and its collectives, and fails
(one line naming the rank) on a CPU tensor reaching a CUDA collective, sizes a collective's
group would not accept, any error of the rank's code, or a peak over the limit.

Modules: `launch` (workers, report; no torch until it runs), `worker` (a rank's process),
`zygote` (the preloaded parent of the rank processes), `fakecuda` (the fake CUDA device for
CPU-only torch), `device` (host queries, scalar reads and SDPA's kernel choice on fake
tensors), `execute` (one rank), `observe` (memory ledger and collective checks), `report`
(analytic count, verdicts, files); for speed only, `fakecache` (torch's fake-tensor dispatch
cache passed from rank to rank) and `fastkey` (its keys computed faster, checked against
torch's).

Importing this package imports no torch: the worker must load the fake device first.
"""

from __future__ import annotations

from typing import Any


def dry_run_trial(cfg: Any, ranks: Any = None, out: Any = None, **kwargs: Any) -> dict[str, Any]:
    """See `canzona.trial.dryrun.launch.dry_run_trial`."""
    from canzona.trial.dryrun.launch import dry_run_trial as run

    return run(cfg, ranks, out, **kwargs)


__all__ = ["dry_run_trial"]
