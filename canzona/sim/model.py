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
registration order so the simulator knows when each gradient lands in its bucket; with
``train.recompute=full`` each layer's forward (its TP collectives included) runs again before
its gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.config import TrialConfig
from canzona.inventory import ModelConfig, build_inventory
from canzona.plan.types import Plan
from canzona.sim.hardware import Hardware

BYTES = 4  # the executor's grad and param buffers are fp32
HOOK_COPY_FACTOR = 1.5  # grad_view.add_(grad): read two, write one (in units of one copy)


@dataclass(frozen=True)
class ModelWork:
    forward_s: float
    # backward units in execution order: (seconds of host time, inventory indices ready after)
    backward_units: tuple[tuple[float, tuple[int, ...]], ...]
    # forward units in execution order: (inventory indices first used, seconds of host time,
    # seconds of the unit's blocking TP all-reduces); their host seconds add up to forward_s
    forward_units: tuple[tuple[tuple[int, ...], float, float], ...]
    forward_flops: float
    tokens: int

    @property
    def tp_forward_s(self) -> float:
        """Seconds of the forward's TP all-reduces (0 without TP)."""
        return sum(t for _, _, t in self.forward_units)


def forward_flops(mcfg: ModelConfig, tp: int, micro_batch: int, seq_len: int) -> float:
    """Forward flops per rank: ``2·T·(local weight elements of the matmuls)``, T = micro_batch·seq_len
    tokens, the output layer (tied: the embedding) counted and the embedding lookup not; plus
    attention ``4·L·(heads·head_dim/tp)·seq·T`` (QKᵀ and AV, the non-causal count of the usual
    MFU formula). Backward is twice this."""
    tokens = micro_batch * seq_len
    params = build_inventory(mcfg)
    elems = sum(p.local_numel(tp) for p in params if len(p.shape) == 2 and not p.name.startswith("embedding."))
    if mcfg.tied_embeddings:
        elems += mcfg.vocab * mcfg.hidden / tp
    return 2.0 * tokens * elems + mcfg.num_layers * 4.0 * (mcfg.heads * mcfg.head_dim / tp) * seq_len * tokens


