"""Qwen3 decoder (dense or MoE) built from megatron-core tensor-parallel layers.

One code path for CPU/gloo and CUDA/NCCL: the layers are allocated on the CPU
(``use_cpu_initialization``), filled from TP-independent seeded full tensors, then moved to
``device``. Nothing here uses Megatron's CUDA RNG tracker or its DDP. With
``sequence_parallel`` the residual stream is ``[s/tp, b, h]`` and the TP layers' weights are
applied through `canzona.model.sequence_parallel` (Megatron's sequence parallelism; its own
mappings are CUDA-only), otherwise activations are ``[b, s, h]`` through megatron-core's layers.

Layout (names and order equal ``canzona.inventory.build_inventory(cfg)``)::

    embedding.word_embeddings            VocabParallelEmbedding             [V/tp, H]
    decoder.layers.i.input_layernorm     RMSNorm (replicated)
        .self_attention.linear_proj      RowParallelLinear (input_is_parallel)
        .self_attention.linear_qkv       ColumnParallelLinear, local rows = whole KV groups,
                                         each [q heads of the group | k head | v head]
        .self_attention.q_layernorm      RMSNorm over head_dim (replicated, partial grads)
        .self_attention.k_layernorm      RMSNorm over head_dim (replicated, partial grads)
        .pre_mlp_layernorm               RMSNorm (replicated)
        .mlp.linear_fc1                  ColumnParallelLinear, rows interleaved gate_i, up_i
        .mlp.linear_fc2                  RowParallelLinear
    decoder.final_layernorm              RMSNorm (replicated)
    output_layer                         ColumnParallelLinear (absent when tied: uses the embedding)

An MoE model (``cfg.moe``) has `canzona.model.moe.MoELayer` as each layer's ``mlp``: its
``router`` (replicated) and this EP rank's experts (``experts.linear_fc1.weight<e>`` /
``linear_fc2.weight<e>`` for its global experts e), whole on every TP rank (expert-TP 1) or
split over the expert-TP group like the dense fc1/fc2 (expert-TP = TP). The
model's params are then the *rank-local* inventory (`rank_index`): the dense params and the
experts of its EP rank, in inventory order; values, full views and loading use each param's
index in the full inventory, so they do not depend on ``ep``.

Gradients of the q/k-norm weights are *partial* on each TP rank (each rank normalises only
its own heads); the model leaves them so, the executor sums them over the TP group
(``ParamSpec.tp_grad_allreduce``).
All other replicated params get identical, complete gradients on every TP rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import warnings
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from canzona.inventory import (
    ModelConfig,
    ParamSpec,
    build_inventory,
    check_experts,
    check_moe_sequence_parallel,
    check_tp,
)
from canzona.layout import check_expert_tp
from canzona.model import fused
from canzona.model import sequence_parallel as sp
from canzona.model.moe import MoELayer

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" x4 on import
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        vocab_parallel_cross_entropy,
    )

NORM_EPS = 1e-6
INIT_STD = 0.02
# Full tensors are generated in row chunks of about this many elements; chunk boundaries depend
# only on the full shape, so the values are TP-independent and a rank materialises at most one
# chunk beyond its shard.
_INIT_CHUNK_ELEMS = 1 << 22


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, computed in fp32, weight initialised to ones; keeps for backward
    what Transformer Engine's fused RMSNorm keeps (`canzona.model.fused`)."""

    def __init__(self, dim: int, eps: float = NORM_EPS, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm over the last dim in fp32 (weight ones, bias zeros, registered in that order, as
    megatron-core's), returned in the input's dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), self.bias.float(), self.eps)
        return out.to(x.dtype)


def make_norm(mcfg: ModelConfig, dim: int, dtype: torch.dtype) -> nn.Module:
    """The spec's normalisation (``cfg.norm``, ``cfg.norm_eps``) over ``dim``."""
    if mcfg.norm == "layernorm":
        return LayerNorm(dim, mcfg.norm_eps, dtype)
    return RMSNorm(dim, mcfg.norm_eps, dtype)


