"""The simulator's interpreter: every rank's `Program` on a `Timeline` with a hardware description.

It reads the same per-rank programs the executor runs and gives each action a duration:

- ``Forward`` / ``Backward``: the model's work (`canzona.sim.model`), identical on every rank,
  run in lockstep with Megatron's blocking TP all-reduces where each unit (embedding, layer,
  head) makes them, so DP traffic in flight overlaps them; forward waits, before the first
  unit using them, for the parameter gathers the previous iteration left in flight (then two
  iterations are simulated and the second measured); backward's walk lands each gradient in
  its bucket and fires the program's bucket hooks, which issue their reductions.
- communication actions: host time to pack the send buffer (``pack_elems``), then one
  collective per action over the action's group (``dp``/``tp`` stream of each member), starting
  when every member has issued it and its stream is free. The action's calls run back to back
  (their latencies add), except a ``coalesced`` group on a device that launches coalesced calls
  together (``Hardware.coalesces``): one latency, the transfers add; for a group of rooted
  reduces/broadcasts (uneven DP shards) the busiest member's transfers, which are every piece but
  its own.
- ``Wait``: the host blocks until the collective ends, then copies out (``finish_elems``). Of a
  parameter-sync wait, the part before the last DP peer issued the gather (that peer's optimizer
  step was still running) is kept apart as ``peer_ms``: step imbalance, not communication.
- ``Compute`` / ``Apply`` / ``Elementwise``: the hardware's optimizer, apply and AdamW costs.

After backward each rank runs on by itself; a rank stops at a ``Wait`` whose collective not
every member has issued yet. If no rank can move, the programs deadlock: an error naming the
blocked actions (the same check `canzona.program.check.check_matching` does statically).

A 256-rank projection interprets millions of actions, so what an action's interpretation reads
(its calls, group, copy and host seconds) is resolved once per simulation (`_compiled`, shared
between ranks where the lowering shares the action) and the arithmetic on the clocks is the
same, operation for operation, as one action at a time: projections are unchanged to the bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from canzona.hardware import Hardware
from canzona.layout import RankLayout
from canzona.plan.experts import rank_space
from canzona.program.actions import (
    DTYPE_BYTES,
    TRANSFER_TYPES,
    Apply,
    Backward,
    BucketReduce,
    ClipScale,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GradNorm,
    GramCompute,
    Mark,
    Program,
    Wait,
    dispatch_table,
)
from canzona.program.lower import comm_of
from canzona.sim.model import model_work
from canzona.sim.timeline import Handle, Timeline

# What a compiled action does (`ProgramSim._compiled`); _LOCKSTEP: forward and backward, which
# every rank runs together before its own actions
_WAIT, _ISSUE, _HOST, _MARK, _LOCKSTEP = range(5)


def call_bytes(c) -> float:
    """The bytes a collective call is priced by, as its rank sees it: an all-gather's output, an
    all-to-all's larger side beyond what stays local, the full buffer of the others."""
    width = DTYPE_BYTES[c.dtype]
    if c.op == "all_to_all":
        return max(c.in_elems - c.local_elems, c.out_elems - c.local_elems) * width
    return (c.out_elems if c.op == "all_gather" else c.in_elems) * width


class Deadlock(RuntimeError):
    """No rank can make progress: some collective is never issued by all its members."""


