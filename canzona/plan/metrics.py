"""Plan metrics: per-rank load, imbalance, and communication volume (pure).

Imbalance (DESIGN.md §2) = max rank load ÷ (work counted once ÷ ranks). Redundant work counts
against a method: `sync` on T TP ranks has compute imbalance ≈ T·P even though all ranks are
equally busy, because the ideal divides the work once over all P·T ranks.

Who computes what, per param and rank (d, t), for a param of full cost c and numel n:
- matrix update (matrix rule on): the DP owner(s) -- one rank, or every DP rank when
  dp_owner is None; on the TP axis the TP owner if any, else every TP rank, each the full c.
- elementwise update: on the DP axis the owner, or (adamw's equal shards) each rank the
  fraction of the param inside its shard; on the TP axis each rank its 1/T shard of a
  TP-sharded param, or the whole of a replicated one (norms: computed on every TP rank).
Optimizer state follows the same split (memory imbalance uses numel the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from canzona.plan.types import Plan

BYTES_PER_ELEMENT = 4  # fp32 gradients and main params


@dataclass(frozen=True)
class PlanMetrics:
    compute: np.ndarray  # [dp, tp] load in cost units
    numel: np.ndarray  # [dp, tp] optimizer-state elements held
    compute_imbalance: float
    memory_imbalance: float
    lower_bound: float
    send_bytes: np.ndarray  # [dp, tp] per step
    recv_bytes: np.ndarray
    collectives: int  # collectives each rank issues per step

    def ranks(self) -> list[dict[str, float | int]]:
        dp, tp = self.compute.shape
        return [
            {
                "dp_rank": d,
                "tp_rank": t,
                "compute": float(self.compute[d, t]),
                "numel": int(self.numel[d, t]),
                "send_bytes": int(self.send_bytes[d, t]),
                "recv_bytes": int(self.recv_bytes[d, t]),
            }
            for d in range(dp)
            for t in range(tp)
        ]

    def imbalance(self) -> dict[str, float]:
        return {"compute": self.compute_imbalance, "memory": self.memory_imbalance, "lower_bound": self.lower_bound}


def _dp_fractions(plan: Plan, index: int) -> np.ndarray:
    """Share of param `index`'s update each DP rank computes (sums to 1, or to P if redundant)."""
    dp = plan.dp
    owner = plan.dp_owner[index]
    if owner is not None:
        out = np.zeros(dp)
        out[owner] = 1.0
        return out
    if plan.shard_ranges is None or plan.uses_matrix_rule(index) or plan.every_rank_updates_all:
        return np.ones(dp)  # every DP rank computes it in full
    bucket, slot = plan.layout.slot_of()[index]
    out = np.array([max(0, min(slot.end, b) - max(slot.start, a)) for a, b in plan.shard_ranges[bucket]], dtype=float)
    return out / slot.numel


def _tp_fractions(plan: Plan, index: int) -> np.ndarray:
    tp = plan.tp
    spec = plan.params[index]
    owner = plan.tp_owner[index]
    if owner is not None:
        out = np.zeros(tp)
        out[owner] = 1.0
        return out
    if spec.tp_dim is None or plan.uses_matrix_rule(index):
        return np.ones(tp)  # replicated param, or duplicated full-matrix compute
    return np.full(tp, 1.0 / tp)  # elementwise update of the local shard


def compute_metrics(plan: Plan, with_comm: bool = True) -> PlanMetrics:
    dp, tp = plan.dp, plan.tp
    compute = np.zeros((dp, tp))
    numel = np.zeros((dp, tp))
    for i, spec in enumerate(plan.params):
        share = np.outer(_dp_fractions(plan, i), _tp_fractions(plan, i))
        compute += share * plan.cost[i]
        numel += share * spec.numel
    ranks = dp * tp
    total_cost = sum(plan.cost.values())
    total_numel = sum(p.numel for p in plan.params)
    ideal = total_cost / ranks
    # Largest indivisible item: a full matrix update, or an elementwise param that the plan
    # keeps whole on one DP rank (split over TP only); ZeRO-1's equal shards divide the rest.
    largest = max(
        (
            plan.cost[i] if plan.uses_matrix_rule(i) else plan.cost[i] / tp
            for i in range(len(plan.params))
            if plan.uses_matrix_rule(i) or plan.dp_owner[i] is not None
        ),
        default=0.0,
    )
    send, recv, collectives = _communication(plan) if with_comm else (np.zeros((dp, tp)), np.zeros((dp, tp)), 0)
    return PlanMetrics(
        compute=compute,
        numel=numel,
        compute_imbalance=float(compute.max() / ideal),
        memory_imbalance=float(numel.max() / (total_numel / ranks)),
        lower_bound=max(1.0, largest / ideal),
        send_bytes=send,
        recv_bytes=recv,
        collectives=collectives,
    )


def _equal(ranges: tuple[tuple[int, int], ...]) -> bool:
    return len({e - a for a, e in ranges}) == 1


def _communication(plan: Plan) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-rank bytes sent/received per step by the optimizer path, and collectives issued.

    Ring-algorithm volumes: reduce-scatter / all-gather of N elements over P ranks move
    (P-1)/P·N per rank each way; all-reduce twice that. TP gathers and scatters count exact
    shard bytes. (The executor's ``padded`` collective for uneven shards moves up to
    P × the widest shard instead; the measured trials show what it costs.)
    """
    dp, tp = plan.dp, plan.tp
    send = np.zeros((dp, tp))
    recv = np.zeros((dp, tp))
    b = BYTES_PER_ELEMENT
    collectives = 0
    for bi, bucket in enumerate(plan.layout.buckets):
        if plan.shard_ranges is not None:
            # reduce-scatter of grads, then all-gather of params (adamw, canzona) or of grads
            # (sync zero1_gather): ring volume each way. Uneven shards are modelled as one
            # rooted reduce / broadcast per non-empty shard (bandwidth-optimal, more calls).
            vol = 2 * (dp - 1) / dp * bucket.numel * b
            send += vol
            recv += vol
            nonempty = sum(1 for a, e in plan.shard_ranges[bi] if e > a)
            collectives += 2 if nonempty == dp and _equal(plan.shard_ranges[bi]) else 2 * nonempty
        if plan.grad_reduce == "all_reduce":
            vol = 2 * (dp - 1) / dp * bucket.numel * b
            send += vol
            recv += vol
            collectives += 1
    if plan.param_sync == "owned_params":
        owned = np.zeros(dp)
        for i, spec in enumerate(plan.params):
            owned[plan.dp_owner[i]] += spec.local_numel(tp)
        vol = (dp - 1) * owned.max() * b
        send += vol
        recv += vol
        collectives += 1
    if plan.tp_mode == "duplicated":
        for i, spec in enumerate(plan.params):
            if plan.uses_matrix_rule(i) and spec.tp_dim is not None:
                vol = (tp - 1) * spec.local_numel(tp) * b
                send += vol
                recv += vol
                collectives += 1
    if plan.tp_mode == "pipeline":
        for d, groups in enumerate(plan.micro_groups):
            for g in groups:
                for i, owner in zip(g.items, g.owners):
                    shard = plan.params[i].local_numel(tp) * b
                    for t in range(tp):
                        if t != owner:  # gather to owner, then scatter back
                            send[d, t] += shard
                            recv[d, t] += shard
                            send[d, owner] += shard
                            recv[d, owner] += shard
        collectives += 2 * max((len(g) for g in plan.micro_groups), default=0)
    return send, recv, collectives
