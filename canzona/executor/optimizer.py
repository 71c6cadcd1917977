"""The distributed optimizer: runs one method's plan over real process groups.

One class serves every method; the plan says which collective path each stage takes
(`Plan.grad_reduce`, `Plan.param_sync`, `Plan.tp_mode`, the shard ranges and the owners), so
the baselines and Canzona share the buffer, the collectives and the owner maths, and differ
exactly where the methods differ.

Step anatomy (DESIGN.md §6): backward hooks reduce buckets as they fill; `finish_grad_sync`
waits for what is left (exposed grad reduction); `step` runs the optimizer step (TP gathers,
owner compute, TP scatters, applying updates); `sync_params` brings every DP rank the params
others updated (exposed param sync).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from canzona.config import TrialConfig
from canzona.executor.buffer import FlatBuffers
from canzona.executor.collectives import Pending, all_gather, reduce_scatter
from canzona.executor.timing import StepTimer
from canzona.executor.tp import MicroGroupPipeline, TpItem, duplicated_gather, shard_of
from canzona.model.parallel import ParallelContext
from canzona.optim.owner import ElementwiseUpdates, MatrixUpdates
from canzona.plan.types import Plan


class DistributedOptimizer:
    def __init__(self, model: nn.Module, plan: Plan, cfg: TrialConfig, ctx: ParallelContext):
        if (plan.dp, plan.tp) != (ctx.dp, ctx.tp):
            raise ValueError(f"plan is for dp={plan.dp} tp={plan.tp}, the world is dp={ctx.dp} tp={ctx.tp}")
        self.plan, self.cfg, self.ctx = plan, cfg, ctx
        self.how = cfg.dist.dp_collective
        self.buffers = FlatBuffers(model, plan, ctx.device)
        self.matrices = MatrixUpdates(plan.params, cfg.optimizer)
        self.elementwise = ElementwiseUpdates(cfg.optimizer)
        self.steps = 0
        tp_partial = {i for i, s in enumerate(plan.params) if s.tp_grad_allreduce} if ctx.tp > 1 else set()
        self.buffers.install_hooks(
            self._reduce_bucket, overlap=cfg.dist.overlap_grad_reduce, tp_allreduce=tp_partial, tp_group=ctx.tp_group
        )
        self._split_work()
        self.pipeline = MicroGroupPipeline(
            plan.micro_groups[ctx.dp_rank] if plan.tp_mode == "pipeline" else (),
            ctx.tp, ctx.tp_rank, ctx.tp_group, cfg.canzona.pipeline_depth,
        )

    # ------------------------------------------------------------------ who does what here
    def _mine_on_dp(self, i: int) -> bool:
        owner = self.plan.dp_owner[i]
        return owner is None or owner == self.ctx.dp_rank

    def _split_work(self) -> None:
        plan, n = self.plan, len(self.plan.params)
        self.pipelined = [
            i for i in range(n)
            if plan.tp_mode == "pipeline" and plan.dp_owner[i] == self.ctx.dp_rank
            and plan.uses_matrix_rule(i) and plan.params[i].tp_dim is not None
        ]
        pipelined = set(self.pipelined)
        # full-matrix updates computed here without the pipeline
        self.local_matrices = [
            i for i in range(n) if plan.uses_matrix_rule(i) and self._mine_on_dp(i) and i not in pipelined
        ]
        # elementwise: adamw's equal shards work on flat slices, the others on whole local params
        self.flat_elementwise = plan.elementwise_on_shards
        self.elementwise_params = [
            i for i in range(n) if not plan.uses_matrix_rule(i) and self._mine_on_dp(i) and not self.flat_elementwise
        ]
        self.owned_count = torch.zeros(n)  # for the ownership check in tests
        for i in self.pipelined:
            if plan.tp_owner[i] == self.ctx.tp_rank:
                self.owned_count[i] = 1
        for i in self.local_matrices:
            self.owned_count[i] = 1

    # ------------------------------------------------------------------ grad reduction
    def _reduce_bucket(self, b: int) -> Pending:
        plan, ctx = self.plan, self.ctx
        bucket = plan.layout.buckets[b]
        if ctx.dp == 1:
            return Pending([])
        if plan.grad_reduce == "all_reduce":
            view = self.buffers.grad_buf[bucket.start : bucket.end]
            work = dist.all_reduce(view, group=ctx.dp_group, async_op=True)
            return Pending([work], lambda: view.mul_(1.0 / ctx.dp))
        assert plan.shard_ranges is not None
        ranges = plan.shard_ranges[b]
        pending = reduce_scatter(self.buffers.grad_buf, ranges, ctx.dp_rank, ctx.dp_group, self.how, average=True)
        if plan.regathers_grads:  # every rank needs every full gradient back
            return Pending([], lambda: (pending.wait(), all_gather(self.buffers.grad_buf, ranges, ctx.dp_rank,
                                                                   ctx.dp_group, self.how).wait()))
        return pending

    def start_step(self) -> None:
        self.buffers.start_step()

    def finish_grad_sync(self) -> None:
        self.buffers.finish_grad_sync()

    def load_grads(self, local_grads: list[torch.Tensor]) -> None:
        """Put given TP-local gradients in the buffer and reduce them (parity tests)."""
        self.buffers.start_step()
        for i, g in enumerate(local_grads):
            self.buffers.grad_view(i).copy_(g)
        self.buffers.mark_all_ready()
        self.buffers.finish_grad_sync()

    # ------------------------------------------------------------------ the optimizer step
    @torch.no_grad()
    def step(self, timer: StepTimer) -> None:
        self.steps += 1
        step, plan, ctx, buf = self.steps, self.plan, self.ctx, self.buffers

        def compute(indices: list[int], fulls: list[torch.Tensor]) -> list[torch.Tensor]:
            return self.matrices.directions(indices, fulls, step)

        def apply_shard(i: int, update: torch.Tensor) -> None:
            self.matrices.apply(buf.param_view(i), update)

        # 1. Canzona's TP pipeline for TP-sharded matrices owned by this DP rank.
        items = {i: TpItem(i, plan.params[i].tp_dim, buf.grad_view(i)) for i in self.pipelined}
        self.pipeline.run(items, compute, apply_shard, timer)

        # 2. Matrices computed whole here: TP-local (tp=1) or duplicated over TP (baselines).
        if self.local_matrices:
            dup = [i for i in self.local_matrices if plan.tp_mode == "duplicated" and plan.params[i].tp_dim is not None]
            dup_set = set(dup)
            fulls: dict[int, torch.Tensor] = {}
            if dup:
                with timer.phase("gather", "all-gather TP"):
                    gathered = duplicated_gather([TpItem(i, plan.params[i].tp_dim, buf.grad_view(i)) for i in dup],
                                                 ctx.tp, ctx.tp_group)
                fulls.update(zip(dup, gathered))
            for i in self.local_matrices:
                if i not in dup_set:
                    fulls[i] = buf.grad_view(i)
            order = self.local_matrices
            with timer.phase("compute", "compute"):
                updates = compute(order, [fulls[i] for i in order])
            with timer.phase("apply", "apply"):
                for i, u in zip(order, updates):
                    if i in dup_set:
                        u = shard_of(u, plan.params[i].tp_dim, ctx.tp, ctx.tp_rank)
                    apply_shard(i, u)

        # 3. Elementwise (AdamW) params.
        with timer.phase("compute", "elementwise"):
            if self.flat_elementwise:
                keys, ps, gs = [], [], []
                for b, ranges in enumerate(plan.shard_ranges or ()):
                    lo, hi = ranges[ctx.dp_rank]
                    if hi > lo:
                        keys.append(("bucket", b))
                        ps.append(buf.param_buf[lo:hi])
                        gs.append(buf.grad_buf[lo:hi])
                self.elementwise.step(keys, ps, gs, step)
            else:
                ids = self.elementwise_params
                self.elementwise.step(ids, [buf.param_view(i) for i in ids], [buf.grad_view(i) for i in ids], step)

    # ------------------------------------------------------------------ param sync
    @torch.no_grad()
    def sync_params(self) -> None:
        plan, ctx, buf = self.plan, self.ctx, self.buffers
        if ctx.dp == 1 or plan.param_sync == "none":
            return
        if plan.param_sync == "shards":
            assert plan.shard_ranges is not None
            pend = [all_gather(buf.param_buf, r, ctx.dp_rank, ctx.dp_group, self.how) for r in plan.shard_ranges]
            for p in pend:
                p.wait()
            return
        # layer-wise: pack owned params, padded all-gather, unpack every rank's params
        owned = [[i for i in range(len(plan.params)) if plan.dp_owner[i] == r] for r in range(ctx.dp)]
        sizes = [sum(buf.slots[i].numel for i in o) for o in owned]
        widest = max(sizes)
        mine = torch.zeros(widest, device=buf.param_buf.device)
        if owned[ctx.dp_rank]:
            mine[: sizes[ctx.dp_rank]] = torch.cat([buf.param_view(i).reshape(-1) for i in owned[ctx.dp_rank]])
        out = torch.empty(ctx.dp, widest, device=mine.device)
        dist.all_gather_single(out.view(-1), mine, group=ctx.dp_group)
        for r in range(ctx.dp):
            if r == ctx.dp_rank:
                continue
            off = 0
            for i in owned[r]:
                n = buf.slots[i].numel
                buf.param_view(i).copy_(out[r, off : off + n].view_as(buf.param_view(i)))
                off += n
