"""Run in the Megatron peer environment (Python 3.12, megatron-core 0.19.2, emerging-optimizers
0.3.0) by tests/peers/test_gram_mirror.py: ``<peer python> megatron_gram.py JOB.json``.

On ``tp`` local gloo ranks, each matrix of the job (a random fp32 matrix from its seed, the same
on every rank) is cut along its ``partition_dim`` and each rank's shard orthogonalised by
megatron-core's own ``TensorParallelMuon.orthogonalize`` with ``tp_mode="distributed"`` (its
QKV split when the job asks, Megatron's ``split_qkv``), as its layer-wise optimizer calls it;
every ``torch.distributed.all_reduce`` it makes is recorded (elements, dtype). Rank r writes
``{name: {"full", "shard", "out", "calls"}}`` to ``out/rank{r}.pt``. It imports nothing from
canzona (whose schema needs packages this environment has not).
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist


def _rank(rank: int, job: dict, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=job["tp"])
    from megatron.core.optimizer.emerging_optimizers import TensorParallelMuon

    torch.set_float32_matmul_precision("highest")
    calls: list[tuple[int, str]] = []
    real = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        calls.append((tensor.numel(), str(tensor.dtype).removeprefix("torch.")))
        return real(tensor, *args, **kwargs)

    dist.all_reduce = recording
    group = dist.group.WORLD
    pgs = SimpleNamespace(tp=group, expt_tp=group, gtp_remat=None, expt_gtp_remat=None)
    out = {}
    for m in job["matrices"]:
        full = torch.randn(m["shape"], generator=torch.Generator().manual_seed(m["seed"]))
        shard = full.chunk(job["tp"], dim=m["partition_dim"])[rank].contiguous()
        p = torch.nn.Parameter(shard.clone())
        p.partition_dim = m["partition_dim"]
        p.is_qkv = m["qkv_split"] is not None
        opt = TensorParallelMuon([p], lr=1.0, momentum=0.0, weight_decay=0.0, split_qkv=p.is_qkv,
                                 is_qkv_fn=lambda q: getattr(q, "is_qkv", False), qkv_split_shapes=m["qkv_split"],
                                 fp32_matmul_prec="highest", coefficient_type="simple", num_ns_steps=job["ns_steps"],
                                 scale_mode="shape_scaling", pg_collection=pgs, tp_mode="distributed")
        calls.clear()
        with torch.no_grad():
            got = opt.orthogonalize(p, shard.clone())
        out[m["name"]] = {"full": full, "shard": shard, "out": got, "calls": list(calls)}
    torch.save(out, os.path.join(job["out"], f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    # The result is written and the group destroyed: leave without the interpreter's teardown.
    # Once in four CI runs (2026-12-07) a rank of this job died with SIGABRT ("terminate called
    # without an active exception", typically a C++ thread still joinable when a process ends);
    # a mitigation, not a proven cure: it did not come back in 14 runs of its tests since.
    os._exit(0)


def main(argv: list[str]) -> int:
    job = json.loads(open(argv[1]).read())
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank, args=(job, port), nprocs=job["tp"], join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
