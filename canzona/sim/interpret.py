"""The simulator's interpreter: every rank's `Program` on a `Timeline` with a device profile.

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
  together (``Profile.coalesces``): one latency, the transfers add; for a group of rooted
  reduces/broadcasts (uneven DP shards) the busiest member's transfers, which are every piece but
  its own.
- ``Wait``: the host blocks until the collective ends, then copies out (``finish_elems``). Of a
  parameter-sync wait, the part before the last DP peer issued the gather (that peer's optimizer
  step was still running) is kept apart as ``peer_ms``: step imbalance, not communication.
- ``Compute`` / ``Apply`` / ``Elementwise``: the profile's optimizer, apply and AdamW costs.

After backward each rank runs on by itself; a rank stops at a ``Wait`` whose collective not
every member has issued yet. If no rank can move, the programs deadlock: an error naming the
blocked actions (the same check `canzona.program.check.check_matching` does statically).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from canzona.program.actions import (
    COMM_TYPES,
    DTYPE_BYTES,
    Apply,
    Backward,
    ClipScale,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GradNorm,
    Mark,
    Program,
    Wait,
)
from canzona.sim.model import model_work
from canzona.sim.profile import Profile
from canzona.sim.timeline import Handle, Timeline


class Deadlock(RuntimeError):
    """No rank can make progress: some collective is never issued by all its members."""


class ProgramSim:
    def __init__(self, cfg, plan, programs: Sequence[Program], prof: Profile, scale: float, step_scale: float):
        self.cfg, self.plan, self.prof = cfg, plan, prof
        self.programs = list(programs)
        self.dp, self.tp = plan.dp, plan.tp
        self.world = self.dp * self.tp
        self.scale, self.step_scale = scale, step_scale
        self.tl = Timeline(self.world, prof.overlap, scale)
        self.opt = cfg.optimizer.name if plan.matrix_rule else "adamw"
        self.ns = (cfg.optimizer.ns_dtype, cfg.optimizer.ns_steps)
        self.pending: dict[tuple, dict[int, tuple[float, Any]]] = {}
        self.handles: dict[tuple, Handle] = {}
        self.comms = [{c.tag: c for c in p.comms()} for p in self.programs]
        # CPU oversubscription: inside the optimizer step only the busy ranks compete for cores
        self.host_factor = [1.0] * self.world
        self.peer_s = [0.0] * self.world  # param-sync waits spent before the last peer issued

    # ------------------------------------------------------------------ groups
    def members(self, axis: str, r: int) -> tuple[tuple, list[int]]:
        d, t = divmod(r, self.tp)
        if axis == "dp":
            return ("dp", t), [x * self.tp + t for x in range(self.dp)]
        if axis == "tp":
            return ("tp", d), [d * self.tp + x for x in range(self.tp)]
        return ("world", 0), list(range(self.world))

    def _key(self, r: int, comm, it: int | None = None) -> tuple:
        axis = comm.calls()[0].axis
        gid, _ = self.members(axis, r)
        return (gid, comm.tag, self.it if it is None else it)

    def host(self, r: int, seconds: float) -> None:
        self.tl.host(r, seconds * self.host_factor[r])

    # ------------------------------------------------------------------ communication
    def issue(self, r: int, comm) -> None:
        calls = comm.calls()
        if not calls:
            return
        width = DTYPE_BYTES[calls[0].dtype]
        if comm.pack_elems:
            self.host(r, self.prof.copy(comm.pack_elems * width))
        gid, members = self.members(calls[0].axis, r)
        key = (gid, comm.tag, self.it)
        slot = self.pending.setdefault(key, {})
        slot[r] = (self.tl.cpu[r], calls)
        if len(slot) == len(members):
            self._resolve(key, members, self.pending.pop(key), calls[0].axis)

    def _seconds(self, per_member: list, members: list[int]) -> tuple[float, float]:
        """(seconds, transfer seconds) of one action's calls over ``members``."""
        prof = self.prof
        n_calls = len(per_member[0])
        lats, trs = [], []
        for k in range(n_calls):
            calls = [m[k] for m in per_member]
            c = calls[0]
            width = DTYPE_BYTES[c.dtype]
            if c.op == "all_to_all":
                nbytes = max(max(x.in_elems - x.local_elems, x.out_elems - x.local_elems) for x in calls) * width
            elif c.op == "all_gather":
                nbytes = c.out_elems * width
            else:  # all_reduce, reduce_scatter, reduce, broadcast: the full buffer
                nbytes = c.in_elems * width
            lat, tr = prof.collective_parts(c.op, nbytes, members)
            lats.append(lat)
            trs.append(tr)
        first = per_member[0]
        if not (first[0].coalesced and prof.coalesces):
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
        seconds, transfer = self._seconds(per_member, members)
        self.handles[key] = self.tl.collective(members, axis, seconds, key[1], transfer,
                                               issued=[slot[r][0] for r in members])

    def handle(self, r: int, tag: str, it: int | None = None) -> Handle | None:
        comm = self.comms[r][tag]
        if not comm.calls():
            return Handle(tag, self.tl.cpu[r], self.tl.cpu[r])
        return self.handles.get(self._key(r, comm, it))

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
            if comm.phase != "param_sync":
                continue
            h = self.handles.get(self._key(r, comm)) or self.handles.get(self._key(r, comm, self.it - 1))
            if h is not None:
                total += h.end - h.start
        return total * 1e3

    def _finish(self, r: int, tag: str) -> None:
        """Host work after a wait: the copy-out of what the collective brought."""
        comm = self.comms[r][tag]
        if comm.finish_elems:
            self.host(r, self.prof.copy(comm.finish_elems * DTYPE_BYTES[comm.calls()[0].dtype]))

    # ------------------------------------------------------------------ the iteration
    def run(self) -> None:
        """Simulate one iteration; when the programs leave parameter gathers in flight for the
        next forward (overlapped gather), simulate two and measure the second (steady state)."""
        first = [p.actions[:2] for p in self.programs]
        if not all(isinstance(a[0], Forward) and isinstance(a[1], Backward) for a in first):
            raise ValueError("every program must start with Forward, Backward")
        self.work = model_work(self.cfg, self.plan, self.prof, self.members("tp", 0)[1])
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
        start = 0  # forward/backward pairs (one per micro-batch) run in lockstep on every rank
        while isinstance(self.programs[0].actions[start], (Forward, Backward)):
            if isinstance(self.programs[0].actions[start], Forward):
                self._forward(work, start)
            else:
                self._backward(work, start)
            start += 1
        pc = [start] * self.world
        active = set(everyone)
        while active:
            moved = False
            for r in sorted(active):
                acts = self.programs[r].actions
                while pc[r] < len(acts):
                    a = acts[pc[r]]
                    if isinstance(a, Wait) and any(self.handle(r, t) is None for t in a.tags):
                        break
                    self._do(r, a)
                    pc[r] += 1
                    moved = True
                if pc[r] == len(acts):
                    tl.mark([r], "end")
                    active.discard(r)
            if active and not moved:
                blocked = sorted({(r, self.programs[r].actions[pc[r]].tags) for r in active})[:4]
                raise Deadlock(f"no rank can proceed; blocked at {blocked}")

    def _forward(self, work, index: int) -> None:
        """Forward in lockstep (identical model work on every rank); each rank first waits for
        the parameter gathers its program lists before the first unit that uses them."""
        tl = self.tl
        everyone = list(range(self.world))
        waits = [{w.param: w for w in p.actions[index].waits} for p in self.programs]
        with tl.phase(everyone, "forward"):
            for items, sec, tp_sec in work.forward_units:
                for i in items:  # a chained gather must be issued by every member before it is waited for
                    for r in everyone:
                        w = waits[r].get(i)
                        if w is None:
                            continue
                        h = self.handle(r, w.tag) or self.handle(r, w.tag, self.it - 1)
                        with tl.phase([r], "param_sync", f"wait {w.tag}"):
                            self._wait(r, h, "param_sync")
                            self._finish(r, w.tag)
                            if w.then is not None:
                                self.issue(r, w.then)
                for r in everyone:
                    tl.host(r, sec)
                if self.tp > 1 and tp_sec > 0:  # the unit's own TP all-reduces, on the TP stream
                    for d in range(self.dp):
                        tl.blocking(self.members("tp", d * self.tp)[1], "tp", tp_sec, "forward TP all-reduces")

    def _backward(self, work, index: int) -> None:
        tl = self.tl
        everyone = list(range(self.world))
        layout = self.plan.layout
        bucket_of = {s.index: b.index for b in layout.buckets for s in b.params}
        backward = [p.actions[index] for p in self.programs]
        hooks = [{h.bucket: h.issue for h in b.hooks} for b in backward]
        ready = [0] * len(layout.buckets)
        launched = 0
        with tl.phase(everyone, "backward"):
            for sec, done in work.backward_units:
                for r in everyone:
                    tl.host(r, sec)
                for i in done:
                    ready[bucket_of[i]] += 1
                while launched < len(layout.buckets) and ready[launched] == len(layout.buckets[launched].params):
                    for r in everyone:
                        for comm in hooks[r].get(launched, ()):
                            self.issue(r, comm)
                    launched += 1

    def _do(self, r: int, a) -> None:
        tl, prof = self.tl, self.prof
        plan = self.plan
        if isinstance(a, Mark):
            tl.mark([r], a.name)
            if a.name == "step_start":
                self.host_factor[r] = self.step_scale / self.scale
            elif a.name == "step_end":
                self.host_factor[r] = 1.0
            return
        if isinstance(a, COMM_TYPES):
            with tl.phase([r], a.phase, a.tag):
                self.issue(r, a)
        elif isinstance(a, Wait):
            with tl.phase([r], a.phase, a.label or None):
                for tag in a.tags:
                    self._wait(r, self.handle(r, tag), a.phase)
                    self._finish(r, tag)
        elif isinstance(a, Compute):
            shapes = [shape for i in a.items for _, shape in plan.params[i].matrices]
            with tl.phase([r], a.phase, a.tag):
                self.host(r, prof.matrix_call(self.opt, shapes, *self.ns))
        elif isinstance(a, Apply):
            with tl.phase([r], a.phase, a.tag):
                self.host(r, prof.apply(plan.params[i].local_numel(self.tp) for i in a.items))
        elif isinstance(a, Elementwise):
            with tl.phase([r], a.phase, a.tag):
                self.host(r, prof.adamw(e - s for s, e in a.ranges))
        elif isinstance(a, (GradNorm, ClipScale, CopyToModel)):
            # one pass over fp32 gradients (norm, scaling) or fp32 main -> model parameters
            with tl.phase([r], a.phase, a.tag):
                self.host(r, prof.copy(4 * sum(e - s for s, e in a.ranges), calls=len(a.ranges)))
        else:
            raise TypeError(f"the simulator cannot run {type(a).__name__} after backward")

    # ------------------------------------------------------------------ results
    def step_runnable(self) -> float:
        """Mean number of ranks doing host work during the optimizer step (busy time / window)."""
        m = self.tl.marks
        window = max(x["step_end"] for x in m) - min(x["step_start"] for x in m)
        busy = sum(x["step_end:busy"] - x["step_start:busy"] for x in m)
        return busy / window if window > 0 else float(self.world)
