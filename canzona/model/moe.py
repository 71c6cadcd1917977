"""Qwen3's mixture-of-experts MLP with expert parallelism, on any device (gloo on CPU, NCCL, fakes).

One MoE layer (Qwen3-30B-A3B / 235B-A22B: every layer sparse, no shared expert):

1. **Router**: ``logits = x @ router.weightᵀ`` in fp32 (Megatron's ``moe_router_dtype=fp32``),
   softmax over all experts, top-k (``torch.topk`` on the logits, so ties break the same way
   wherever the logits are identical), the k probabilities renormalised to sum 1 (Qwen3's
   ``norm_topk_prob``).
2. **Dispatch**: the (token, expert) pairs sorted by expert (a stable argsort: inside an expert,
   token order), the per-expert counts exchanged over the EP group (one ``all_to_all_single``
   of ``E`` integers, read on the host), then the token rows sent to the EP ranks holding their
   experts (``all_to_all_single`` with those split sizes; autograd sends the gradients back).
3. **Experts**: each local expert runs on its rows from every EP peer, one expert at a time
   (fc1 -> `canzona.model.fused.swiglu` -> fc2, as megatron-core's ``SequentialMLP``).
4. **Combine**: the outputs sent back (the reverse ``all_to_all_single``), weighted by the
   routing probabilities in fp32 and summed over each token's k experts.

**Expert-TP** (``etp`` = TP > 1, with sequence parallelism): each TP rank routes its own part of
the sequence (the router's gradient is partial per TP rank, as the inventory says), then the
tokens and their probabilities are all-gathered over the expert-TP group, so every rank of it
dispatches the same tokens over its EP group; each holds a row block of every local expert's fc1
(whole gate/up pairs) and the matching columns of fc2, as the dense MLP, and the weighted partial
outputs are reduce-scattered back to its part of the sequence (`canzona.model.sequence_parallel`).

Dropless: no capacity factor, no token is dropped or padded. **No auxiliary loss**: Qwen3 trains
with a load-balancing loss (and Megatron adds it with ``moe_aux_loss_coeff``), but it only
changes the router's gradient by a small term; the harness times the optimizer step, so it is
left out, and the loss is the language-model loss alone.

Every local expert gets a gradient every step, even with no tokens: its matmuls run on an empty
``[0, hidden]`` input, so autograd produces a zero gradient (the executor's bucket hooks wait for
a gradient of every parameter). Every rank takes part in both all-to-alls forward and backward.

``balanced_routing`` replaces the top-k choice by a fixed round-robin one (slot ``t·k + j`` of
token t goes to expert ``(t·k + j) mod E``), so every expert gets the same count (``T·k/E`` when
E divides it) and the split sizes follow from the token count alone: no count exchange, nothing
read from the device. That is what the fake-tensor dry run needs (fake tensors have no values to
read); it assumes every rank of the EP group has the same number of tokens, as every rank of a
trial does. The probabilities are still the softmax's at the chosen experts, renormalised.

What of megatron-core 0.16.1 is used, and why not more: its MoE pieces assume CUDA on CPU/gloo.
``TopKRouter.forward`` moves its weight to ``torch.cuda.current_device()``;
``MoEAlltoAllTokenDispatcher`` creates a ``torch.cuda.Stream`` when built;
``tensor_parallel.mappings.all_to_all`` allocates its output on the current CUDA device for
uneven splits. ``moe_utils.permute`` / ``unpermute`` do run on CPU, but ``permute`` selects with
``masked_select``, whose output size depends on the values, so fake tensors cannot run it; the
stable argsort here gives the same expert-major, token-ordered rows with static shapes. So the
layer is written here, following megatron-core's algorithm (all-to-all dispatcher, sequential
experts); only its process groups come from megatron (`canzona.model.parallel`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from canzona.inventory import ModelConfig
from canzona.model import fused
from canzona.model import sequence_parallel as sp


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Rows ``in_splits[j]`` to EP peer j, ``out_splits[j]`` from it; backward sends the
    gradients the other way (swapped splits)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """``all_to_all_single`` along dim 0 with uneven splits, differentiable."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class Router(nn.Module):
    """The gate: ``weight [E, hidden]`` (replicated, AdamW), fp32 logits."""

    def __init__(self, num_experts: int, hidden: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight.float())


