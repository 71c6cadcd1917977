"""Lowering: a method's ``Plan`` -> one `Program` per rank (pure).

This is the only place that reads the plan's modes (``grad_reduce``, ``param_sync``,
``tp_mode``, shard ranges, owners, micro-groups) and its execution settings (`Execution`:
``dist.dp_collective``, ``dist.overlap_grad_reduce``, ``planner.pipeline_depth``). Everything
downstream walks the resulting actions; see `canzona.program.actions` for what each means.

An iteration, in program order:

1. ``Forward``; ``Backward`` (with ``train.grad_accum`` micro-batches, that many pairs, only the
   last one reducing) whose bucket hooks issue each bucket's DP gradient reduction as soon as
   the bucket is full (``dist.overlap_grad_reduce``; else the reductions follow
   backward), then a ``Wait`` for all of them (the exposed gradient reduction). Sync's
   ``zero1_gather`` variant then all-gathers the reduced gradients back.
2. ``Mark(step_start)``; the optimizer step: the TP micro-group pipeline of the matrices this
   DP rank owns (gather -> compute -> scatter -> apply per group, ``pipeline_depth`` groups of
   gathers issued ahead and scatters drained to that depth), the matrices computed whole here
   (the baselines all-gather TP shards first and duplicate the compute), the elementwise AdamW
   ranges (in the pipeline: while the first micro-groups' gathers are in flight, as they need
   no TP communication); ``Mark(step_end)``.
3. The parameter sync: the DP all-gather of updated shards (or layer-wise's padded gather of
   owned params), then a ``Wait``.

Uneven DP shards (``dist.dp_collective``): ``auto`` picks, per bucket, ``even`` for equal shards
in rank order, ``padded`` when padding every shard to the widest moves at most
`PADDING_TOLERANCE` x the bucket, else ``coalesced`` (the per-shard rooted calls launched as one
group: ZeRO-1's volume at one collective's latency on NCCL).
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.program.actions import (
    Action,
    Apply,
    Backward,
    BucketGather,
    BucketHook,
    BucketReduce,
    ClipScale,
    Comm,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GatherWait,
    GradNorm,
    GramCompute,
    Mark,
    NormReduce,
    OwnedParamsGather,
    Program,
    Ranges,
    StepBarrier,
    TpAllGather,
    TpGather,
    TpScatter,
    Wait,
)
from canzona.program.experts import MoeLowering

PADDING_TOLERANCE = 1.25
GRAD_DTYPE = "float32"  # the gradient buffer and its reductions (Megatron: fp32 grad accumulation)
UPDATE_DTYPE = "float32"  # matrix updates are computed from fp32 gradients for fp32 main params


def equal_in_order(ranges: Ranges) -> bool:
    widths = {b - a for a, b in ranges}
    return len(widths) == 1 and all(ranges[r][1] == ranges[r + 1][0] for r in range(len(ranges) - 1))


def resolve_impl(ranges: Ranges, how: str) -> str:
    """The implementation a bucket's uneven-shard collective uses (``auto`` decides per bucket)."""
    if equal_in_order(ranges):
        return "even"
    if how != "auto":
        return how
    widest = max(b - a for a, b in ranges)
    size = sum(b - a for a, b in ranges)
    return "padded" if len(ranges) * widest <= PADDING_TOLERANCE * size else "coalesced"


def forward_positions(params) -> list[int]:
    """Each param's position in the order the forward first uses it. That is registration order
    (the inventory's) but for the attention output projection: megatron-core registers
    ``linear_proj`` before ``linear_qkv`` and the q/k norms, and runs it after them. The
    overlapped parameter gather waits for a bucket before the first module that uses it."""
    order: list[int] = []
    deferred: int | None = None
    for i, p in enumerate(params):
        if deferred is not None and ".self_attention." not in p.name:
            order.append(deferred)
            deferred = None
        if p.name.endswith(".self_attention.linear_proj.weight"):
            deferred = i
            continue
        order.append(i)
    if deferred is not None:
        order.append(deferred)
    pos = [0] * len(order)
    for k, i in enumerate(order):
        pos[i] = k
    return pos


