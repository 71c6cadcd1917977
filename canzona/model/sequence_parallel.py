"""Megatron's sequence parallelism (``--sequence-parallel``) for the Qwen3 model, on any device.

With sequence parallelism the activations outside the tensor-parallel regions (norms, residual
stream) are ``[s/tp, b, h]``: each TP rank holds its slice of the sequence. Entering a
column-parallel linear all-gathers the sequence; leaving a row-parallel linear reduce-scatters
it, in place of the all-reduce that plain TP does there (same bytes on the wire, activations
``tp`` times smaller). As in Megatron (``linear_with_grad_accumulation_and_async_allreduce``) a
column-parallel linear keeps only its input's slice for backward and all-gathers it again there
for the weight gradient.

megatron-core's own sequence-parallel mappings allocate on ``torch.cuda.current_device()``; these
run on whatever device the input is on (gloo on CPU, NCCL on GPUs, fake tensors in the dry run).
Collectives run along dim 0, the sequence, as Megatron's ``[s, b, h]`` layout has it
(``all_gather_single`` / ``reduce_scatter_single`` where torch has them, looked up at each call
so that the NCCL rules check them).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """``[n, ...]`` of every rank of ``group`` concatenated along dim 0 (not differentiable)."""
    world = dist.get_world_size(group)
    out = torch.empty((x.shape[0] * world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x.contiguous(), group=group)
    return out


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    if x.shape[0] % world:
        raise ValueError(f"sequence length {x.shape[0]} is not divisible by the TP size {world}")
    out = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x.contiguous(), group=group)
    return out


class _SequenceCollective(torch.autograd.Function):
    """``gather``: all-gather ``[s/tp, ...]`` to ``[s, ...]``, backward reduce-scatters (sums the
    TP ranks' partial gradients, keeps this rank's slice); otherwise the reverse: sum the TP ranks'
    partial ``[s, ...]`` and keep this rank's ``[s/tp, ...]``, backward all-gathers."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, gather: bool) -> torch.Tensor:
        ctx.group, ctx.gather = group, gather
        return (all_gather if gather else _reduce_scatter)(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (_reduce_scatter if ctx.gather else all_gather)(grad, ctx.group), None, None


class _GatherLinear(torch.autograd.Function):
    """``all_gather(x) @ weightᵀ`` keeping only ``x``'s slice for backward: there the input is
    gathered again for the weight gradient and the input gradient reduce-scattered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, group) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.group = group
        return F.linear(all_gather(x, group), weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_total = grad.matmul(weight)
        total = all_gather(x, ctx.group)
        grad_weight = grad.reshape(-1, grad.shape[-1]).t().matmul(total.reshape(-1, total.shape[-1]))
        return _reduce_scatter(grad_total, ctx.group), grad_weight, None


def reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """Leaving a row-parallel region: partial ``[s, b, h]`` -> summed ``[s/tp, b, h]``."""
    return _SequenceCollective.apply(x, group, False)


def gather(x: torch.Tensor, group) -> torch.Tensor:
    """Entering a region that needs the whole sequence, whose gradient is partial per TP rank:
    ``[s/tp, ...]`` -> ``[s, ...]``."""
    return _SequenceCollective.apply(x, group, True)


def gather_linear(x: torch.Tensor, weight: torch.Tensor, group) -> torch.Tensor:
    """A column-parallel linear on sequence-parallel input: ``[s/tp, b, h]`` -> ``[s, b, out/tp]``."""
    return _GatherLinear.apply(x, weight, group)


def row_linear(x: torch.Tensor, weight: torch.Tensor, group) -> torch.Tensor:
    """A row-parallel linear leaving to sequence-parallel output: ``[s, b, in/tp]`` -> ``[s/tp, b, h]``."""
    return reduce_scatter(F.linear(x, weight), group)


def embed(tokens: torch.Tensor, weight: torch.Tensor, vocab_start: int, vocab_end: int, group) -> torch.Tensor:
    """Vocab-parallel embedding of ``tokens [b, s]`` straight to ``[s/tp, b, h]``: each rank looks up
    the tokens of its vocabulary slice (zeros elsewhere), then one reduce-scatter sums and splits
    (Megatron's ``reduce_scatter_embeddings``)."""
    t = tokens.t()
    outside = (t < vocab_start) | (t >= vocab_end)
    local = F.embedding((t - vocab_start).masked_fill(outside, 0), weight)
    local = local.masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_scatter(local, group)


def install(module: torch.nn.Module, kind: str, group) -> None:
    """Make a megatron-core TP layer run sequence-parallel: its ``forward`` is replaced (the
    module, its parameters and its forward pre-hooks stay, so the executor's parameter-gather
    waits still fire before the first module that needs the parameters). ``kind``: ``column``
    (ColumnParallelLinear, optional ``weight=`` as for a tied output layer), ``row``
    (RowParallelLinear) or ``embedding`` (VocabParallelEmbedding); the linears keep megatron's
    ``(output, bias)`` return."""
    if kind == "column":
        def forward(input_: torch.Tensor, weight: torch.Tensor | None = None, **_):
            return gather_linear(input_, module.weight if weight is None else weight, group), None
    elif kind == "row":
        def forward(input_: torch.Tensor):
            return row_linear(input_, module.weight, group), None
    elif kind == "embedding":
        def forward(tokens: torch.Tensor):
            return embed(tokens, module.weight, module.vocab_start_index, module.vocab_end_index, group)
    else:
        raise ValueError(f"unknown sequence-parallel layer kind {kind!r}; allowed: column, row, embedding")
    module.forward = forward
