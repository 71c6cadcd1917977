"""The model's side of an iteration: forward flops and the backward walk that fills buckets.

Flops per rank (`forward_flops`): ``2·T·(local weight elements of the matmuls)`` forward, T =
micro_batch·seq_len tokens, plus attention; backward twice that. Seconds come from the hardware's
`PassTiming` (fixed + per layer + flops / rate). With TP, Megatron's activation all-reduces of
b·s·hidden (2 per layer and 1 for the embedding forward, 2 per layer and 1 for the output layer
backward, 3 small ones in the vocab-parallel cross-entropy, 2 q/k-norm grad all-reduces per
layer in the hooks) sit on the critical path. With ``parallel.sequence_parallel`` each of those
activation all-reduces is Megatron's sequence-parallel pair instead: forward, an all-gather of
b·s·hidden entering each column-parallel linear (qkv, fc1, output layer) and a reduce-scatter
leaving each row-parallel one (proj, fc2) and the embedding; backward, each column-parallel
linear gathers its input again (for the weight gradient) and reduce-scatters its input
gradient, each row-parallel linear all-gathers its output gradient, the embedding's gradient is
all-gathered; the norms' partial gradients are all-reduced over TP in the hooks. All of it is
counted on the critical path (Megatron overlaps the backward's re-gather and reduce-scatter in
part with the weight-gradient GEMM: an upper bound). The backward is walked in reverse
forward order (`canzona.program.lower.forward_positions`) so the simulator knows when each gradient lands in its bucket; with
``train.recompute=full`` each layer's forward (its TP collectives included) runs again before
its gradients.

An MoE layer (every Qwen3 MoE layer) replaces the MLP by the router and the rank's experts, priced
with *balanced routing* (every expert the same share of the tokens, as the dry run builds it):
each rank routes its T/tp tokens (sequence parallelism, which Megatron's MoE needs at TP > 1)
to k experts, so its experts run 2·(T/tp)·k·3·hidden·ffn flops forward whatever the EP size
(at expert-TP = TP the tokens are gathered over it and each expert is split as finely); the
router 2·(T/tp)·experts·hidden. The dispatch and the combine are one all-to-all each over the EP
group, forward and again backward, of the (T/tp)·k·hidden activations less the share kept
locally (1/ep), blocking (Megatron's dispatcher waits for the counts and the tokens); at
expert-TP > 1 the tokens also travel an all-gather and a reduce-scatter over the expert-TP
group. The backward walk then covers the rank's own parameters (`canzona.plan.experts.RankSpace`:
its experts after the dense params), whose gradients land in the expert buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.config import TrialConfig
from canzona.hardware import Hardware
from canzona.inventory import ModelConfig, build_inventory
from canzona.plan.experts import RankSpace, rank_space
from canzona.plan.types import Plan
from canzona.program.lower import forward_positions

BYTES = 4  # the executor's grad and param buffers are fp32
HOOK_COPY_FACTOR = 1.5  # grad_view.add_(grad): read two, write one (in units of one copy)
# the layer's projection whose backward also carries the attention core and the column-parallel
# input gradient: the fused QKV, or multi-head latent attention's key/value up projection
ATTENTION_INPUTS = ("linear_qkv.weight", "linear_kv_up_proj.weight")


@dataclass(frozen=True)
class ModelWork:
    forward_s: float
    # backward units in execution order: (seconds of host time, inventory indices ready after,
    # the part of those seconds spent in blocking TP collectives)
    backward_units: tuple[tuple[float, tuple[int, ...], float], ...]
    # forward units in execution order: (inventory indices first used, seconds of host time,
    # seconds of the unit's blocking TP all-reduces); their host seconds add up to forward_s
    forward_units: tuple[tuple[tuple[int, ...], float, float], ...]
    forward_flops: float
    tokens: int


def forward_flops(mcfg: ModelConfig, tp: int, micro_batch: int, seq_len: int) -> float:
    """Forward flops per rank: ``2·T·(local weight elements of the matmuls)``, T = micro_batch·seq_len
    tokens, the output layer (tied: the embedding) counted and the embedding lookup not; plus
    attention ``4·L·(heads·head_dim/tp)·seq·T`` (QKᵀ and AV, the non-causal count of the usual
    MFU formula; `attention_flops`); each MoE layer's router and experts as `moe_layer_flops` (a
    shared expert and the dense layers by their own weights). Backward is twice this."""
    tokens = micro_batch * seq_len
    params = build_inventory(mcfg)
    dense = [p for p in params if len(p.shape) == 2 and not p.name.startswith("embedding.") and not _moe_param(p)]
    elems = sum(p.local_numel(tp) for p in dense)
    if mcfg.tied_embeddings:
        elems += mcfg.vocab * mcfg.hidden / tp
    moe = mcfg.moe_layers * moe_layer_flops(mcfg, tp, tokens) if mcfg.moe else 0.0
    return 2.0 * tokens * elems + mcfg.num_layers * attention_flops(mcfg, tp, seq_len, tokens) + moe


def attention_flops(mcfg: ModelConfig, tp: int, seq_len: int, tokens: int) -> float:
    """One layer's attention core on one rank: QKᵀ and AV, ``4·(heads/tp)·width·seq·T`` with the
    heads' mean product width (`ModelConfig.attention_width`: head_dim with GQA)."""
    return 4.0 * (mcfg.heads * mcfg.attention_width / tp) * seq_len * tokens