class _Lowering:
    """Shared, rank-independent facts of one plan, computed once for all ranks."""

    def __init__(self, plan, *, reduce_alone: bool = False):
        self.plan = plan
        # reduce gradients even over a group of one (an expert buffer at expert-DP 1 still scales
        # its gradients by 1/DP in its reduction, as Megatron's bucket does)
        self.reduces = plan.dp > 1 or reduce_alone
        if plan.execution is None:
            raise ValueError("a plan is lowered with the trial's execution settings: make it with "
                             "canzona.plan.from_config.make_plan, which adds them")
        self.ex = plan.execution
        self.dp, self.tp = plan.dp, plan.tp
        self.grid = plan.rank_layout
        self.param_dtype = self.ex.dtype  # bf16 parameters are all-gathered in bf16
        self.bf16 = self.ex.dtype != "float32"
        # every rank holds every reduced gradient (all-reduce, or sync's re-gather) or only its shards
        self.full_grads = plan.grad_reduce == "all_reduce" or plan.regathers_grads
        self.replicated = [p.tp_dim is None for p in plan.params]
        self.slots = {s.index: s for b in plan.layout.buckets for s in b.params}
        self.bucket_of = {s.index: b.index for b in plan.layout.buckets for s in b.params}
        n = len(plan.params)
        self.matrix = [plan.uses_matrix_rule(i) for i in range(n)]
        self.impls = (
            [resolve_impl(r, self.ex.dp_collective) for r in plan.shard_ranges] if plan.shard_ranges else []
        )
        self.tp_partial = tuple(
            (i, p.local_numel(self.tp)) for i, p in enumerate(plan.params) if p.tp_grad_allreduce and self.tp > 1
        )
        # What depends on the DP rank alone is made once per DP rank and shared by its TP ranks'
        # programs (actions are immutable): the bucket collectives, the parameter gathers, ...
        self._memo: dict[tuple, object] = {}
        if plan.param_sync == "owned_params":
            owned = [[] for _ in range(self.dp)]
            for b in plan.layout.buckets:
                for s in b.params:
                    owned[plan.dp_owner[s.index]].append(s.index)
            self.owned = tuple(tuple(o) for o in owned)
            self.owned_sizes = tuple(sum(self.slots[i].numel for i in o) for o in owned)

    def shard(self, i: int) -> int:
        return self.plan.params[i].local_numel(self.tp)

    def _once(self, key: tuple, make):
        """``make()``, made once per ``key`` for this plan."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = make()
            return value

    # ------------------------------------------------------------------ gradient reduction
    def grad_reduce(self, d: int, b: int, phase: str) -> BucketReduce:
        return self._once(("grad_reduce", d, b, phase), lambda: self._grad_reduce(d, b, phase))

    def _grad_reduce(self, d: int, b: int, phase: str) -> BucketReduce:
        plan = self.plan
        bucket = plan.layout.buckets[b]
        tag = f"grad_reduce b{b}"
        if plan.grad_reduce == "all_reduce":
            return BucketReduce(tag, b, bucket.start, bucket.end, "all_reduce", "even", None, d, GRAD_DTYPE, True, phase)
        ranges = plan.shard_ranges[b]
        return BucketReduce(tag, b, bucket.start, bucket.end, "reduce_scatter", self.impls[b], ranges, d, GRAD_DTYPE,
                            True, phase)

    def iteration(self, d: int, t: int) -> list[Action]:
        out: list[Action] = list(self._once(("through_backward", d), lambda: tuple(self._through_backward(d))))
        if self._step_shared(d):
            out.extend(self._once(("step", d, t == 0), lambda: tuple(self._step_block(d, t))))
        else:
            out.extend(self._step_block(d, t))
        out.extend(self._once(("param_sync", d), lambda: tuple(self.param_sync(d))))
        return out

    def _step_shared(self, d: int) -> bool:
        """Is DP rank d's optimizer step the same on all its TP ranks (no micro-groups), up to
        the gradient norm's ranges, which only tell TP rank 0 from the others?"""
        return not (self.plan.tp_mode == "pipeline" and self.plan.micro_groups[d])

    def _through_backward(self, d: int) -> list[Action]:
        """Forward, backward and the gradient reduction (the same on every TP rank of DP rank d)."""
        plan = self.plan
        buckets = plan.layout.buckets
        k = self.ex.grad_accum
        out: list[Action] = [Forward(self.forward_waits(d))]
        for m in range(k - 1):  # gradient accumulation: earlier micro-batches only accumulate
            out += [Backward((), self.tp_partial, GRAD_DTYPE, m, last=False), Forward((), m + 1)]
        reduces = [self.grad_reduce(d, b.index, "backward") for b in buckets] if self.reduces else []
        if self.ex.overlap_grad_reduce:
            hooks = tuple(BucketHook(r.bucket, (r,)) for r in reduces)
            out.append(Backward(hooks, self.tp_partial, GRAD_DTYPE, k - 1))
        else:
            out.append(Backward((), self.tp_partial, GRAD_DTYPE, k - 1))
            out.extend(self.grad_reduce(d, b.index, "grad_reduce") for b in buckets if self.reduces)
        if reduces:
            out.append(Wait(tuple(r.tag for r in reduces), "grad_reduce", "grad reduction"))
        if reduces and plan.regathers_grads:  # sync zero1_gather: every rank needs every gradient back
            gathers = [BucketGather(f"grad_regather b{b}", b, "grad", self.impls[b], plan.shard_ranges[b], d,
                                    GRAD_DTYPE, "grad_reduce") for b in range(len(buckets))]
            out.extend(gathers)
            out.append(Wait(tuple(g.tag for g in gathers), "grad_reduce", "gradient re-gather"))
        return out

    def _step_block(self, d: int, t: int) -> list[Action]:
        """The optimizer step between its marks: clipping, the updates, the copy into the model."""
        out: list[Action] = [*self.step_barrier(), Mark("step_start")]
        step = self.step(d, t)
        out.extend(self.clip(d, t, step))
        out.extend(step)
        main = self.main_ranges(step)
        if self.bf16 and main:
            out.append(CopyToModel("copy main->model", main))
        out.append(Mark("step_end"))
        return out

    def step_barrier(self) -> list[Action]:
        """Before the step's timer starts, every rank waits for the others (``dist.step_barrier``,
        Megatron's timers' default); nothing to wait for alone."""
        if not self.ex.step_barrier or self.grid.world == 1:
            return []
        return [StepBarrier(), Wait((StepBarrier.tag,), StepBarrier.phase, StepBarrier.tag)]

    # ------------------------------------------------------------------ clipping and main params
    def _read_ranges(self, step: list[Action]) -> Ranges:
        """Gradient ranges the step reads: its elementwise ranges and the slots of every matrix
        it computes, gathers or sends."""
        out: list[tuple[int, int]] = []
        for a in step:
            if isinstance(a, Elementwise):
                out.extend(a.ranges)
            elif isinstance(a, (Compute, TpGather, TpAllGather, GramCompute)):
                out.extend((self.slots[i].start, self.slots[i].end) for i in a.items)
        return merge(out)

    def _norm_ranges(self, d: int, t: int) -> Ranges:
        """What this rank counts in the gradient norm: its shards (or, holding every gradient,
        the whole buffer), without replicated params on TP ranks other than 0 (they hold the
        same values), so that every gradient element counts exactly once over all ranks."""
        plan = self.plan
        if self.full_grads or plan.shard_ranges is None:
            mine: Ranges = ((0, plan.layout.numel),)
        else:
            mine = tuple(r[d] for r in plan.shard_ranges if r[d][1] > r[d][0])
        if t == 0:
            return mine
        holes = self._once(("holes",), lambda: sorted((s.start, s.end) for i, s in self.slots.items()
                                                       if self.replicated[i]))
        return subtract(mine, holes)

    def clip(self, d: int, t: int, step: list[Action]) -> list[Action]:
        if self.ex.clip_grad <= 0:
            return []
        dtype = self.ex.clip_norm_dtype
        counted = self._once(("norm_ranges", d, t == 0), lambda: self._norm_ranges(d, t))  # TP rank 0 or not
        out: list[Action] = [GradNorm("grad norm", counted, dtype=dtype)]
        axis = None
        if not self.full_grads and self.grid.world > 1:
            axis = "world"
        elif self.tp > 1:
            axis = "tp"
        norm = "grad norm"
        if axis is not None:
            out += [NormReduce("grad norm reduce", axis, dtype=dtype),
                    Wait(("grad norm reduce",), "clip_grad", "grad norm")]
            norm = "grad norm reduce"
        out.append(ClipScale("clip", norm, self.ex.clip_grad, self._read_ranges(step)))
        return out

    def main_ranges(self, step: list[Action]) -> Ranges:
        """The ranges this rank updates: its elementwise ranges and the slots of what it applies."""
        out: list[tuple[int, int]] = []
        for a in step:
            if isinstance(a, Elementwise):
                out.extend(a.ranges)
            elif isinstance(a, Apply):
                out.extend((self.slots[i].start, self.slots[i].end) for i in a.items)
        return merge(out)

    def _param_gathers(self, d: int) -> list[Comm]:
        """The parameter all-gathers of DP rank d in the order the forward needs them."""
        return list(self._once(("param_gathers", d), lambda: tuple(self._make_param_gathers(d))))

    def _make_param_gathers(self, d: int) -> list[Comm]:
        plan = self.plan
        if plan.param_sync == "shards":
            order = self._once(("gather_order",), lambda: sorted(plan.layout.buckets, key=self._first_use))
            return [BucketGather(f"param_sync b{b.index}", b.index, "param", self.impls[b.index],
                                 plan.shard_ranges[b.index], d, self.param_dtype, "param_sync") for b in order]
        return [OwnedParamsGather("param_sync", self.owned, self.owned_sizes, d, self.param_dtype, "param_sync")]

    def _first_use(self, bucket) -> int:
        """Forward position of the first param of ``bucket`` the forward uses."""
        pos = self._once(("forward_positions",), lambda: forward_positions(self.plan.params))
        return min(pos[s.index] for s in bucket.params)

    def _first_param(self, g: Comm) -> int:
        if isinstance(g, BucketGather):
            pos = self._once(("forward_positions",), lambda: forward_positions(self.plan.params))
            return min((s.index for s in self.plan.layout.buckets[g.bucket].params), key=lambda i: pos[i])
        return 0

    def overlapped(self) -> bool:
        return self.gathers_params and self.ex.overlap_param_gather

    def forward_waits(self, d: int) -> tuple[GatherWait, ...]:
        """Overlapped gather: wait for bucket k's gather before its first param's module, then
        dispatch bucket k+1's (forward order); bucket 0's comes from the previous step."""
        if not self.overlapped():
            return ()
        return self._once(("forward_waits", d), lambda: self._forward_waits(d))

    def _forward_waits(self, d: int) -> tuple[GatherWait, ...]:
        gathers = self._param_gathers(d)
        return tuple(GatherWait(self._first_param(g), g.tag, gathers[k + 1] if k + 1 < len(gathers) else None)
                     for k, g in enumerate(gathers))

    @property
    def gathers_params(self) -> bool:
        return self.dp > 1 and self.plan.param_sync != "none"

    # ------------------------------------------------------------------ the optimizer step
    def pipelined(self, d: int) -> list[int]:
        plan = self.plan
        if plan.tp_mode != "pipeline":
            return []
        return [g_i for g in plan.micro_groups[d] for g_i in g.items]

    def step(self, d: int, t: int) -> list[Action]:
        plan = self.plan
        out: list[Action] = []
        elementwise = self._once(("elementwise", d), lambda: self._elementwise(d))
        if plan.tp_mode == "pipeline" and plan.micro_groups[d]:
            # the elementwise updates need no TP communication: they fill the first gathers' wait
            out.extend(self.pipeline(d, t, fill=elementwise))
            elementwise = []
        out.extend(self._once(("local_step", d), lambda: tuple(self._local_step(d))))
        out.extend(elementwise)
        return out

    def _elementwise(self, d: int) -> list[Action]:
        ranges = self.elementwise_ranges(d)
        return [Elementwise("elementwise", ranges)] if ranges else []

    def _local_step(self, d: int) -> list[Action]:
        """The step's matrices outside micro-groups (the same on every TP rank of DP rank d)."""
        plan = self.plan
        out: list[Action] = []
        piped = set(self.pipelined(d))
        local = [
            i for i in range(len(plan.params))
            if self.matrix[i] and plan.dp_owner[i] in (None, d) and i not in piped
        ]
        split = [i for i in local if plan.params[i].tp_dim is not None]
        dup = split if plan.tp_mode == "duplicated" else []
        gram = split if plan.tp_mode == "gram" else []
        not_whole = set(dup) | set(gram)
        whole = tuple(i for i in local if i not in not_whole)
        if whole:
            out.append(Compute("compute", whole, None))
            out.append(Apply("apply", whole, "compute", ()))
        for i in dup:
            # Duplicated TP (sync's SyncGroupExecutor, Megatron's `duplicated` Muon): one matrix at a
            # time -- all-gather its gradient over TP, every TP rank computes the whole update and keeps
            # its slice. Never more than one gathered matrix alive.
            gather = TpAllGather(f"tp_allgather p{i}", (i,), (self.shard(i),), self.tp, GRAD_DTYPE)
            out += [gather, Wait((gather.tag,), "gather", f"all-gather TP p{i}")]
            out.append(Compute(f"compute p{i}", (i,), gather.tag))
            out.append(Apply(f"apply p{i}", (i,), f"compute p{i}", (i,)))
        for i in gram:
            out.extend(self._gram_step(i))
        return out

    def _gram_step(self, i: int) -> list[Action]:
        """Megatron's `distributed` Muon on matrix i (`GramCompute`): this TP rank's shard
        orthogonalised with the Gram products and the norm all-reduced over TP, then applied."""
        spec = self.plan.params[i]
        sides = tuple(shape[1 - spec.tp_dim] for _, shape in spec.matrices)
        tag = f"gram p{i}"
        return [GramCompute(tag, (i,), (sides,), self.ex.ns_steps, self.tp, self.ex.ns_dtype),
                Wait((tag,), "compute", f"Newton-Schulz p{i}, Gram all-reduced over TP"),
                Apply(f"apply p{i}", (i,), tag)]

    def pipeline(self, d: int, t: int, fill: Sequence[Action] = ()) -> list[Action]:
        """Canzona's micro-group pipeline, unrolled: gathers of ``depth`` groups ahead are in
        flight while a group computes; scatters are drained down to ``depth`` outstanding.
        ``fill``: work independent of the groups, run while the first gathers are in flight."""
        groups = self.plan.micro_groups[d]
        depth = self.ex.pipeline_depth
        out: list[Action] = []
        issued = 0
        scatters: list[int] = []

        def shards(g) -> tuple[int, ...]:
            return tuple(self.shard(i) for i in g.items)

        def drain(keep: int) -> None:
            while len(scatters) > keep:
                k = scatters.pop(0)
                out.append(Wait((f"scatter g{k}",), "wait", f"wait scatter g{k}"))
                out.append(Apply(f"apply g{k}", groups[k].items, f"scatter g{k}"))

        for k, g in enumerate(groups):
            while issued < min(k + 1 + depth, len(groups)):
                gi = groups[issued]
                out.append(TpGather(f"gather g{issued}", gi.items, gi.owners, shards(gi), t, self.tp, GRAD_DTYPE))
                issued += 1
            if k == 0:
                out.extend(fill)
            out.append(Wait((f"gather g{k}",), "wait", f"wait gather g{k}"))
            owned = tuple(i for i, o in zip(g.items, g.owners) if o == t)
            if owned:
                out.append(Compute(f"compute g{k}", owned, f"gather g{k}"))
            out.append(TpScatter(f"scatter g{k}", f"compute g{k}", g.items, g.owners, shards(g), t, self.tp,
                                 UPDATE_DTYPE))
            scatters.append(k)
            drain(depth)
        drain(0)
        return out

    def elementwise_ranges(self, d: int) -> Ranges:
        plan = self.plan
        if plan.elementwise_on_shards:
            return tuple(r[d] for r in plan.shard_ranges if r[d][1] > r[d][0])
        mine = [
            (self.slots[i].start, self.slots[i].end) for i in range(len(plan.params))
            if not self.matrix[i] and plan.dp_owner[i] in (None, d)
        ]
        return tuple(sorted(mine))

    # ------------------------------------------------------------------ parameter sync
    def param_sync(self, d: int) -> list[Action]:
        """The DP all-gather of updated parameters, waited for here; or, overlapped, only the
        first bucket the next forward needs is issued (the forward's pre-hooks chain the rest)."""
        if not self.gathers_params:
            return []
        gathers = self._param_gathers(d)
        if self.overlapped():
            return [gathers[0]]
        return [*gathers, Wait(tuple(g.tag for g in gathers), "param_sync", "parameter all-gather")]

    def drain(self, d: int) -> tuple[Action, ...]:
        """After the last iteration, complete the gather chain the forward would have run."""
        if not self.overlapped():
            return ()
        out: list[Action] = []
        for w in self.forward_waits(d):
            out.append(Wait((w.tag,), "param_sync", f"wait {w.tag}"))
            if w.then is not None:
                out.append(w.then)
        return tuple(out)

    def prologue(self, d: int) -> tuple[Action, ...]:
        return (self._param_gathers(d)[0],) if self.overlapped() else ()

    # ------------------------------------------------------------------ ownership
    def matrix_items(self, d: int, t: int) -> tuple[int, ...]:
        """Matrices whose full update rank (d, t) computes."""
        plan = self.plan
        ours = self._once(("dp_matrices", d), lambda: tuple(
            i for i in range(len(plan.params)) if self.matrix[i] and plan.dp_owner[i] in (None, d)))
        piped = self._once(("piped", d), lambda: frozenset(self.pipelined(d)))
        if not piped:
            return ours
        return tuple(i for i in ours if i not in piped or plan.tp_owner[i] == t)

    def program(self, rank: int) -> Program:
        d, t = self.grid.coords(rank)
        actions = tuple(self.iteration(d, t))
        main = next((a.ranges for a in reversed(actions) if type(a) is CopyToModel), ())  # one, near the end
        drain = self._once(("drain", d), lambda: self.drain(d))
        prologue = self._once(("prologue", d), lambda: self.prologue(d))
        return Program(rank, d, t, self.dp, self.tp, actions, drain, prologue, self.matrix_items(d, t), main,
                       self.param_dtype)


def merge(ranges) -> Ranges:
    """Sorted, non-empty, with touching or overlapping ranges joined."""
    out: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def subtract(ranges: Ranges, holes) -> Ranges:
    """``ranges`` minus the (sorted) ``holes``."""
    out = []
    for a, b in ranges:
        cur = a
        for h0, h1 in holes:
            if h1 <= cur or h0 >= b:
                continue
            if h0 > cur:
                out.append((cur, h0))
            cur = max(cur, h1)
        if cur < b:
            out.append((cur, b))
    return tuple(out)


def lower(plan, ranks: Sequence[int] | None = None) -> list[Program]:
    """The programs of ``ranks`` (default: every rank), numbered as `canzona.layout.RankLayout` does;
    an MoE plan's hold its experts too (`canzona.program.experts`)."""
    low = _Lowering(plan) if plan.experts is None else MoeLowering(plan, _Lowering)
    return [low.program(r) for r in (range(low.grid.world) if ranks is None else ranks)]


def lower_rank(plan, rank: int) -> Program:
    return lower(plan, [rank])[0]


def comm_of(program: Program) -> dict[str, Comm]:
    """Tag -> communication action, for interpreters."""
    return {c.tag: c for c in program.comms()}
