"""Simulate one training iteration of any method's plan on a device profile.

The program each rank runs mirrors `canzona.run.run_rank` and `canzona.executor`:

1. ``forward``: the model's forward (flops model, see `model_work`) plus Megatron's TP
   all-reduces of the b·s·hidden activations (2 per layer, 1 for the vocab-parallel embedding,
   3 small ones in the vocab-parallel cross-entropy).
2. ``backward``: 2× the forward flops plus 2 TP all-reduces per layer and one for the output
   layer, walked in reverse registration order; each param's gradient lands in its bucket slot
   (a hook copy) and, with ``dist.overlap_grad_reduce``, a bucket's DP reduction is issued as
   soon as it is full (buckets in index order). The reduction is the plan's: all-reduce
   (sync / layerwise) or a reduce-scatter into the plan's shards through ``dist.dp_collective``
   (equal shards in rank order use the even collective; ``padded`` packs P×widest; ``reduce_loop``
   issues one reduce per non-empty shard; ``all_to_all`` sends exact splits), plus the
   zero1_gather re-gather for ``sync``.
3. ``grad_reduce``: wait for every bucket, copy out / average (exposed reduction).
4. the optimizer step: the TP micro-group pipeline (``canzona.pipeline_depth`` groups of
   gathers in flight, scatters drained to that depth), matrices computed whole (duplicated
   all-gathers over TP for sync / layerwise with TP), the elementwise AdamW part.
5. ``param_sync``: the DP all-gather of the updated shards or owned params, not overlapped.

`project(cfg, profile)` returns a summary-like dict (see its docstring).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from canzona.config import TrialConfig
from canzona.executor.collectives import equal_in_order, resolve
from canzona.plan.metrics import compute_metrics
from canzona.plan.tp import MicroGroup
from canzona.plan.types import Plan
from canzona.records import PHASES
from canzona.sim.claims import PAPER_CLAIMS  # re-exported: the paper's headline, beside projections
from canzona.sim.model import BYTES, ModelWork, forward_flops, model_work
from canzona.sim.profile import Profile, load_profile
from canzona.sim.timeline import Handle, Timeline


# ---------------------------------------------------------------------------------- helpers
@dataclass
class _Pending:
    handles: list[Handle]
    finish_s: dict[int, float]  # rank -> host seconds after the wait (copy-out, scaling)
    regather: tuple[list[int], tuple[float, float]] | None = None  # sync zero1_gather: (ranks, AG cost)
    regather_copy: float = 0.0


class _Sim:
    def __init__(self, cfg: TrialConfig, plan: Plan, prof: Profile, scale: float, step_scale: float | None = None):
        self.cfg, self.plan, self.prof = cfg, plan, prof
        self.step_scale = scale if step_scale is None else step_scale
        self.dp, self.tp = plan.dp, plan.tp
        self.world = self.dp * self.tp
        self.tl = Timeline(self.world, prof.overlap, scale)
        self.how = cfg.dist.dp_collective
        self.opt = cfg.optimizer.name
        self.ns = (cfg.optimizer.ns_dtype, cfg.optimizer.ns_steps)

    # ranks
    def step_runnable(self) -> float:
        """Mean number of ranks doing host work during the optimizer step (busy time / window)."""
        m = self.tl.marks
        window = max(x["step_end"] for x in m) - min(x["step_start"] for x in m)
        busy = sum(x["step_end:busy"] - x["step_start:busy"] for x in m)
        return busy / window if window > 0 else float(self.world)

    def rank(self, d: int, t: int) -> int:
        return d * self.tp + t

    def dp_group(self, t: int) -> list[int]:
        return [self.rank(d, t) for d in range(self.dp)]

    def tp_group(self, d: int) -> list[int]:
        return [self.rank(d, t) for t in range(self.tp)]

    def coll(self, kind: str, nbytes: float, ranks: Sequence[int]) -> tuple[float, float]:
        """(seconds, transfer seconds) of one collective."""
        lat, tr = self.prof.collective_parts(kind, nbytes, ranks)
        return lat + tr, tr

    def issue(self, ranks: Sequence[int], stream: str, cost: tuple[float, float], label: str) -> Handle:
        return self.tl.collective(ranks, stream, cost[0], label, cost[1])

    # ------------------------------------------------------------------ iteration
    def run(self) -> None:
        tl, prof, plan = self.tl, self.prof, self.plan
        everyone = list(range(self.world))
        work = model_work(self.cfg, plan, prof, self.tp_group(0))
        self.work = work
        with tl.phase(everyone, "forward"):
            for r in everyone:
                tl.host(r, work.forward_s)
            if self.tp > 1:
                for d in range(self.dp):
                    tl.blocking(self.tp_group(d), "tp", work.tp_forward_s, "forward TP all-reduces")
        # backward with bucketed grad reduction from hooks
        layout = plan.layout
        bucket_of = {s.index: b.index for b in layout.buckets for s in b.params}
        ready = [0] * len(layout.buckets)
        self.pending: dict[int, list[_Pending]] = {}
        self.next_bucket = 0
        overlap = self.cfg.dist.overlap_grad_reduce
        with tl.phase(everyone, "backward"):
            for sec, done in work.backward_units:
                for r in everyone:
                    tl.host(r, sec)
                for i in done:
                    ready[bucket_of[i]] += 1
                if overlap:
                    self._launch_ready(ready)
        with tl.phase(everyone, "grad_reduce"):
            self._launch_ready(ready)
            for b in sorted(self.pending):
                for pend in self.pending[b]:
                    self._finish(pend)
        tl.mark(everyone, "step_start")
        scale, tl.scale = tl.scale, self.step_scale
        self.step()
        tl.scale = scale
        tl.mark(everyone, "step_end")
        with tl.phase(everyone, "param_sync"):
            self.param_sync()
        tl.mark(everyone, "end")

    # ------------------------------------------------------------------ grad reduction
    def _launch_ready(self, ready: list[int]) -> None:
        buckets = self.plan.layout.buckets
        while self.next_bucket < len(buckets) and ready[self.next_bucket] == len(buckets[self.next_bucket].params):
            b = self.next_bucket
            self.pending[b] = [self._reduce_bucket(b, t) for t in range(self.tp)] if self.dp > 1 else []
            self.next_bucket += 1

    def _reduce_bucket(self, b: int, t: int) -> _Pending:
        plan, tl, prof = self.plan, self.tl, self.prof
        bucket = plan.layout.buckets[b]
        ranks = self.dp_group(t)
        p = self.dp
        nbytes = bucket.numel * BYTES
        label = f"grad_reduce b{b}"
        if plan.grad_reduce == "all_reduce":
            h = self.issue(ranks, "dp", self.coll("all_reduce", nbytes, ranks), label)
            return _Pending([h], {r: prof.copy(nbytes) for r in ranks})
        ranges = plan.shard_ranges[b]
        own = [e - a for a, e in ranges]
        how = resolve(ranges, self.how)
        if equal_in_order(ranges):
            h = self.issue(ranks, "dp", self.coll("reduce_scatter", nbytes, ranks), label)
            handles, finish = [h], {r: prof.copy(2 * own[d] * BYTES) for d, r in enumerate(ranks)}
        elif how == "padded":
            widest = max(own)
            for r in ranks:
                tl.host(r, prof.copy(p * widest * BYTES))
            h = self.issue(ranks, "dp", self.coll("reduce_scatter", p * widest * BYTES, ranks), label)
            handles, finish = [h], {r: prof.copy(2 * own[d] * BYTES) for d, r in enumerate(ranks)}
        elif how == "reduce_loop":
            handles = [self.issue(ranks, "dp", self.coll("reduce", w * BYTES, ranks), f"{label} r{d}")
                       for d, w in enumerate(own) if w > 0]
            finish = {r: prof.copy(own[d] * BYTES) for d, r in enumerate(ranks)}
        elif how == "all_to_all":
            for r in ranks:
                tl.host(r, prof.copy(nbytes))
            busiest = max(max(bucket.numel - w, (p - 1) * w) for w in own) * BYTES
            h = self.issue(ranks, "dp", self.coll("all_to_all", busiest, ranks), label)
            handles, finish = [h], {r: prof.copy((p + 1) * own[d] * BYTES) for d, r in enumerate(ranks)}
        else:
            raise ValueError(f"unknown dp_collective {how!r}")
        pend = _Pending(handles, finish)
        if plan.regathers_grads:  # the full gradients come back
            pend.regather = (ranks, self._all_gather_seconds(ranges, ranks))
            pend.regather_copy = prof.copy(nbytes)
        return pend

    def _all_gather_seconds(self, ranges: Sequence[tuple[int, int]], ranks: list[int]) -> tuple[float, float]:
        own = [e - a for a, e in ranges]
        total = sum(own)
        how = resolve(ranges, self.how)
        if equal_in_order(ranges):
            return self.coll("all_gather", total * BYTES, ranks)
        if how == "padded":
            return self.coll("all_gather", len(own) * max(own) * BYTES, ranks)
        if how == "reduce_loop":
            parts = [self.coll("broadcast", w * BYTES, ranks) for w in own if w > 0]
            return sum(a for a, _ in parts), sum(b for _, b in parts)
        busiest = max(max((len(own) - 1) * w, total - w) for w in own) * BYTES
        return self.coll("all_to_all", busiest, ranks)

    def _finish(self, pend: _Pending) -> None:
        tl = self.tl
        for r, sec in pend.finish_s.items():
            tl.wait_all(r, pend.handles)
            tl.host(r, sec)
        if pend.regather is not None:
            ranks, seconds = pend.regather
            tl.blocking(ranks, "dp", seconds[0], "grad_reduce regather")
            for r in ranks:
                tl.host(r, pend.regather_copy)

    # ------------------------------------------------------------------ the optimizer step
    def _matrix_shapes(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        return [shape for i in indices for _, shape in self.plan.params[i].matrices]

    def _compute_s(self, indices: Sequence[int]) -> float:
        if not indices:
            return 0.0
        return self.prof.matrix_call(self.opt, self._matrix_shapes(indices), *self.ns)

    def step(self) -> None:
        plan = self.plan
        n = len(plan.params)
        for d in range(self.dp):
            ranks = self.tp_group(d)
            pipelined = [
                i for i in range(n)
                if plan.tp_mode == "pipeline" and plan.dp_owner[i] == d and plan.uses_matrix_rule(i)
                and plan.params[i].tp_dim is not None
            ]
            if plan.tp_mode == "pipeline" and plan.micro_groups[d]:
                self._pipeline(ranks, plan.micro_groups[d])
            piped = set(pipelined)
            local = [i for i in range(n) if plan.uses_matrix_rule(i) and plan.dp_owner[i] in (None, d) and i not in piped]
            if local:
                self._local_matrices(ranks, local)
            self._elementwise(d, ranks)

    def _pipeline(self, ranks: list[int], groups: tuple[MicroGroup, ...]) -> None:
        tl, prof, plan, tp = self.tl, self.prof, self.plan, self.tp
        depth = self.cfg.canzona.pipeline_depth
        shard = {i: plan.params[i].local_numel(tp) * BYTES for g in groups for i in g.items}

        def a2a_seconds(g: MicroGroup) -> tuple[float, float]:
            send = [sum(shard[i] for i, o in zip(g.items, g.owners) if o != t) for t in range(tp)]
            recv = [(tp - 1) * sum(shard[i] for i, o in zip(g.items, g.owners) if o == t) for t in range(tp)]
            return self.coll("all_to_all", max(max(send), max(recv)), ranks)

        def owned(g: MicroGroup, t: int) -> list[int]:
            return [i for i, o in zip(g.items, g.owners) if o == t]

        gathers: dict[int, Handle] = {}
        scatters: deque[tuple[int, Handle]] = deque()
        issued = 0

        def issue_gathers(upto: int) -> None:
            nonlocal issued
            while issued < min(upto, len(groups)):
                g = groups[issued]
                with tl.phase(ranks, "gather", f"gather g{issued}"):
                    for r in ranks:
                        tl.host(r, prof.copy(sum(shard[i] for i in g.items)))
                    gathers[issued] = self.issue(ranks, "tp", a2a_seconds(g), f"gather g{issued}")
                issued += 1

        def drain(keep: int) -> None:
            while len(scatters) > keep:
                k, h = scatters.popleft()
                with tl.phase(ranks, "wait", f"wait scatter g{k}"):
                    for r in ranks:
                        tl.wait(r, h)
                with tl.phase(ranks, "apply", f"apply g{k}"):
                    for r in ranks:
                        tl.host(r, prof.apply(plan.params[i].local_numel(tp) for i in groups[k].items))

        for k, g in enumerate(groups):
            issue_gathers(k + 1 + depth)
            h = gathers.pop(k)
            with tl.phase(ranks, "wait", f"wait gather g{k}"):
                for r in ranks:
                    tl.wait(r, h)
            for t, r in enumerate(ranks):  # unpack: concatenate the shards of each owned matrix
                tl.host(r, prof.copy(tp * sum(shard[i] for i in owned(g, t))))
            with tl.phase(ranks, "compute", f"compute g{k}"):
                for t, r in enumerate(ranks):
                    tl.host(r, self._compute_s(owned(g, t)))
            with tl.phase(ranks, "scatter", f"scatter g{k}"):
                for t, r in enumerate(ranks):
                    tl.host(r, prof.copy(2 * tp * sum(shard[i] for i in owned(g, t))))
                scatters.append((k, self.issue(ranks, "tp", a2a_seconds(g), f"scatter g{k}")))
            drain(depth)
        drain(0)

    def _local_matrices(self, ranks: list[int], local: list[int]) -> None:
        tl, prof, plan, tp = self.tl, self.prof, self.plan, self.tp
        dup = [i for i in local if plan.tp_mode == "duplicated" and plan.params[i].tp_dim is not None]
        if dup:
            with tl.phase(ranks, "gather", "all-gather TP"):
                handles = [
                    self.issue(ranks, "tp", self.coll("all_gather", plan.params[i].numel * BYTES, ranks), "all-gather TP")
                    for i in dup
                ]
                for r in ranks:
                    for i, h in zip(dup, handles):
                        tl.wait(r, h)
                        tl.host(r, prof.copy(plan.params[i].numel * BYTES))
        with tl.phase(ranks, "compute", "compute"):
            sec = self._compute_s(local)
            for r in ranks:
                tl.host(r, sec)
        with tl.phase(ranks, "apply", "apply"):
            sec = prof.apply(plan.params[i].local_numel(tp) for i in local)
            for r in ranks:
                tl.host(r, sec)

    def _elementwise(self, d: int, ranks: list[int]) -> None:
        plan, tp = self.plan, self.tp
        if plan.elementwise_on_shards:
            sizes = []
            for b, bucket in enumerate(plan.layout.buckets):
                lo, hi = plan.shard_ranges[b][d] if self.dp > 1 else (bucket.start, bucket.end)
                if hi > lo:
                    sizes.append(hi - lo)
        else:
            sizes = [
                p.local_numel(tp) for i, p in enumerate(plan.params)
                if not plan.uses_matrix_rule(i) and plan.dp_owner[i] in (None, d)
            ]
        sec = self.prof.adamw(sizes) if sizes else 0.0
        with self.tl.phase(ranks, "compute", "elementwise"):
            for r in ranks:
                self.tl.host(r, sec)

    # ------------------------------------------------------------------ param sync
    def param_sync(self) -> None:
        plan, tl, prof, p = self.plan, self.tl, self.prof, self.dp
        if p == 1 or plan.param_sync == "none":
            return
        if plan.param_sync == "shards":
            for t in range(self.tp):
                ranks = self.dp_group(t)
                handles, finish = [], []
                for b, ranges in enumerate(plan.shard_ranges):
                    own = [e - a for a, e in ranges]
                    bucket_bytes = sum(own) * BYTES
                    how = resolve(ranges, self.how)
                    if not equal_in_order(ranges) and how == "padded":
                        for r in ranks:
                            tl.host(r, prof.copy(max(own) * BYTES))
                    elif not equal_in_order(ranges) and how == "all_to_all":
                        for d, r in enumerate(ranks):
                            tl.host(r, prof.copy(p * own[d] * BYTES))
                    if equal_in_order(ranges) or how != "reduce_loop":
                        hs = [self.issue(ranks, "dp", self._all_gather_seconds(ranges, ranks), f"param_sync b{b}")]
                        fin = {r: prof.copy(bucket_bytes - own[d] * BYTES) for d, r in enumerate(ranks)}
                    else:
                        hs = [self.issue(ranks, "dp", self.coll("broadcast", w * BYTES, ranks), f"param_sync b{b} r{d}")
                              for d, w in enumerate(own) if w > 0]
                        fin = {}
                    handles.append(hs)
                    finish.append(fin)
                for hs, fin in zip(handles, finish):
                    for r in ranks:
                        tl.wait_all(r, hs)
                        tl.host(r, fin.get(r, 0.0))
            return
        # layer-wise: pack owned params, padded all-gather, unpack the others
        sizes = [0] * p
        for i, spec in enumerate(plan.params):
            sizes[plan.dp_owner[i]] += spec.local_numel(self.tp)
        widest = max(sizes)
        for t in range(self.tp):
            ranks = self.dp_group(t)
            for d, r in enumerate(ranks):
                tl.host(r, prof.copy(sizes[d] * BYTES))
            tl.blocking(ranks, "dp", self.coll("all_gather", p * widest * BYTES, ranks)[0], "param_sync owned params")
            for d, r in enumerate(ranks):
                tl.host(r, prof.copy((sum(sizes) - sizes[d]) * BYTES))


# ---------------------------------------------------------------------------------- entry points
def oversubscription(cfg: TrialConfig, prof: Profile) -> tuple[float, int, int]:
    """CPU profiles: (ranks × threads per rank / cores, at least 1; threads; cores)."""
    cores = prof.device.get("cores")
    if prof.device.get("kind", "cpu") != "cpu" or not cores:
        return 1.0, 1, 0
    world = cfg.world_size
    threads = cfg.dist.threads_per_rank or max(1, int(cores) // world)
    return max(1.0, world * threads / int(cores)), threads, int(cores)


def simulate(cfg: TrialConfig, profile: Any, plan: Plan | None = None) -> _Sim:
    """Run the timeline of one iteration; returns the simulator (timeline in ``.tl``).

    On an oversubscribed CPU (more ranks × threads than cores) every duration is stretched by
    that ratio while all ranks are busy (forward, backward, communication); in the optimizer
    step only the ranks with work compete for the cores, so the step is simulated a second time
    with the ratio of its mean number of busy ranks (from the first pass) to the cores.
    """
    from canzona.plan.methods import make_plan

    prof = load_profile(profile)
    plan = plan if plan is not None else make_plan(cfg)
    scale, threads, cores = oversubscription(cfg, prof)
    sim = _Sim(cfg, plan, prof, scale)
    sim.run()
    if scale > 1.0:
        step_scale = min(scale, max(1.0, sim.step_runnable() * threads / cores))
        sim = _Sim(cfg, plan, prof, scale, step_scale)
        sim.run()
    return sim


def assumptions(cfg: TrialConfig, prof: Profile, scale: float, step_scale: float = 1.0) -> list[str]:
    opt = cfg.optimizer.name
    has_table = bool(prof.batched.get(opt))
    out = [
        f"profile {prof.name} ({prof.source}); device {prof.device.get('name')}",
        "one iteration in steady state: every rank starts at t=0; the median step has no "
        "Shampoo/SOAP preconditioner refresh (eigendecompositions every precondition_frequency steps are not timed)",
        "forward flops 2·T·(local matmul weights, output layer included) + 4·L·(heads·head_dim/tp)·seq·T, "
        "backward twice that, at the profile's rate plus fixed and per-layer overheads; one micro-batch, "
        "no pipeline parallelism, no sequence parallelism, no activation recomputation",
        f"Megatron TP all-reduces of b·s·hidden {prof.model_dtype} activations: 2 per layer + 1 embedding forward, "
        "2 per layer + 1 output layer backward, 3 small cross-entropy all-reduces",
        "gradient and parameter buffers fp32 (4 bytes/element) as in the executor; buckets and shards from the plan",
        "collectives: latency + (ring steps - 1)·step latency + bytes/bandwidth (ring volumes); a group spanning "
        "more than one node runs at the network bandwidth (one NIC per GPU); concurrent groups do not contend",
        f"ranks TP-contiguous (rank = dp_rank·tp + tp_rank), {prof.ranks_per_node or 'all'} ranks per node",
        f"communication/compute overlap fraction {prof.overlap:g}",
        "param all-gather after the step is not overlapped with the next forward (as the executor)",
        ("optimizer updates from the profile's measured per-shape table (unmeasured shapes scaled by flops)"
         if has_table else
         f"optimizer updates from flops at {prof.matmul_flops.get(cfg.optimizer.ns_dtype if opt == 'muon' else 'float32', prof.matmul_flops['float32']) / 1e12:.3g} TFLOP/s"
         " plus elementwise passes at the memory bandwidth"),
    ]
    if scale > 1.0:
        out.append(f"CPU oversubscribed: {cfg.world_size} ranks on {prof.device.get('cores')} cores: durations ×{scale:.2g}, "
                   f"in the optimizer step ×{step_scale:.2g} (only busy ranks compete)")
    calib_threads = prof.device.get("threads")
    if prof.device.get("kind") == "cpu" and calib_threads and cfg.dist.threads_per_rank not in (None, calib_threads):
        out.append(f"trial uses {cfg.dist.threads_per_rank} threads per rank, the profile was timed with {calib_threads}")
    return out


def project(cfg: TrialConfig, profile: Any, *, plan: Plan | None = None, events: str = "auto") -> dict[str, Any]:
    """Predicted summary of one trial (one iteration, max over ranks, milliseconds).

    Keys: ``iteration_ms``, ``optimizer_step_ms``, ``param_sync_ms``, ``grad_reduce_ms``,
    ``forward_ms``, ``backward_ms`` (and the ``*_median`` / ``*_p10`` / ``*_p90`` names of
    summary.json, all equal), ``phases_ms`` (max over ranks per phase), ``breakdown`` (the
    critical rank's optimizer step by phase), ``steps`` (one steps.jsonl-style row per rank,
    ``events`` in the records format plus comm-stream events with ``lane``), ``plan``,
    ``world``, ``projected: True``, ``profile``, ``assumptions``, ``config``, ``sim_seconds``.
    ``events``: "all", "none", or "auto" (all ranks up to 64, else the critical, the fastest
    and rank 0).
    """
    t0 = time.perf_counter()
    prof = load_profile(profile)
    sim = simulate(cfg, prof, plan)
    tl, plan_ = sim.tl, sim.plan
    world = sim.world
    metrics = compute_metrics(plan_, with_comm=False)
    step_ms = [(tl.marks[r]["step_end"] - tl.marks[r]["step_start"]) * 1e3 for r in range(world)]
    iter_ms = [tl.marks[r]["end"] * 1e3 for r in range(world)]
    critical = int(np.argmax(step_ms))
    keep = set(range(world))
    if events == "none":
        keep = set()
    elif events == "auto" and world > 64:
        keep = {critical, int(np.argmin(step_ms)), 0}
    rows = []
    for r in range(world):
        d, t = divmod(r, sim.tp)
        ph = tl.phases_ms(r)
        rows.append({
            "step": 0, "measured": True, "rank": r, "dp_rank": d, "tp_rank": t,
            "iteration_ms": iter_ms[r], "optimizer_step_ms": step_ms[r],
            **{f"{p}_ms": ph.get(p, 0.0) for p in PHASES},
            "compute_load": float(metrics.compute[d, t]), "loss": None,
            "events": tl.rank_events(r) if r in keep else [],
        })
    phases_max = {p: max(row[f"{p}_ms"] for row in rows) for p in PHASES}
    out: dict[str, Any] = {
        "projected": True,
        "profile": prof.describe(),
        "assumptions": assumptions(cfg, prof, sim.tl.scale, sim.step_scale),
        "iteration_ms": max(iter_ms),
        "optimizer_step_ms": max(step_ms),
        "param_sync_ms": phases_max["param_sync"],
        "grad_reduce_ms": phases_max["grad_reduce"],
        "forward_ms": phases_max["forward"],
        "backward_ms": phases_max["backward"],
        "phases_ms": phases_max,
        "phases_ms_mean": {p: float(np.mean([row[f"{p}_ms"] for row in rows])) for p in PHASES},
        "critical_rank": critical,
        "breakdown": {p: rows[critical][f"{p}_ms"] for p in ("gather", "compute", "scatter", "apply")},
        "model_flops_per_rank": {"forward": sim.work.forward_flops, "tokens": sim.work.tokens},
        "steps": rows,
        "world": {"world_size": world, "dp": sim.dp, "tp": sim.tp, "backend": "simulated",
                  "device": prof.device.get("kind"), "device_name": prof.device.get("name")},
        "plan": {"imbalance": metrics.imbalance(), "cost_model": plan_.cost_model,
                 "micro_groups": [len(g) for g in plan_.micro_groups], "plan_seconds": plan_.plan_seconds,
                 "buckets": len(plan_.layout.buckets)},
        "config": cfg.to_dict(),
    }
    for key in ("iteration_ms", "optimizer_step_ms", "param_sync_ms", "grad_reduce_ms"):
        for q in ("median", "p10", "p90"):
            out[f"{key}_{q}"] = out[key]
    out["sim_seconds"] = time.perf_counter() - t0
    return out


def write_trial(cfg: TrialConfig, profile: Any, out: str | Path) -> dict[str, Any]:
    """Project one trial and write its records like a measured trial (canzona/records.py):
    config.yaml, steps.jsonl (one row per rank, ``projected: true``), summary.json (the
    `project` dict less ``steps``, plus ``profile_inputs`` (`Profile.inputs`), ``peak_memory_mb: None``,
    ``host``, ``versions``).
    The sweep launcher's status.json is not written. Returns the summary."""
    import yaml

    from canzona.records import atomic_write_json, atomic_write_text

    out = Path(out)
    prof = load_profile(profile)
    res = project(cfg, prof)
    rows = [{**r, "projected": True} for r in res.pop("steps")]
    summary = {**res, "profile_inputs": prof.inputs(), "peak_memory_mb": None, "host": "simulated",
               "versions": {"simulator": "canzona.sim", "profile": res["profile"]["name"]}}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", yaml.safe_dump({**cfg.to_dict(), "out": str(out)}, sort_keys=False))
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_json(out / "summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m canzona.sim.simulate profile=h100 model=qwen3-32b parallel.dp=32 parallel.tp=8 [--json]``."""
    from canzona.config import load_config
    from canzona.errors import ConfigError

    argv = sys.argv[1:] if argv is None else argv
    profile = "h100"
    rest = []
    for a in argv:
        if a.startswith("profile="):
            profile = a.split("=", 1)[1]
        elif not a.startswith("--"):
            rest.append(a)
    try:
        cfg = load_config(rest)
        res = project(cfg, profile, events="none")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "--json" in argv:
        res.pop("steps")
        print(json.dumps(res, indent=2, default=str))
        return 0
    print(f"{cfg.method} {cfg.optimizer.name} {cfg.model.name} dp={cfg.parallel.dp} tp={cfg.parallel.tp} on {profile} "
          f"(projected): iteration {res['iteration_ms']:.1f} ms, optimizer step {res['optimizer_step_ms']:.2f} ms, "
          f"param sync {res['param_sync_ms']:.2f} ms")
    print("  phases (max over ranks, ms): " + ", ".join(f"{k} {v:.2f}" for k, v in res["phases_ms"].items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PAPER_CLAIMS", "ModelWork", "forward_flops", "model_work", "oversubscription", "project", "simulate",
           "write_trial"]