class ExpertWeights(nn.Module):
    """One matrix per local expert, named ``weight<e>`` by its global index ``e`` (the
    inventory's ``mlp.experts.linear_fc1.weight<e>``); ``forward(x, l)`` applies local expert l,
    so the executor's forward pre-hooks on this module fire before its weights are used."""

    def __init__(self, experts: range, shape: tuple[int, int], dtype: torch.dtype):
        super().__init__()
        self.names = [f"weight{e}" for e in experts]
        for name in self.names:
            self.register_parameter(name, nn.Parameter(torch.empty(shape, dtype=dtype)))

    def forward(self, x: torch.Tensor, local: int) -> torch.Tensor:
        return F.linear(x, getattr(self, self.names[local]))


class Experts(nn.Module):
    """This EP rank's experts: fc1 ``[2·ffn/etp, hidden]`` (rows interleaved gate_i, up_i, as the
    dense fc1; this expert-TP rank's block), fc2 ``[hidden, ffn/etp]``; all experts' fc1, then all
    experts' fc2."""

    def __init__(self, mcfg: ModelConfig, experts: range, dtype: torch.dtype, etp: int = 1):
        super().__init__()
        rows = 2 * mcfg.ffn if mcfg.gated_mlp else mcfg.ffn
        self.act = fused.swiglu if mcfg.gated_mlp else F.gelu
        self.linear_fc1 = ExpertWeights(experts, (rows // etp, mcfg.hidden), dtype)
        self.linear_fc2 = ExpertWeights(experts, (mcfg.hidden, mcfg.ffn // etp), dtype)

    def forward(self, x: torch.Tensor, local: int) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x, local)), local)


def balanced_choice(tokens: int, top_k: int, num_experts: int, device: torch.device | str,
                    first: int = 0) -> torch.Tensor:
    """The round-robin routing of `MoELayer`'s ``balanced_routing``: ``[tokens, top_k]`` expert
    indices of tokens ``first ..``, slot ``t·k + j`` to expert ``(t·k + j) mod E`` (k distinct
    experts per token)."""
    slots = torch.arange(first * top_k, (first + tokens) * top_k, device=device)
    return slots.remainder(num_experts).view(tokens, top_k)


def balanced_counts(tokens: int, top_k: int, num_experts: int) -> list[int]:
    """How many of the ``tokens·top_k`` slots `balanced_choice` gives each expert (host ints)."""
    n = tokens * top_k
    return [n // num_experts + (1 if e < n % num_experts else 0) for e in range(num_experts)]


class MoELayer(nn.Module):
    """The MoE MLP of one decoder layer on this EP rank (see the module docstring).

    ``forward(x [..., hidden]) -> [..., hidden]`` routes every row of ``x`` (with sequence
    parallelism, this TP rank's part of the sequence: each TP rank dispatches its own tokens over
    its EP group). ``ep_group`` is Megatron's expert-model-parallel group (``ep`` ranks, this one
    ``ep_rank``), holding experts ``ep_rank·E/ep .. (ep_rank+1)·E/ep - 1``; ``etp_group`` its
    expert-TP group (``etp`` ranks, this one ``etp_rank``; etp > 1 only with sequence parallelism
    over that same TP group).
    """

    def __init__(self, mcfg: ModelConfig, dtype: torch.dtype, ep: int = 1, ep_rank: int = 0, ep_group=None,
                 balanced_routing: bool = False, etp: int = 1, etp_rank: int = 0, etp_group=None,
                 shared_experts: nn.Module | None = None):
        super().__init__()
        self.num_experts, self.top_k = mcfg.num_experts, mcfg.top_k
        self.ep, self.ep_rank, self.ep_group = ep, ep_rank, ep_group
        self.etp, self.etp_rank, self.etp_group = etp, etp_rank, etp_group
        self.local = mcfg.num_experts // ep
        self.balanced_routing = balanced_routing
        self.router = Router(mcfg.num_experts, mcfg.hidden, dtype)
        self.experts = Experts(mcfg, range(ep_rank * self.local, (ep_rank + 1) * self.local), dtype, etp)
        self.shared_experts = shared_experts  # a dense MLP every token also goes through (registered last)

    def route(self, x: torch.Tensor, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` (tokens ``first ..`` of the expert-TP group's) -> (fp32 probabilities
        ``[T, k]`` summing to 1, expert indices ``[T, k]``)."""
        logits = self.router(x)
        if self.balanced_routing:
            chosen = balanced_choice(x.shape[0], self.top_k, self.num_experts, x.device, first)
        else:
            chosen = logits.topk(self.top_k, dim=-1).indices
        probs = logits.softmax(-1).gather(1, chosen)
        return probs / probs.sum(-1, keepdim=True), chosen

    def _counts(self, chosen: torch.Tensor) -> tuple[list[int], list[int]]:
        """(rows this rank sends per global expert, rows it receives per (EP peer, local expert)),
        both flat lists read on the host."""
        t = chosen.shape[0]
        if self.balanced_routing:  # every peer has t tokens, so its counts are this rank's
            sent = balanced_counts(t, self.top_k, self.num_experts)
            mine = sent[self.ep_rank * self.local : (self.ep_rank + 1) * self.local]
            return sent, mine * self.ep
        counts = torch.bincount(chosen.reshape(-1), minlength=self.num_experts)
        if self.ep == 1:
            sent = counts.tolist()
            return sent, sent
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.ep_group)
        return counts.tolist(), received.tolist()

    def _run_experts(self, rows: torch.Tensor, received: list[int]) -> torch.Tensor:
        """Each local expert on its rows from every EP peer; ``rows`` holds, per peer j and local
        expert l, ``received[j·local + l]`` rows, and the output keeps that order."""
        ep, local = self.ep, self.local
        chunks = list(rows.split(received))
        for lx in range(local):
            mine = [j * local + lx for j in range(ep)]
            out = self.experts(torch.cat([chunks[c] for c in mine]), lx)  # [0, hidden] when none came
            for c, part in zip(mine, out.split([received[c] for c in mine])):
                chunks[c] = part
        return torch.cat(chunks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs, chosen = self.route(tokens, self.etp_rank * tokens.shape[0])
        if self.etp > 1:  # the expert-TP group's tokens (its ranks' parts of the sequence, in order)
            tokens, probs = sp.gather(tokens, self.etp_group), sp.gather(probs, self.etp_group)
            if self.balanced_routing:
                chosen = balanced_choice(tokens.shape[0], self.top_k, self.num_experts, x.device)
            else:
                chosen = sp.all_gather(chosen, self.etp_group)
        k, ep, local = self.top_k, self.ep, self.local
        order = torch.argsort(chosen.reshape(-1), stable=True)  # slots, expert-major
        rows = tokens.index_select(0, order // k)
        sent, received = self._counts(chosen)
        in_splits = [sum(sent[j * local : (j + 1) * local]) for j in range(ep)]
        out_splits = [sum(received[j * local : (j + 1) * local]) for j in range(ep)]
        if ep > 1:
            rows = all_to_all(rows, out_splits, in_splits, self.ep_group)
        rows = self._run_experts(rows, received)
        if ep > 1:
            rows = all_to_all(rows, in_splits, out_splits, self.ep_group)
        weighted = rows.float() * probs.reshape(-1).index_select(0, order).unsqueeze(-1)
        inverse = torch.argsort(order)  # slot order again: token t's k outputs at t·k .. t·k+k-1
        out = weighted.index_select(0, inverse).view(tokens.shape[0], k, -1).sum(1).to(x.dtype)
        if self.etp > 1:  # partial sums over the expert-TP ranks' ffn blocks -> this rank's tokens, summed
            out = sp.reduce_scatter(out, self.etp_group)
        out = out.view(shape)
        return out if self.shared_experts is None else out + self.shared_experts(x)