def model_work(cfg: TrialConfig, plan: Plan, hw: Hardware, tp_ranks: Sequence[int]) -> ModelWork:
    """Forward seconds and the backward walk per rank (all ranks do the same model work);
    flops from `forward_flops`."""
    mcfg = cfg.model_cfg()
    tp, params = plan.tp, plan.params
    b, s = cfg.train.micro_batch, cfg.train.seq_len
    tokens = b * s
    L = mcfg.num_layers
    attn_layer = 4.0 * (mcfg.heads * mcfg.head_dim / tp) * s * tokens
    head_elems = mcfg.vocab * mcfg.hidden / tp

    def is_matmul(i: int) -> bool:
        p = params[i]
        return len(p.shape) == 2 and not p.name.startswith("embedding.")

    fwd_flops = forward_flops(mcfg, tp, b, s)
    forward_s = hw.forward.seconds(fwd_flops, L)
    bw = hw.backward

    act = tokens * mcfg.hidden * hw.activation_bytes
    ar_act = hw.collective("all_reduce", act, tp_ranks) if tp > 1 else 0.0
    ar_small = hw.collective("all_reduce", tokens * BYTES, tp_ranks) if tp > 1 else 0.0
    if cfg.sequence_parallel:  # tp > 1
        ag, rs = hw.collective("all_gather", act, tp_ranks), hw.collective("reduce_scatter", act, tp_ranks)
        # where plain TP all-reduces. Forward: (embedding, layer, head); backward: (head, qkv,
        # proj, fc1, fc2, embedding)
        fwd_tp = (rs, 2 * (ag + rs), ag + 3 * ar_small)
        bwd_tp = (ag + rs, ag + rs, ag, ag + rs, ag, ag)
    else:
        fwd_tp = (ar_act, 2 * ar_act, 3 * ar_small)
        bwd_tp = (ar_act, ar_act, 0.0, ar_act, 0.0, 0.0)
    bwd_head, bwd_qkv, bwd_proj, bwd_fc1, bwd_fc2, bwd_emb = bwd_tp

    def hook(i: int) -> float:
        """The gradient hook: the copy into the buffer, and a replicated param's partial gradient
        (q/k norms; every norm with sequence parallelism) summed over TP first."""
        n = params[i].local_numel(tp)
        partial = hw.collective("all_reduce", n * BYTES, tp_ranks) if params[i].tp_grad_allreduce and tp > 1 else 0.0
        return hw.copy(HOOK_COPY_FACTOR * BYTES * n) + partial

    units: list[tuple[float, tuple[int, ...]]] = []
    by_layer: dict[int | None, list[int]] = {}
    for i, p in enumerate(params):
        by_layer.setdefault(p.layer, []).append(i)
    # Megatron's forward all-reduces (fwd_tp above): the vocab-parallel embedding's, two per layer
    # (attention and MLP outputs), the cross-entropy's three small ones in the head
    fwd_units = _forward_units(by_layer, params, forward_s, tp, tokens, attn_layer, fwd_flops, fwd_tp)
    # train.recompute=full: each layer's forward (with its TP all-reduces) runs again in backward,
    # just before that layer's gradients
    recompute = [sec + tp_s for _, sec, tp_s in fwd_units[1:-1]] if cfg.train.recompute == "full" else [0.0] * L
    top = [i for i in by_layer.get(None, []) if not params[i].name.startswith("embedding.")]
    emb = [i for i in by_layer.get(None, []) if params[i].name.startswith("embedding.")]
    # loss + output layer (dgrad and wgrad, then its input-grad all-reduce), final norm
    head_s = bw.fixed_s + 4.0 * tokens * head_elems / bw.flops_per_s + bwd_head
    for i in sorted(top, reverse=True):
        units.append((head_s + hook(i), (i,)))
        head_s = 0.0
    if head_s:
        units.append((head_s, ()))
    for layer in range(L - 1, -1, -1):
        members = sorted(by_layer[layer], reverse=True)
        for k, i in enumerate(members):
            p = params[i]
            sec = bw.layer_s / len(members) + hook(i) + (recompute[layer] if k == 0 else 0.0)
            if is_matmul(i):
                sec += 4.0 * tokens * p.local_numel(tp) / bw.flops_per_s
            if p.name.endswith("linear_qkv.weight"):
                sec += 2.0 * attn_layer / bw.flops_per_s + bwd_qkv  # attention core; qkv input grad
            elif p.name.endswith("linear_fc1.weight"):
                sec += bwd_fc1  # fc1 input grad
            elif p.name.endswith("linear_proj.weight"):
                sec += bwd_proj
            elif p.name.endswith("linear_fc2.weight"):
                sec += bwd_fc2
            units.append((sec, (i,)))
    for i in emb:
        units.append((hw.copy(BYTES * tokens * mcfg.hidden) + bwd_emb + hook(i), (i,)))
    return ModelWork(forward_s, tuple(units), fwd_units, fwd_flops, tokens)


def _forward_units(by_layer, params, forward_s: float, tp: int, tokens: int, attn_layer: float,
                   fwd_flops: float, tp_s: tuple[float, float, float]) -> tuple[tuple[tuple[int, ...], float, float], ...]:
    """The forward split in registration order: the embedding, each layer, the head; each unit's
    share of ``forward_s`` is its share of the forward flops (the fixed and per-layer overheads
    spread the same way); ``tp_s``: the TP all-reduce seconds of the embedding, a layer, the head."""
    def flops(i: int) -> float:
        p = params[i]
        return 2.0 * tokens * p.local_numel(tp) if len(p.shape) == 2 and not p.name.startswith("embedding.") else 0.0

    top = by_layer.get(None, [])
    emb = tuple(i for i in top if params[i].name.startswith("embedding."))
    head = tuple(i for i in top if not params[i].name.startswith("embedding."))
    groups = [(emb, 0.0)]
    layers = sorted(k for k in by_layer if k is not None)
    groups += [(tuple(by_layer[k]), sum(flops(i) for i in by_layer[k]) + attn_layer) for k in layers]
    groups.append((head, max(0.0, fwd_flops - sum(f for _, f in groups))))
    total = sum(f for _, f in groups) or 1.0
    emb_tp, layer_tp, head_tp = tp_s
    tps = [emb_tp] + [layer_tp] * len(layers) + [head_tp]
    return tuple((items, forward_s * f / total, t) for (items, f), t in zip(groups, tps))