class RotaryTable:
    """The rotary embedding's cos/sin tables (rotate-half convention, as HF Qwen3), one per model:
    made on first use for a sequence length, dtype and device and kept, as megatron-core's
    ``RotaryEmbedding`` (one per GPTModel, its forward behind an ``lru_cache``) -- not
    recomputed for q and k in every layer. A plain object, not a module: nothing is registered."""

    def __init__(self, theta: float, head_dim: int):
        self.theta, self.head_dim = theta, head_dim
        self._tables: dict[tuple[int, torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, s: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (s, dtype, device)
        if key not in self._tables:
            hd = self.head_dim
            with torch.no_grad():
                inv_freq = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
                freqs = torch.outer(torch.arange(s, dtype=torch.float32, device=device), inv_freq)
                emb = torch.cat((freqs, freqs), dim=-1)
                self._tables[key] = (emb.cos().to(dtype), emb.sin().to(dtype))
        return self._tables[key]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, heads, s, head_dim] rotated by position."""
        cos, sin = self.tables(x.shape[-2], x.dtype, x.device)
        hd = x.shape[-1]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Embedding(nn.Module):
    """The vocab-parallel word embedding, plus a learned absolute position embedding (replicated)
    when the spec has one. With sequence parallelism each TP rank adds the positions of its own
    part of the sequence, so the position embedding's gradient is partial per TP rank (the
    inventory marks it ``tp_grad_allreduce``; Megatron adds before scattering: the same sum)."""

    def __init__(self, mcfg: ModelConfig, mp: ModelParallelConfig, sp_group=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.sp_group = sp_group
        self.word_embeddings = VocabParallelEmbedding(
            mcfg.vocab, mcfg.hidden, init_method=_no_init, config=mp, tp_group=_tp_group()
        )
        self.position_embeddings = (nn.Embedding(mcfg.max_positions, mcfg.hidden, dtype=dtype)
                                    if mcfg.position == "learned" else None)
        if sp_group is not None:  # tokens [b, s] -> [s/tp, b, h]
            sp.install(self.word_embeddings, "embedding", sp_group)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.word_embeddings(tokens)
        if self.position_embeddings is None:
            return out
        s = tokens.shape[1]
        if self.sp_group is not None:  # out [s/tp, b, h]: this rank's positions
            part = s // dist.get_world_size(self.sp_group)
            first = dist.get_rank(self.sp_group) * part
            return out + self.position_embeddings.weight[first:first + part].unsqueeze(1)
        return out + self.position_embeddings.weight[:s]


class SelfAttention(nn.Module):
    def __init__(self, mcfg: ModelConfig, mp: ModelParallelConfig, tp: int, dtype: torch.dtype = torch.float32,
                 sp_group=None, rotary: RotaryTable | None = None):
        super().__init__()
        self.sp_group = sp_group
        hd = mcfg.head_dim
        self.head_dim = hd
        self.q_per_group = mcfg.q_per_group
        self.local_groups = mcfg.kv_heads // tp
        # registered in megatron-core's order: linear_proj first (its Attention base class)
        self.linear_proj = RowParallelLinear(
            mcfg.heads * hd, mcfg.hidden, config=mp, init_method=_no_init, bias=False,
            input_is_parallel=True, skip_bias_add=False, tp_group=_tp_group(),
        )
        self.linear_qkv = ColumnParallelLinear(
            mcfg.hidden, (mcfg.heads + 2 * mcfg.kv_heads) * hd, config=mp, init_method=_no_init,
            bias=False, gather_output=False, tp_group=_tp_group(),
        )
        if mcfg.qk_norm:
            self.q_layernorm = make_norm(mcfg, hd, dtype)
            self.k_layernorm = make_norm(mcfg, hd, dtype)
        self.qk_norm = mcfg.qk_norm
        # the model's shared table (`Decoder`), or one of its own when built alone
        self.rotary = (rotary or RotaryTable(mcfg.rope_theta, hd)) if mcfg.position == "rope" else None
        if sp_group is not None:
            sp.install(self.linear_qkv, "column", sp_group)
            sp.install(self.linear_proj, "row", sp_group)

    def split_qkv(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Local fused QKV output [b, s, groups*(qpg+2)*hd] -> q [b, s, groups*qpg, hd], k, v
        [b, s, groups, hd]. Query head h of the rank uses KV head h // qpg."""
        b, s, _ = mixed.shape
        g, qpg, hd = self.local_groups, self.q_per_group, self.head_dim
        mixed = mixed.view(b, s, g, qpg + 2, hd)
        q = mixed[:, :, :, :qpg].reshape(b, s, g * qpg, hd)
        return q, mixed[:, :, :, qpg], mixed[:, :, :, qpg + 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed, _ = self.linear_qkv(x)
        if self.sp_group is not None:  # [s/tp, b, h] was gathered to [s, b, local]: batch first
            mixed = mixed.transpose(0, 1).contiguous()
        b, s, _ = mixed.shape
        q, k, v = self.split_qkv(mixed)
        if self.qk_norm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rotary is not None:
            q, k = self.rotary.apply(q), self.rotary.apply(k)
        k = k.repeat_interleave(self.q_per_group, dim=1)
        v = v.repeat_interleave(self.q_per_group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, s, hd]
        if self.sp_group is not None:  # [s, b, heads*hd], reduce-scattered to [s/tp, b, h]
            out, _ = self.linear_proj(out.permute(2, 0, 1, 3).reshape(s, b, -1))
            return out
        out, _ = self.linear_proj(out.transpose(1, 2).reshape(b, s, -1))
        return out


def activation(mcfg: ModelConfig):
    """The MLP's activation on fc1's output: SwiGLU of the interleaved gate/up rows, or GeLU
    (exact, as Megatron's without its bias-GeLU fusion)."""
    return fused.swiglu if mcfg.gated_mlp else F.gelu


class MLP(nn.Module):
    """A dense MLP of width ``ffn`` (the spec's dense width unless given: a shared expert's)."""

    def __init__(self, mcfg: ModelConfig, mp: ModelParallelConfig, sp_group=None, ffn: int | None = None):
        super().__init__()
        ffn = mcfg.layer_dense_ffn if ffn is None else ffn
        self.act = activation(mcfg)
        self.linear_fc1 = ColumnParallelLinear(
            mcfg.hidden, (2 if mcfg.gated_mlp else 1) * ffn, config=mp, init_method=_no_init, bias=False,
            gather_output=False, tp_group=_tp_group(),
        )
        self.linear_fc2 = RowParallelLinear(
            ffn, mcfg.hidden, config=mp, init_method=_no_init, bias=False,
            input_is_parallel=True, skip_bias_add=False, tp_group=_tp_group(),
        )
        if sp_group is not None:
            sp.install(self.linear_fc1, "column", sp_group)
            sp.install(self.linear_fc2, "row", sp_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.linear_fc1(x)  # gated: local rows interleaved, 2i gate_i, 2i+1 up_i
        out, _ = self.linear_fc2(self.act(h))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, mcfg: ModelConfig, mp: ModelParallelConfig, tp: int, dtype: torch.dtype, sp_group=None,
                 moe: dict | None = None, layer: int = 0, rotary: RotaryTable | None = None):
        super().__init__()
        self.input_layernorm = make_norm(mcfg, mcfg.hidden, dtype)
        self.self_attention = SelfAttention(mcfg, mp, tp, dtype, sp_group, rotary)
        self.pre_mlp_layernorm = make_norm(mcfg, mcfg.hidden, dtype)
        if mcfg.is_moe_layer(layer):
            shared = MLP(mcfg, mp, sp_group, mcfg.shared_expert_ffn) if mcfg.shared_expert_ffn else None
            self.mlp: nn.Module = MoELayer(mcfg, dtype, **moe, shared_experts=shared)  # type: ignore[arg-type]
        else:
            self.mlp = MLP(mcfg, mp, sp_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.mlp(self.pre_mlp_layernorm(x))


# Context managers the recomputed forward runs under besides the original's (`Decoder`): a mode
# torch applies on the thread that runs the forward is not active on the autograd thread that
# recomputes it. The dry run adds its fake-device functions here (`canzona.trial.dryrun.execute`).
RECOMPUTE_MODES: list = []


@contextlib.contextmanager
def _recompute_modes() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for mode in RECOMPUTE_MODES:
            stack.enter_context(mode())
        yield


def _recompute_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``checkpoint``'s context_fn: nothing for the forward, `RECOMPUTE_MODES` for the recompute."""
    return contextlib.nullcontext(), _recompute_modes()


class Decoder(nn.Module):
    """The decoder layers; with ``recompute`` each layer keeps only its input for backward and
    runs its forward again there (Megatron's full, uniform recomputation of one layer at a time).
    The model has no dropout, so the recomputed forward is the same computation, bit for bit."""

    def __init__(self, mcfg: ModelConfig, mp: ModelParallelConfig, tp: int, dtype: torch.dtype,
                 recompute: bool = False, sp_group=None, moe: dict | None = None):
        super().__init__()
        rotary = RotaryTable(mcfg.rope_theta, mcfg.head_dim) if mcfg.position == "rope" else None
        self.layers = nn.ModuleList(DecoderLayer(mcfg, mp, tp, dtype, sp_group, moe, i, rotary)
                                    for i in range(mcfg.num_layers))
        self.final_layernorm = make_norm(mcfg, mcfg.hidden, dtype)
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.recompute and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False, context_fn=_recompute_contexts)
            else:
                x = layer(x)
        return self.final_layernorm(x)


class Qwen3Model(nn.Module):
    """Qwen3 decoder, tensor-parallel over Megatron's TP group (and expert-parallel over its EP
    group for an MoE model).

    ``forward(tokens [b, s], labels [b, s] | None)`` returns the mean cross-entropy over all
    b*s tokens of this rank's micro-batch (identical on all TP ranks), or the vocab-parallel
    logits ``[b, s, vocab/tp]`` when ``labels`` is None. ``sequence_parallel`` (with TP only, as
    in Megatron) splits the residual stream over the sequence (`canzona.model.sequence_parallel`).
    An MoE model (`canzona.model.moe`) holds EP rank ``ep_rank``'s experts of ``ep``, split over
    ``etp`` expert-TP ranks (1: whole; or TP, this rank ``etp_rank``; `check_moe`);
    ``balanced_routing`` is `canzona.model.moe.MoELayer`'s.
    """

    def __init__(self, mcfg: ModelConfig, tp: int, tp_rank: int, dtype: torch.dtype = torch.float32,
                 recompute: bool = False, sequence_parallel: bool = False, *, ep: int = 1, ep_rank: int = 0,
                 etp: int = 1, etp_rank: int = 0, balanced_routing: bool = False):
        super().__init__()
        check_tp(mcfg, tp)
        self.cfg, self.tp, self.tp_rank = mcfg, tp, tp_rank
        self.sequence_parallel = sequence_parallel and tp > 1
        check_moe(mcfg, tp, ep, etp, self.sequence_parallel)
        self.ep, self.ep_rank, self.etp, self.etp_rank = ep, ep_rank, etp, etp_rank
        sp_group = _tp_group() if self.sequence_parallel else None
        self.sp_group = sp_group
        mp = ModelParallelConfig(
            tensor_model_parallel_size=tp,
            use_cpu_initialization=True,
            perform_initialization=False,  # overwritten by TP-independent seeded full tensors
            params_dtype=dtype,
            sequence_parallel=False,
            gradient_accumulation_fusion=False,
        )
        moe = None
        if mcfg.moe:
            ep_group = parallel_state.get_expert_model_parallel_group() if ep > 1 else None
            etp_group = parallel_state.get_expert_tensor_parallel_group() if etp > 1 else None
            moe = dict(ep=ep, ep_rank=ep_rank, ep_group=ep_group, balanced_routing=balanced_routing, etp=etp,
                       etp_rank=etp_rank, etp_group=etp_group)
        self.embedding = Embedding(mcfg, mp, sp_group, dtype)
        self.decoder = Decoder(mcfg, mp, tp, dtype, recompute, sp_group, moe)
        # Tied: no weight of its own; forward passes the embedding's [vocab/tp, hidden] shard.
        self.output_layer = ColumnParallelLinear(
            mcfg.hidden, mcfg.vocab, config=mp, init_method=_no_init, bias=False, gather_output=False,
            skip_weight_param_allocation=mcfg.tied_embeddings, tp_group=_tp_group(),
        )
        if sp_group is not None:
            sp.install(self.output_layer, "column", sp_group)
        self._full_specs = build_inventory(mcfg, sequence_parallel=self.sequence_parallel)
        self._index = rank_index(self._full_specs, ep, ep_rank)
        self._specs = [self._full_specs[i] for i in self._index]
        names = [n for n, _ in self.named_parameters()]
        if names != [s.name for s in self._specs]:
            raise AssertionError(f"parameter names {names} differ from the inventory")
        for (_, p), spec in zip(self.named_parameters(), self._specs):
            want = spec.local_shape(self.tp_split(spec)[0])
            if tuple(p.shape) != want:
                raise AssertionError(f"{spec.name}: local shape {tuple(p.shape)} != {want}")

    def param_specs(self) -> list[ParamSpec]:
        """This rank's inventory, aligned with ``named_parameters()``: ``build_inventory(cfg)``
        for a dense model, its dense params and its EP rank's experts for an MoE one."""
        return list(self._specs)

    def full_index(self) -> list[int]:
        """Each param's index in the full inventory (``build_inventory(cfg)``), aligned with
        ``param_specs()``: the index its seeded values are drawn by (`init_shard`)."""
        return list(self._index)

    def tp_split(self, spec: ParamSpec) -> tuple[int, int]:
        """(ranks, this rank) that split ``spec`` along its ``tp_dim``: TP, or expert-TP for an expert."""
        return (self.etp, self.etp_rank) if spec.expert is not None else (self.tp, self.tp_rank)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        h = self.decoder(self.embedding(tokens))
        weight = self.embedding.word_embeddings.weight if self.cfg.tied_embeddings else None
        logits, _ = self.output_layer(h, weight=weight)
        if self.sp_group is not None:  # [s/tp, b, h] was gathered to [s, b, vocab/tp]: the loss in [s, b]
            if labels is None:
                return logits.transpose(0, 1)
            return vocab_parallel_cross_entropy(logits.float(), labels.t().contiguous()).mean()
        if labels is None:
            return logits
        # vocab_parallel_cross_entropy subtracts the max from fp32 logits in place; fine here.
        return vocab_parallel_cross_entropy(logits.float(), labels).mean()


def check_moe(mcfg: ModelConfig, tp: int, ep: int, etp: int, sequence_parallel: bool) -> None:
    """Raise a one-line ConfigError unless the model can be built with these expert sizes: EP and
    expert-TP must split the experts (`check_experts`), expert-TP is 1 or TP (`check_expert_tp`),
    and with TP an MoE model needs sequence parallelism (`check_moe_sequence_parallel`)."""
    check_experts(mcfg, ep, etp)
    if not mcfg.moe:
        return
    check_moe_sequence_parallel(mcfg, tp, sequence_parallel)
    check_expert_tp(tp, etp)


def rank_index(specs: list[ParamSpec], ep: int, ep_rank: int) -> list[int]:
    """Indices into the full inventory ``specs`` of the params EP rank ``ep_rank`` holds, in
    order: every non-expert param and experts ``ep_rank·E/ep .. (ep_rank+1)·E/ep - 1`` of every
    layer (the split `canzona.plan.experts.local_experts` plans; not imported from there, which
    would load the whole planner with the model)."""
    experts = [s.expert for s in specs if s.expert is not None]
    per_rank = (max(experts) + 1) // ep if experts else 1
    return [i for i, s in enumerate(specs) if s.expert is None or s.expert // per_rank == ep_rank]


def build_model(mcfg: ModelConfig, *, device: torch.device | str = "cpu", seed: int = 0,
                dtype: torch.dtype = torch.float32, init: bool = True, recompute: bool = False,
                sequence_parallel: bool = False, balanced_routing: bool = False) -> Qwen3Model:
    """Build this rank's shard of the model with parameters (and so activations) in ``dtype``;
    Megatron's TP (and, for an MoE model, expert) groups must already exist
    (``canzona.model.parallel.init_parallel``). Values are TP- and EP-independent
    (``init_shard`` by each param's full-inventory index, rounded to ``dtype``). ``init=False``
    leaves them as the layers made them: for fake tensors (the dry run), whose values do not
    exist, drawing them is wasted time. ``recompute``: recompute each decoder layer's
    activations in backward (`Decoder`); ``sequence_parallel``: Megatron's sequence parallelism
    (with TP; `Qwen3Model`); ``balanced_routing``: MoE split sizes independent of the data
    (`canzona.model.moe.MoELayer`)."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    experts = dict(ep=1, ep_rank=0, etp=1, etp_rank=0)
    if mcfg.moe:  # a dense model ignores the expert grid (Megatron's default etp is tp)
        experts = dict(ep=parallel_state.get_expert_model_parallel_world_size(),
                       ep_rank=parallel_state.get_expert_model_parallel_rank(),
                       etp=parallel_state.get_expert_tensor_parallel_world_size(),
                       etp_rank=parallel_state.get_expert_tensor_parallel_rank())
    model = Qwen3Model(mcfg, tp, tp_rank, dtype, recompute, sequence_parallel, **experts,
                       balanced_routing=balanced_routing)
    if not init:
        return _move_params(model, torch.device(device))
    with torch.no_grad():
        for idx, (_, p), spec in zip(model.full_index(), model.named_parameters(), model.param_specs()):
            split, rank = model.tp_split(spec)
            p.copy_(init_shard(spec, idx, seed=seed, num_layers=mcfg.num_layers, tp=split, tp_rank=rank))
    return _move_params(model, torch.device(device))


def _move_params(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to(device)`` by putting a new Parameter on ``device`` in place of each (Megatron's
    attributes carried over). ``Module.to`` swaps fake tensors in place instead
    (``torch.utils.swap_tensors``), which fails for the parameters a ``FakeTensorMode`` made:
    the dry run (`canzona.trial.dryrun`) builds full-size models so."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.device != device:
                moved = nn.Parameter(p.detach().to(device), requires_grad=p.requires_grad)
                for key, value in vars(p).items():  # a fake tensor's own fields (its device) stay
                    vars(moved).setdefault(key, value)
                module._parameters[name] = moved
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = b.to(device)
    return model


def _chunk_seed(seed: int, idx: int, chunk: int) -> int:
    digest = hashlib.sha256(f"canzona-init/{seed}/{idx}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _init_std(spec: ParamSpec, num_layers: int) -> float:
    # Megatron's scaled init for the residual output projections (an expert's fc2 too).
    if re.search(r"\.linear_(proj|fc2)\.weight\d*$", spec.name):
        return INIT_STD / math.sqrt(2.0 * num_layers)
    return INIT_STD


def init_shard(spec: ParamSpec, idx: int, *, seed: int, num_layers: int, tp: int = 1, tp_rank: int = 0) -> torch.Tensor:
    """This rank's shard of the seeded full tensor of param ``idx`` of the inventory (CPU, fp32).

    Norm weights are ones, LayerNorm biases zeros. Matrices are N(0, std²) (std 0.02; linear_proj/fc2, experts' fc2
    too, scaled by 1/sqrt(2·layers)), generated in row chunks, chunk c from a generator seeded by
    sha256(seed, idx, c): the full tensor does not depend on ``tp``.
    """
    if len(spec.shape) == 1:  # a norm's weight is ones, a LayerNorm's bias zeros
        return (torch.zeros if spec.name.endswith(".bias") else torch.ones)(spec.local_shape(tp))
    rows, cols = spec.shape
    std = _init_std(spec, num_layers)
    chunk_rows = max(1, _INIT_CHUNK_ELEMS // cols)
    lo, hi = 0, rows
    if spec.tp_dim == 0:
        lo, hi = tp_rank * rows // tp, (tp_rank + 1) * rows // tp
    parts = []
    for c in range(lo // chunk_rows, (hi - 1) // chunk_rows + 1):
        r0, r1 = c * chunk_rows, min(rows, (c + 1) * chunk_rows)
        g = torch.Generator().manual_seed(_chunk_seed(seed, idx, c))
        block = torch.randn(r1 - r0, cols, generator=g) * std
        block = block[max(lo, r0) - r0 : min(hi, r1) - r0]
        if spec.tp_dim == 1:
            w = cols // tp
            block = block[:, tp_rank * w : (tp_rank + 1) * w]
        parts.append(block)
    return torch.cat(parts).contiguous()


# ---------------------------------------------------------------------------------------------
# Full (unsharded) views, for a trial's saved parameters (``save_params``) and the parity tests. They
# all-gather over the TP group, and an MoE model's experts over the expert-TP group, then the EP
# group, so a full dict has every param of the full inventory.


def _gather_cat(local: torch.Tensor, spec: ParamSpec, tp: int, group) -> torch.Tensor:
    """``local`` of every rank of ``group`` (``tp`` ranks) concatenated along ``spec.tp_dim``, on its device."""
    if spec.tp_dim is None or tp == 1:
        return local.detach().clone()
    parts = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(parts, local.detach().contiguous(), group=group)
    return torch.cat(parts, dim=spec.tp_dim)


def _gather_full(local: torch.Tensor, spec: ParamSpec, tp: int, group) -> torch.Tensor:
    return _gather_cat(local, spec, tp, group).cpu()


def _gather_experts(model: Qwen3Model, local: torch.Tensor, spec: ParamSpec) -> dict[str, torch.Tensor]:
    """Expert ``spec``'s full tensor (gathered over expert-TP) from every EP rank: EP rank j holds,
    at the same place, the expert ``j·E/ep`` further on than this rank's first, so its name
    differs only in the index."""
    per_rank = model.cfg.num_experts // model.ep
    first = spec.expert - model.ep_rank * per_rank
    etp_group = parallel_state.get_expert_tensor_parallel_group() if model.etp > 1 else None
    parts = [_gather_cat(local, spec, model.etp, etp_group)]
    if model.ep > 1:
        whole = parts[0]
        parts = [torch.empty_like(whole) for _ in range(model.ep)]
        dist.all_gather(parts, whole, group=parallel_state.get_expert_model_parallel_group())
    stem = spec.name[: -len(str(spec.expert))]
    return {f"{stem}{first + j * per_rank}": t.cpu() for j, t in enumerate(parts)}


def full_views(model: Qwen3Model, local: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """name -> full tensor of ``local`` (aligned with ``param_specs()``), in full-inventory order."""
    group = parallel_state.get_tensor_model_parallel_group()
    out: dict[str, torch.Tensor] = {}
    for t, s in zip(local, model.param_specs()):
        if s.expert is None:
            out[s.name] = _gather_full(t, s, model.tp, group)
        else:
            out.update(_gather_experts(model, t, s))
    return {s.name: out[s.name] for s in build_inventory(model.cfg)}


def full_state_dict(model: Qwen3Model) -> dict[str, torch.Tensor]:
    """name -> full tensor (CPU), gathered over the TP group along each param's ``tp_dim`` and,
    for experts, over the EP group. Collective: every rank of those groups must call it."""
    return full_views(model, [p.data for p in model.parameters()])


def _tp_group():
    return parallel_state.get_tensor_model_parallel_group()


def _no_init(weight: torch.Tensor) -> None:  # megatron requires an init_method; we never use it
    return None