def _moe_param(p) -> bool:
    """An MoE layer's router or expert (priced by `moe_layer_flops`, not by its own shape)."""
    return p.expert is not None or p.name.endswith("mlp.router.weight")


def moe_layer_flops(mcfg: ModelConfig, tp: int, tokens: int) -> float:
    """Forward flops of one MoE layer on one rank under balanced routing: its T/tp tokens through
    the router and, k per token, through experts of 3·hidden·ffn weights (2·hidden·ffn without a
    gate; module docstring)."""
    routed = tokens / tp
    return 2.0 * routed * (mcfg.top_k * mcfg.mlp_matrices * mcfg.hidden * mcfg.ffn + mcfg.num_experts * mcfg.hidden)


def moe_comm_seconds(cfg: TrialConfig, hw: Hardware, ep_ranks: Sequence[int], etp_ranks: Sequence[int]) -> float:
    """One MoE layer's token traffic in one direction (forward, or again backward): the dispatch
    and the combine all-to-alls over the EP group, and at expert-TP > 1 the all-gather and the
    reduce-scatter of the tokens over the expert-TP group."""
    mcfg = cfg.model_cfg()
    tp, ep = cfg.parallel.tp, len(ep_ranks)
    slots_bytes = cfg.train.micro_batch * cfg.train.seq_len / tp * mcfg.top_k * mcfg.hidden * hw.activation_bytes
    out = 2 * hw.collective("all_to_all", slots_bytes * (ep - 1) / ep, ep_ranks) if ep > 1 else 0.0
    if len(etp_ranks) > 1:
        out += (hw.collective("all_gather", slots_bytes * len(etp_ranks), etp_ranks)
                + hw.collective("reduce_scatter", slots_bytes * len(etp_ranks), etp_ranks))
    return out


