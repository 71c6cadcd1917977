"""Timing forward and backward of the Qwen3 model (tp=1) at a few sizes, for the pass fit."""

from __future__ import annotations

import statistics
from typing import Any

from canzona.calibrate.clock import Clock
from canzona.inventory import model_config

# (model, width_div, layers, micro_batch, seq_len): around the local sweep's sizes on a CPU;
# on a GPU large enough that the passes measure the device, not kernel launches.
CPU_POINTS = (
    ("qwen3-0.6b", 8, 1, 1, 32), ("qwen3-0.6b", 8, 2, 1, 32), ("qwen3-0.6b", 8, 4, 1, 32),
    ("qwen3-8b", 16, 2, 1, 32), ("qwen3-8b", 16, 4, 1, 32), ("qwen3-0.6b", 16, 2, 2, 64),
)
GPU_POINTS = (
    ("qwen3-0.6b", 1, 1, 2, 512), ("qwen3-0.6b", 1, 2, 2, 512), ("qwen3-0.6b", 1, 4, 2, 512),
    ("qwen3-8b", 2, 2, 2, 512), ("qwen3-8b", 2, 4, 2, 512), ("qwen3-0.6b", 1, 2, 4, 1024),
)


def time_model(rank: int, world: int, clock: Clock) -> list[dict[str, Any]]:
    """Forward / backward seconds at each point, every process at once (Megatron's groups must
    be up, tp=1: `canzona.model.parallel.init_parallel`)."""
    from canzona.model.data import synthetic_batch
    from canzona.model.qwen3 import build_model
    from canzona.sim.model import forward_flops

    points_in = GPU_POINTS if clock.cuda else CPU_POINTS
    points = []
    for k, (name, div, layers, mb, seq) in enumerate((points_in[0], *points_in)):
        mcfg = model_config(name, div, layers)
        model = build_model(mcfg, device=clock.device, seed=0)
        fwd, bwd = [], []
        for step in range(7):
            tokens, labels = synthetic_batch(mcfg, mb, seq, 0, step, rank, world)
            tokens, labels = tokens.to(clock.device), labels.to(clock.device)
            t_f, loss = clock.call(model, tokens, labels)
            t_b, _ = clock.call(loss.backward)
            model.zero_grad(set_to_none=True)
            if step >= 2:
                fwd.append(t_f)
                bwd.append(t_b)
        del model
        if k == 0:
            continue  # the first model warms up the allocator and kernels
        points.append({"model": name, "width_div": div, "layers": layers, "micro_batch": mb, "seq_len": seq,
                       "flops": forward_flops(mcfg, 1, mb, seq), "forward_s": statistics.median(fwd),
                       "backward_s": statistics.median(bwd)})
    return points
