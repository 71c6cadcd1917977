"""Test support: a model's full (unsharded) tensors -- the initial values without any process
group, every rank's gradients gathered (and which are partial per TP rank), and a full state dict
loaded into a sharded model -- and one iteration of a rank's program run from given gradients
instead of forward and backward.

The product needs only `canzona.model.qwen3.full_state_dict` (``save_params``); the parity and
model tests compare full tensors and step from known gradients, so these live here (importable
as ``full_tensors`` from this folder, in the test process and in the ranks `util.run_ranks`
starts).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from canzona.inventory import ModelConfig, build_inventory
from canzona.model.qwen3 import Qwen3Model, full_views, init_shard
from canzona.program.actions import Backward


def init_full_state_dict(mcfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """The full initial values ``build_model(cfg, seed=seed)`` shards, without any process group."""
    return {
        s.name: init_shard(s, i, seed=seed, num_layers=mcfg.num_layers)
        for i, s in enumerate(build_inventory(mcfg))
    }


def full_grad_dict(model: Qwen3Model, *, reduce_partial: bool = True) -> dict[str, torch.Tensor]:
    """name -> full gradient (CPU). With ``reduce_partial`` the partial q/k-norm grads are summed
    over TP first (on a copy; the model's grads are left as they are). Experts' gradients are
    this EP group's (not reduced over expert-DP). Collective."""
    group = parallel_state.get_tensor_model_parallel_group()
    grads = []
    for p, s in zip(model.parameters(), model.param_specs()):
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if reduce_partial and s.tp_grad_allreduce and model.tp > 1:
            g = g.detach().clone()
            dist.all_reduce(g, group=group)
        grads.append(g)
    return full_views(model, grads)


def tp_partial_grad_params(model: Qwen3Model) -> list[tuple[str, torch.nn.Parameter]]:
    """Replicated params whose grads are partial per TP rank (sum them over TP)."""
    return [(n, p) for (n, p), s in zip(model.named_parameters(), model.param_specs()) if s.tp_grad_allreduce]


def load_full_state_dict(model: Qwen3Model, full: dict[str, torch.Tensor]) -> None:
    """Copy this rank's shard of each full tensor (every param of the full inventory, all
    experts included) into the model (no communication)."""
    names = [s.name for s in build_inventory(model.cfg)]
    missing = [n for n in names if n not in full]
    extra = sorted(set(full) - set(names))
    if missing or extra:
        raise KeyError(f"full state dict mismatch: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for (n, p), s in zip(model.named_parameters(), model.param_specs()):
            t = full[n]
            if tuple(t.shape) != s.shape:
                raise ValueError(f"{n}: full shape {tuple(t.shape)} != {s.shape}")
            split, rank = model.tp_split(s)
            if s.tp_dim is not None and split > 1:
                size = s.shape[s.tp_dim] // split
                t = t.narrow(s.tp_dim, rank * size, size)
            p.copy_(t)


def step_from_grads(runtime, local_grads: list[torch.Tensor], timer) -> None:
    """One iteration of ``runtime``'s program from given gradients (the rank's, TP-local, in its
    params' order) instead of forward and backward: the iteration starts as the first forward
    starts it, the parameter gathers the last one left in flight complete as the forward would
    complete them (the program's drain is that chain), the gradients land in the buffer, every
    bucket's hook issues (in bucket order, as a backward that filled them all would), and the
    actions after the backward run."""
    actions = runtime.program.actions
    last_backward = max(k for k, a in enumerate(actions) if isinstance(a, Backward))
    runtime.start_iteration()
    runtime.run(runtime.program.drain, timer)
    for i, g in enumerate(local_grads):
        runtime.buffers.grad_view(i).copy_(g)
    runtime.run([c for h in actions[last_backward].hooks for c in h.issue], timer)
    runtime.run(actions[last_backward + 1 :], timer)