def model_work(cfg: TrialConfig, plan: Plan, hw: Hardware, tp_ranks: Sequence[int],
               ep_ranks: Sequence[int] = (), etp_ranks: Sequence[int] = ()) -> ModelWork:
    """Forward seconds and the backward walk per rank (all ranks do the same model work: an MoE
    model's EP ranks hold experts of the same shapes, so rank 0's params stand for every rank's,
    `canzona.plan.experts.RankSpace`); flops from `forward_flops`; ``ep_ranks`` / ``etp_ranks``:
    an EP and an expert-TP group (MoE)."""
    mcfg = cfg.model_cfg()
    space: RankSpace = rank_space(plan, 0)
    tp, params = plan.tp, space.params
    b, s = cfg.train.micro_batch, cfg.train.seq_len
    tokens = b * s
    L = mcfg.num_layers
    attn_layer = attention_flops(mcfg, tp, s, tokens)
    head_elems = mcfg.vocab * mcfg.hidden / tp

    def is_matmul(i: int) -> bool:
        p = params[i]
        return len(p.shape) == 2 and not p.name.startswith("embedding.") and not _moe_param(p)

    moe_comm = moe_comm_seconds(cfg, hw, ep_ranks, etp_ranks) if mcfg.moe else 0.0
    moe_flops = moe_layer_flops(mcfg, tp, tokens) if mcfg.moe else 0.0

    fwd_flops = forward_flops(mcfg, tp, b, s)
    forward_s = hw.model_pass("forward", plan.execution.dtype).seconds(fwd_flops, L)
    bw = hw.model_pass("backward", plan.execution.dtype)

    act = tokens * mcfg.hidden * hw.activation_bytes
    ar_act = hw.collective("all_reduce", act, tp_ranks) if tp > 1 else 0.0
    ar_small = hw.collective("all_reduce", tokens * BYTES, tp_ranks) if tp > 1 else 0.0
    if cfg.sequence_parallel:  # tp > 1
        ag, rs = hw.collective("all_gather", act, tp_ranks), hw.collective("reduce_scatter", act, tp_ranks)
        # where plain TP all-reduces. Forward: (embedding, layer, head); backward: (head, qkv,
        # proj, fc1, fc2, embedding)
        # (an MoE layer has no MLP collectives of its own: the experts' traffic is ``moe_comm``)
        fwd_tp = (rs, (2 * (ag + rs), ag + rs), ag + 3 * ar_small)
        bwd_tp = (ag + rs, ag + rs, ag, ag + rs, ag, ag)
    else:
        fwd_tp = (ar_act, (2 * ar_act, 2 * ar_act), 3 * ar_small)
        bwd_tp = (ar_act, ar_act, 0.0, ar_act, 0.0, 0.0)
    bwd_head, bwd_qkv, bwd_proj, bwd_fc1, bwd_fc2, bwd_emb = bwd_tp

    def partial(i: int) -> float:
        """A replicated param's partial gradient (q/k norms; every norm with sequence
        parallelism) summed over TP in its hook."""
        n = params[i].local_numel(space.split_over(i, tp))
        return hw.collective("all_reduce", n * BYTES, tp_ranks) if params[i].tp_grad_allreduce and tp > 1 else 0.0

    def hook(i: int) -> float:
        """The gradient hook: the add into the fp32 buffer, then `partial`."""
        n = params[i].local_numel(space.split_over(i, tp))
        return hw.grad_add(n, plan.execution.dtype, HOOK_COPY_FACTOR) + partial(i)

    units: list[tuple[float, tuple[int, ...], float]] = []
    by_layer: dict[int | None, list[int]] = {}
    for i, p in enumerate(params):
        by_layer.setdefault(p.layer, []).append(i)
    # Megatron's forward all-reduces (fwd_tp above): the vocab-parallel embedding's, two per layer
    # (attention and MLP outputs), the cross-entropy's three small ones in the head
    fwd_units = _forward_units(by_layer, params, forward_s, tp, tokens, attn_layer, fwd_flops, fwd_tp,
                               moe_flops, moe_comm)
    # train.recompute=full: each layer's forward (with its TP all-reduces) runs again in backward,
    # just before that layer's gradients
    recompute = [sec + tp_s for _, sec, tp_s in fwd_units[1:-1]] if cfg.train.recompute == "full" else [0.0] * L
    recompute_tp = [tp_s for _, _, tp_s in fwd_units[1:-1]] if cfg.train.recompute == "full" else [0.0] * L
    top = [i for i in by_layer.get(None, []) if not params[i].name.startswith("embedding.")]
    emb = [i for i in by_layer.get(None, []) if params[i].name.startswith("embedding.")]
    # loss + output layer (dgrad and wgrad, then its input-grad all-reduce), final norm
    head_s = bw.fixed_s + 4.0 * tokens * head_elems / bw.flops_per_s + bwd_head
    head_comm = bwd_head
    for i in sorted(top, reverse=True):
        units.append((head_s + hook(i), (i,), head_comm + partial(i)))
        head_s, head_comm = 0.0, 0.0
    if head_s:
        units.append((head_s, (), head_comm))
    pos = forward_positions(params)
    for layer in range(L - 1, -1, -1):
        # reverse forward order (registration order but for linear_proj, registered before
        # linear_qkv and run after it); an MoE layer's experts (last in the rank's space) come first
        members = sorted(by_layer[layer], key=lambda i: pos[i], reverse=True)
        moe_members = [i for i in members if _moe_param(params[i])]
        moe_set = set(moe_members)
        moe_numel = sum(params[i].numel for i in moe_members) or 1
        for k, i in enumerate(members):
            p = params[i]
            sec = bw.layer_s / len(members) + hook(i) + (recompute[layer] if k == 0 else 0.0)
            comm = partial(i) + (recompute_tp[layer] if k == 0 else 0.0)
            if is_matmul(i):
                sec += 4.0 * tokens * p.local_numel(tp) / bw.flops_per_s
            elif i in moe_set:  # the layer's expert backward, by weight share
                sec += 2.0 * moe_flops * p.numel / moe_numel / bw.flops_per_s
                if i == moe_members[0]:
                    sec += moe_comm  # the dispatch and combine again, backward
                    comm += moe_comm
            tp_comm = 0.0  # the TP collective of the input gradient, if any
            if p.name.endswith(ATTENTION_INPUTS):
                sec += 2.0 * attn_layer / bw.flops_per_s + bwd_qkv  # attention core; qkv input grad
                tp_comm = bwd_qkv
            elif p.name.endswith("linear_fc1.weight"):
                sec += bwd_fc1  # fc1 input grad
                tp_comm = bwd_fc1
            elif p.name.endswith("linear_proj.weight"):
                sec += bwd_proj
                tp_comm = bwd_proj
            elif p.name.endswith("linear_fc2.weight"):
                sec += bwd_fc2
                tp_comm = bwd_fc2
            units.append((sec, (i,), comm + tp_comm))
    for i in emb:
        units.append((hw.copy(BYTES * tokens * mcfg.hidden) + bwd_emb + hook(i), (i,), bwd_emb + partial(i)))
    return ModelWork(forward_s, tuple(units), fwd_units, fwd_flops, tokens)