class ProgramSim:
    def __init__(self, cfg, plan, programs: Sequence[Program], hw: Hardware, scale: float, step_scale: float):
        self.cfg, self.plan, self.hw = cfg, plan, hw
        self.programs = list(programs)
        self.dp, self.tp = plan.dp, plan.tp
        self.grid: RankLayout = plan.rank_layout
        self.world = self.grid.world
        self.scale, self.step_scale = scale, step_scale
        self.tl = Timeline(self.world, hw.overlap, scale, hw.peer_wait_after if hw.peer_wait else None,
                           lag=hw.lag_after if hw.contention_s and hw.sched_wait_curve else None,  # else peer_wait
                           lanes=hw.comm_lanes)
        # On an oversubscribed CPU a rank blocked in a model unit's TP collective holds no core
        # (its wait is the calibrated scheduling wait, `Hardware.oversubscribed`): the unit's
        # blocked seconds pay its communication debt first (`Timeline.host_all`'s ``idle``)
        self.idle_absorbs = bool(hw.contention_s)
        # ... and a comm thread that no such idle time absorbs preempts the rank's compute, which
        # waits the calibrated scheduling wait for its core back (`Timeline._settle`)
        self.tl.preempt_s = hw.contention_s
        self.opt = cfg.optimizer.name if plan.matrix_rule else "adamw"
        self.ns = (cfg.optimizer.ns_dtype, cfg.optimizer.ns_steps)
        # Muon's opt-in stacked Newton–Schulz over a call's equal shapes (`Hardware.matrix_call`)
        self.stacked = self.opt == "muon" and bool(getattr(cfg.optimizer, "batch_equal_shapes", False))
        self.pending: dict[tuple, dict[int, tuple[float, Any]]] = {}
        self.handles: dict[tuple, Handle] = {}
        self.comms = [comm_of(p) for p in self.programs]
        # the gradient buckets' reductions: hidden behind the backward by their own measured share
        # (`Hardware.grad_reduce_overlap`), not by that of the other asynchronous collectives
        self.grad_tags = {tag for comms in self.comms for tag, c in comms.items() if isinstance(c, BucketReduce)}
        # CPU oversubscription: inside the optimizer step only the busy ranks compete for cores
        self.host_factor = [1.0] * self.world
        self.peer_s = [0.0] * self.world  # param-sync waits spent before the last peer issued
        # Derived once, read many times (ranks x actions x iterations): each rank's group of a
        # given axis, each group's hardware level (intra / inter node), per rank and tag the group of its collective
        # (None: no calls) and the seconds of its copy-out, and the host seconds of an action's
        # work by its content (ranks computing the same items cost the same).
        self._groups: dict[tuple[str, int], tuple[tuple, tuple[int, ...]]] = {}
        self._levels: dict[tuple, str] = {}
        self._gid = [{tag: self._group_of(r, c)[0] if c.calls() else None for tag, c in comms.items()}
                     for r, comms in enumerate(self.comms)]
        self._finish_s = [{tag: self._copy_out(c) for tag, c in comms.items()} for comms in self.comms]
        self._host_s: dict[tuple, float] = {}
        self._spaces: dict[int | None, Any] = {}  # `_space`
        self._ops: list[list[tuple]] | None = None  # `_compiled`

    # ------------------------------------------------------------------ groups
    def members(self, axis: str, r: int) -> tuple[tuple, list[int]]:
        """(group id, members) of rank r's ``axis`` group (`canzona.layout.RankLayout.group`)."""
        return self.grid.group(axis, r)

    def _group(self, axis: str, r: int) -> tuple[tuple, tuple[int, ...]]:
        """`members`, kept (read-only tuples)."""
        key = (axis, r)
        g = self._groups.get(key)
        if g is None:
            gid, members = self.members(axis, r)
            g = self._groups[key] = (gid, tuple(members))
        return g

    def _group_of(self, r: int, comm) -> tuple[tuple, tuple[int, ...]]:
        return self._group(comm.calls()[0].axis, r)

    def _level(self, gid: tuple, members: Sequence[int]) -> str:
        level = self._levels.get(gid)
        if level is None:
            level = self._levels[gid] = self.hw.level(members)
        return level

    def _copy_out(self, comm) -> float | None:
        """Seconds of the host copy after a wait on `comm` (None: nothing to copy)."""
        if not comm.finish_elems:
            return None
        return self.hw.copy(comm.finish_elems * DTYPE_BYTES[comm.calls()[0].dtype])

    def _key(self, r: int, comm, it: int | None = None) -> tuple:
        gid = self._gid[r][comm.tag]
        return (gid, comm.tag, self.it if it is None else it)

    def host(self, r: int, seconds: float) -> None:
        self.tl.host(r, seconds * self.host_factor[r])

    # ------------------------------------------------------------------ communication
    def issue(self, r: int, comm) -> None:
        calls = comm.calls()
        if not calls:
            return
        if comm.pack_elems:
            self.host(r, self.hw.copy(comm.pack_elems * DTYPE_BYTES[calls[0].dtype]))
        gid, members = self._group(calls[0].axis, r)
        self._issued(r, (gid, comm.tag, self.it), calls, members, calls[0].axis)

    def _issued(self, r: int, key: tuple, calls, members: Sequence[int], axis: str, inside_s: float = 0.0) -> None:
        """Rank r has issued its calls of collective ``key``; the last member to issue resolves it.
        ``inside_s``: the rank's compute between the calls (`GramCompute`), run in lockstep with
        the group's, so the collective lasts the slowest member's compute more."""
        slot = self.pending.get(key)
        if slot is None:
            slot = self.pending[key] = {}
        slot[r] = (self.tl.cpu[r], calls, inside_s, self.tl.busy[r])
        if len(slot) == len(members):
            self._resolve(key, members, self.pending.pop(key), axis)

    def _seconds(self, per_member: list, members: Sequence[int], level: str | None = None) -> tuple[float, float]:
        """(seconds, transfer seconds) of one action's calls over ``members`` (``level``: the
        hardware's level of that group, if known)."""
        hw = self.hw
        first = per_member[0]
        level = level or hw.level(members)
        lats, trs = [], []
        for k, c in enumerate(first):
            # an all-to-all's busiest member sets its bytes
            nbytes = max(call_bytes(m[k]) for m in per_member) if c.op == "all_to_all" else call_bytes(c)
            lat, tr = hw.collective_parts(c.op, nbytes, members, level)
            lats.append(lat)
            trs.append(tr)
        if not (first[0].coalesced and hw.coalesces):
            return sum(lats) + sum(trs), sum(trs)
        if all(c.op in ("reduce", "broadcast") and c.root is not None for c in first):
            # rooted calls launched together (uneven DP shards): each piece travels a chain that
            # every member but its root forwards, so a member's links carry every piece but its
            # own; the busiest member sets the time (even pieces: exactly the ring's (P-1)/P)
            busiest = max(sum(tr for tr, c in zip(trs, first) if c.root != k) for k in range(len(members)))
            return max(lats) + busiest, busiest
        return max(lats) + sum(trs), sum(trs)

    def _resolve(self, key: tuple, members: list[int], slot: dict[int, tuple[float, Any]], axis: str) -> None:
        per_member = [slot[r][1] for r in members]
        seconds, transfer = self._seconds(per_member, members, self._level(key[0], members))
        seconds += max(slot[r][2] for r in members)
        self.handles[key] = self.tl.collective(members, axis, seconds, key[1], transfer,
                                               issued=[slot[r][0] for r in members],
                                               worked=[slot[r][3] for r in members],
                                               overlap=self.hw.grad_reduce_overlap if key[1] in self.grad_tags else None)

    def handle(self, r: int, tag: str, it: int | None = None) -> Handle | None:
        gid = self._gid[r][tag]
        if gid is None:  # no calls: done the moment it is waited for
            return Handle(tag, self.tl.cpu[r], self.tl.cpu[r])
        return self.handles.get((gid, tag, self.it if it is None else it))

    def _wait(self, r: int, h: Handle, phase: str) -> None:
        """Block rank r on `h`; book to ``peer_s`` the part of a parameter-sync wait that passes
        before the last member has issued the collective."""
        if phase == "param_sync":
            self.peer_s[r] += max(0.0, min(h.ready, h.end) - self.tl.cpu[r])
        self.tl.wait(r, h)

    def peer_ms(self, r: int) -> float:
        """Rank r's parameter-sync wait, in the measured iteration, for peers still in their step."""
        return self.peer_s[r] * 1e3

    def gather_ms(self, r: int) -> float:
        """The measured iteration's parameter all-gathers' own time on rank r (start to end)."""
        total = 0.0
        for comm in self.comms[r].values():
            if comm.phase != "param_sync" or self._gid[r][comm.tag] is None:
                continue
            h = self.handles.get(self._key(r, comm)) or self.handles.get(self._key(r, comm, self.it - 1))
            if h is not None:
                total += h.end - h.start
        return total * 1e3

    def _finish(self, r: int, tag: str) -> None:
        """Host work after a wait: the copy-out of what the collective brought."""
        seconds = self._finish_s[r][tag]
        if seconds is not None:
            self.host(r, seconds)

    # ------------------------------------------------------------------ the iteration
    def run(self) -> None:
        """Simulate one iteration; when the programs leave parameter gathers in flight for the
        next forward (overlapped gather), simulate two and measure the second (steady state)."""
        first = [p.actions[:2] for p in self.programs]
        if not all(isinstance(a[0], Forward) and isinstance(a[1], Backward) for a in first):
            raise ValueError("every program must start with Forward, Backward")
        moe = self.plan.experts is not None
        self.work = model_work(self.cfg, self.plan, self.hw, self.members("tp", 0)[1],
                               self.members("ep", 0)[1] if moe else (), self.members("etp", 0)[1] if moe else ())
        overlapped = any(p.actions[0].waits for p in self.programs)
        self.it = -1
        for r, p in enumerate(self.programs):  # gathers "left by a previous step"
            for a in p.prologue:
                self.issue(r, a)
        self.it = 0
        if overlapped:
            self._iteration()
            self.it = 1
            self.tl.restart()
            self.peer_s = [0.0] * self.world
        self._iteration()

    def _iteration(self) -> None:
        tl, work = self.tl, self.work
        everyone = list(range(self.world))
        ops = self._compiled()
        start = 0  # forward/backward pairs (one per micro-batch) run in lockstep on every rank
        while ops[0][start][0] == _LOCKSTEP:
            ops[0][start][1](work, start)
            start += 1
        pc = [start] * self.world
        active = set(everyone)
        handles, it = self.handles, self.it
        cpu, factor = tl.cpu, self.host_factor
        while active:
            moved = False
            for r in sorted(active):
                rops = ops[r]
                n, k = len(rops), pc[r]
                while k < n:
                    op = rops[k]
                    code = op[0]
                    if code == _WAIT:
                        _, waits, phase, label = op
                        if any(g is not None and (g, t, it) not in handles for t, g, _ in waits):
                            break  # a collective it waits for is not issued by every member yet
                        start = tl.open(r)
                        for tag, g, finish_s in waits:
                            self._wait(r, Handle(tag, cpu[r], cpu[r]) if g is None else handles[(g, tag, it)], phase)
                            if finish_s is not None:  # the copy-out of what it brought
                                tl.host(r, finish_s * factor[r])
                        tl.close(r, start, phase, label)
                    elif code == _ISSUE:
                        _, calls, gid, members, axis, pack_s, phase, tag, inside_s = op
                        start = tl.open(r)
                        if pack_s is not None:  # packing the send buffer
                            tl.host(r, pack_s * factor[r])
                        self._issued(r, (gid, tag, it), calls, members, axis,
                                     inside_s * factor[r] * tl.scale if inside_s else 0.0)
                        tl.close(r, start, phase, tag)
                    elif code == _HOST:
                        _, seconds, phase, tag = op
                        tl.span(r, None if seconds is None else seconds * factor[r], phase, tag)
                    elif code == _MARK:
                        name = op[1]
                        tl.mark([r], name)
                        if name == "step_start":
                            factor[r] = self.step_scale / self.scale
                        elif name == "step_end":
                            factor[r] = 1.0
                    else:
                        raise TypeError(f"rank {r}: forward and backward run only before the rank's other actions")
                    k += 1
                    moved = True
                pc[r] = k
                if k == n:
                    tl.mark([r], "end")
                    active.discard(r)
            if active and not moved:
                blocked = sorted({(r, self.programs[r].actions[pc[r]].tags) for r in active})[:4]
                raise Deadlock(f"no rank can proceed; blocked at {blocked}")

    def _compiled(self) -> list[list[tuple]]:
        """Per rank, its actions with everything an iteration reads of them resolved once
        (`_COMPILE`): a wait's collectives (group, copy-out seconds), an issue's calls, group and
        packing seconds, a host action's seconds. The same for every iteration (kept)."""
        if self._ops is not None:
            return self._ops
        out = []
        table = self._COMPILE
        same: dict[int, tuple] = {}  # id(action) -> its op, for ops the same on every rank
        for r, p in enumerate(self.programs):
            rops: list[tuple] = []
            for a in p.actions:
                op = same.get(id(a))
                if op is None:
                    compile_op = table.get(type(a))
                    if compile_op is None:
                        raise TypeError(f"the simulator cannot run {type(a).__name__}")
                    op, shared = compile_op(self, a, r)
                    if shared:  # the programs (and so the action) outlive this loop: ids stay unique
                        same[id(a)] = op
                rops.append(op)
            out.append(rops)
        self._ops = out
        return out

    # Each `_COMPILE` handler gives (op, shared): the action's op on rank r and whether every
    # rank holding the same action object has the same op.
    def _lockstep_op(self, a: Forward | Backward, r: int) -> tuple[tuple, bool]:
        return (_LOCKSTEP, self._forward if type(a) is Forward else self._backward), True

    def _wait_op(self, a: Wait, r: int) -> tuple[tuple, bool]:
        gids, finish = self._gid[r], self._finish_s[r]
        return (_WAIT, tuple((t, gids[t], finish[t]) for t in a.tags), a.phase, a.label or None), False

    def _mark_op(self, a: Mark, r: int) -> tuple[tuple, bool]:
        return (_MARK, a.name), True

    def _issue_op(self, a, r: int) -> tuple[tuple, bool]:
        calls = a.calls()
        if not calls:
            return (_HOST, None, a.phase, a.tag), True
        gid, members = self._group(calls[0].axis, r)
        pack = self.hw.copy(a.pack_elems * DTYPE_BYTES[calls[0].dtype]) if a.pack_elems else None
        cpu = self._call_cpu(calls, members, self._level(gid, members))
        if cpu:  # the calls' own CPU (caller and gloo's threads), where it costs the rank's cores
            pack = (pack or 0.0) + cpu
        return (_ISSUE, calls, gid, members, calls[0].axis, pack, a.phase, a.tag, 0.0), False

    def _call_cpu(self, calls, members: Sequence[int], level: str) -> float:
        """Seconds of CPU the rank's ``calls`` cost its process that its host pays
        (`Hardware.call_cpu`: an oversubscribed CPU), each call's bytes as this rank sees them."""
        return sum(self.hw.call_cpu(c.op, call_bytes(c), members, level) for c in calls)

    def _gram_op(self, a: GramCompute, r: int) -> tuple[tuple, bool]:
        """Issued as a collective whose length is its calls' plus the rank's Newton–Schulz of
        its shards (`Hardware.gram_call`): each of its blocking all-reduces waits for every TP
        rank's step, and every member computes the same shapes, so in lockstep the compute and
        the all-reduces add. The host is then blocked in the action's `Wait`."""
        op, _ = self._issue_op(a, r)
        space = self._space(r)
        params = space.params
        inside = self._host_s.get(("gram", a.items, space.ep_rank))
        if inside is None:
            inside = self._host_s[("gram", a.items, space.ep_rank)] = self.hw.gram_call(
                [(shape, params[i].tp_dim) for i in a.items for _, shape in params[i].matrices], a.tp, *self.ns)
        return (*op[:-1], inside), False

    def _host_op(self, a, key: tuple, seconds: Callable[[], float]) -> tuple[tuple, bool]:
        """Host seconds of a rank's own work after backward: the same for every rank doing the
        same items or ranges of the same params, so kept by content (``key``)."""
        s = self._host_s.get(key)
        if s is None:
            s = self._host_s[key] = seconds()
        return (_HOST, s, a.phase, a.tag), True

    def _compute_op(self, a: Compute, r: int) -> tuple[tuple, bool]:
        space = self._space(r)
        return self._host_op(a, ("compute", a.items, space.ep_rank), lambda: self.hw.matrix_call(
            self.opt, [shape for i in a.items for _, shape in space.params[i].matrices], *self.ns, stacked=self.stacked))

    def _apply_op(self, a: Apply, r: int) -> tuple[tuple, bool]:
        space = self._space(r)
        params = space.params
        return self._host_op(a, ("apply", a.items, space.ep_rank), lambda: self.hw.apply(
            params[i].local_numel(space.split_over(i, self.tp)) for i in a.items))

    def _elementwise_op(self, a: Elementwise, r: int) -> tuple[tuple, bool]:
        return self._host_op(a, ("adamw", a.ranges), lambda: self.hw.adamw(e - s for s, e in a.ranges))

    def _grad_pass_op(self, a: GradNorm | ClipScale, r: int) -> tuple[tuple, bool]:
        """One pass over the fp32 gradient ranges."""
        kind = "norm" if type(a) is GradNorm else "scale"
        return self._host_op(a, ("pass", type(a).__name__, a.ranges), lambda: self.hw.grad_pass(
            kind, 4 * sum(e - s for s, e in a.ranges), calls=len(a.ranges)))

    def _copy_to_model_op(self, a: CopyToModel, r: int) -> tuple[tuple, bool]:
        """fp32 main -> model parameters (in the training dtype)."""
        return self._host_op(a, ("pass", type(a).__name__, a.ranges), lambda: self.hw.cast(
            sum(e - s for s, e in a.ranges), self.plan.execution.dtype, calls=len(a.ranges)))

    _COMPILE = dispatch_table({
        (Forward, Backward): _lockstep_op, Wait: _wait_op, Mark: _mark_op, TRANSFER_TYPES: _issue_op, GramCompute: _gram_op,
        Compute: _compute_op, Apply: _apply_op, Elementwise: _elementwise_op, (GradNorm, ClipScale): _grad_pass_op,
        CopyToModel: _copy_to_model_op,
    })

    def _forward(self, work, index: int) -> None:
        """Forward in lockstep (identical model work on every rank); each rank first waits for
        the parameter gathers its program lists before the first unit that uses them."""
        tl = self.tl
        everyone = list(range(self.world))
        waits = [{w.param: w for w in p.actions[index].waits} for p in self.programs]
        waited = set().union(*waits)  # params some rank waits for
        # a unit's params are in registration order, its waits in the order the forward uses them
        # (linear_proj is registered before linear_qkv and runs after it): take them as chained
        chained = {}
        for p in self.programs:
            for k, w in enumerate(p.actions[index].waits):
                chained[w.param] = min(k, chained.get(w.param, k))
        tp_groups = [self._group("tp", self.grid.rank_of(d, 0))[1] for d in range(self.dp)]
        with tl.phase(everyone, "forward"):
            for items, sec, tp_sec in work.forward_units:
                # a chained gather must be issued by every member before it is waited for
                for i in sorted((i for i in items if i in waited), key=chained.__getitem__):
                    for r in everyone:
                        w = waits[r].get(i)
                        if w is None:
                            continue
                        h = self.handle(r, w.tag) or self.handle(r, w.tag, self.it - 1)
                        start = tl.open(r)
                        self._wait(r, h, "param_sync")
                        self._finish(r, w.tag)
                        if w.then is not None:
                            self.issue(r, w.then)
                        tl.close(r, start, "param_sync", f"wait {w.tag}")
                tl.host_all(everyone, sec, idle=tp_sec if self.idle_absorbs else 0.0)
                if self.tp > 1 and tp_sec > 0:  # the unit's own TP all-reduces, on the TP stream
                    for members in tp_groups:
                        tl.blocking(members, "tp", tp_sec, "forward TP all-reduces")

    def _backward(self, work, index: int) -> None:
        """Backward in lockstep; each buffer's buckets (the dense one's, an MoE rank's expert
        buffer's: `RankSpace.chains`) launch in order among themselves as they fill."""
        tl = self.tl
        everyone = list(range(self.world))
        space = self._space(0)  # every rank's buffers have the same buckets (EP ranks: equal experts)
        layout = space.layout
        bucket_of = {s.index: b.index for b in layout.buckets for s in b.params}
        backward = [p.actions[index] for p in self.programs]
        hooks = [{h.bucket: h.issue for h in b.hooks} for b in backward]
        ready = [0] * len(layout.buckets)
        chains = [[lo, hi] for lo, hi in space.chains]  # per chain: next bucket to launch, end
        with tl.phase(everyone, "backward"):
            for sec, done, comm in work.backward_units:
                tl.host_all(everyone, sec, comm, idle=comm if self.idle_absorbs else 0.0)
                for i in done:
                    ready[bucket_of[i]] += 1
                for chain in chains:
                    while chain[0] < chain[1] and ready[chain[0]] == len(layout.buckets[chain[0]].params):
                        for r in everyone:
                            for comm in hooks[r].get(chain[0], ()):
                                self.issue(r, comm)
                        chain[0] += 1

    def _space(self, r: int):
        """Rank r's params and buffer (`canzona.plan.experts.RankSpace`), one per EP rank."""
        ep_rank = self.grid.experts.coords(r)[1] if self.grid.experts is not None else None
        space = self._spaces.get(ep_rank)
        if space is None:
            space = self._spaces[ep_rank] = rank_space(self.plan, r)
        return space