def _forward_units(by_layer, params, forward_s: float, tp: int, tokens: int, attn_layer: float,
                   fwd_flops: float, tp_s: tuple[float, tuple[float, float], float], moe_flops: float = 0.0,
                   moe_comm: float = 0.0) -> tuple[tuple[tuple[int, ...], float, float], ...]:
    """The forward split in registration order: the embedding, each layer, the head; each unit's
    share of ``forward_s`` is its share of the forward flops (the fixed and per-layer overheads
    spread the same way), an MoE layer's plus its token traffic (``moe_comm``, blocking); ``tp_s``:
    the TP collectives' seconds of the embedding, a (dense, MoE) layer, the head."""
    def flops(i: int) -> float:
        p = params[i]
        if _moe_param(p):
            return 0.0  # the layer's router and experts: ``moe_flops`` once per layer
        return 2.0 * tokens * p.local_numel(tp) if len(p.shape) == 2 and not p.name.startswith("embedding.") else 0.0

    def moe(k: int) -> float:
        return moe_flops if any(_moe_param(params[i]) for i in by_layer[k]) else 0.0

    top = by_layer.get(None, [])
    emb = tuple(i for i in top if params[i].name.startswith("embedding."))
    head = tuple(i for i in top if not params[i].name.startswith("embedding."))
    groups = [(emb, 0.0)]
    layers = sorted(k for k in by_layer if k is not None)
    groups += [(tuple(by_layer[k]), sum(flops(i) for i in by_layer[k]) + attn_layer + moe(k)) for k in layers]
    groups.append((head, max(0.0, fwd_flops - sum(f for _, f in groups))))
    total = sum(f for _, f in groups) or 1.0
    emb_tp, (dense_tp, moe_tp), head_tp = tp_s
    tps = [emb_tp] + [moe_tp if moe(k) else dense_tp for k in layers] + [head_tp]
    comm = [0.0] + [moe_comm if moe(k) else 0.0 for k in layers] + [0.0]
    return tuple((items, forward_s * f / total + c, t) for (items, f), t, c in zip(groups, tps, comm))
