"""A discrete per-rank timeline: host clocks, comm streams, collectives that synchronise groups.

Each rank has a host clock (what its Python thread / compute stream is doing) and one comm
stream per process-group kind ("dp", "tp"). The simulator drives the timeline SPMD-style: it
applies an operation to a set of ranks at once, in the program order every rank follows, so a
collective is only created once every member has reached it. Rules:

- host work advances that rank's host clock;
- a collective starts when every member has issued it (their host clocks) and every member's
  stream for that group kind is free, runs for the hardware's time, and occupies those streams
  (``lanes`` > 1: a stream runs that many collectives at once -- gloo's worker threads, two per
  process group by default -- each taking the lane that frees first, in issue order)
  (collectives of one group kind run in issue order, as on one NCCL communicator or gloo pair);
- waiting on a collective moves the host clock to its end (if later);
- ``overlap`` < 1 (CPU / gloo: communication shares the cores with compute): a fraction
  ``1 - overlap`` of each collective's busy time (`Hardware.collective_parts`: on a GPU the
  transfer; on a CPU the latency too, gloo's calls run on the rank's cores) is
  charged to each member's host as a debt, paid by the next host work, less whatever time the
  host spent idle waiting meanwhile, or will spend blocked in the same unit of model work
  (`host_all`'s ``idle``: an oversubscribed CPU's forward and backward TP collectives).
- ``preempt_s`` (an oversubscribed CPU: the calibrated scheduling wait): a comm thread whose work
  no idle time absorbs preempts the rank's compute, and the rank waits that long for its core
  back, once per collective whose debt its host work pays (`_settle`).

- ``peer_wait`` (CPU calibrations: `canzona.calibrate.peer_wait`): a collective starts that much
  later than its last member issues it, a function of the most host work a member did since its
  own previous collective: ranks that computed apart drift apart on a shared machine, and the
  first to arrive waits, idle, for the last.

``scale`` multiplies the durations of what keeps a CPU busy (oversubscribed CPU cores: host work
and a collective's transfer); a collective's latency, and the communication inside a model
unit's host time (``host_all``'s ``comm``), waits on peers without holding a core and is not
stretched. The simulator may change ``scale`` between segments of the iteration.
Phases are recorded as the executor's `StepTimer` records them: ``{"name", "cat", "start_ms",
"dur_ms"}`` per block (`rank_events`; kept as tuples until read: a 256-rank projection records
millions of blocks and reads a few ranks'), with the block's milliseconds accumulated per phase
name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from canzona.records import CATEGORY


@dataclass
class Handle:
    label: str
    start: float
    end: float
    ready: float = 0.0  # when the last member issued it (the start may be later: a busy stream)


class Timeline:
    def __init__(self, world: int, overlap: float = 1.0, scale: float = 1.0,
                 peer_wait: Callable[[float], float] | None = None, lanes: int = 1,
                 lag: Callable[[float], float] | None = None):
        self.world = world
        self.lag = lag or peer_wait
        self.lanes = max(1, int(lanes))
        # per stream, per rank, when each lane frees (``lanes`` > 1; ``streams`` otherwise)
        self.lane_clocks: dict[str, list[list[float]]] = defaultdict(lambda: [[0.0] * self.lanes for _ in range(world)])
        self.peer_wait = peer_wait
        self.overlap = min(1.0, max(0.0, overlap))
        self.scale = scale
        self.cpu = [0.0] * world
        self.debt = [0.0] * world
        self.preempt_s = 0.0
        self.owed_calls = [0] * world  # collectives whose debt is still outstanding (`_settle`)
        self.streams: dict[str, list[float]] = defaultdict(lambda: [0.0] * world)
        # per rank, its phase blocks as (name, phase, start_ms, dur_ms): dicts only when read
        self.events: list[list[tuple[str, str, float, float]]] = [[] for _ in range(world)]
        self.stream_events: list[list[dict]] = [[] for _ in range(world)]
        self.phase_s: list[dict[str, float]] = [defaultdict(float) for _ in range(world)]
        self.marks: list[dict[str, float]] = [{} for _ in range(world)]
        self.busy = [0.0] * world  # host work done (seconds), for CPU-sharing estimates
        self.met = [0.0] * world  # each rank's ``busy`` when it last issued a collective (`peer_wait`)
        self.origin = [0.0] * world  # each rank's start of the measured iteration
        self._nested: list[list[float]] = [[] for _ in range(world)]

    def restart(self) -> None:
        """Start measuring a new iteration from each rank's current time: phases, events and
        marks are cleared; clocks, streams and collectives in flight carry over."""
        self.origin = list(self.cpu)
        for r in range(self.world):
            self.phase_s[r].clear()
            self.events[r].clear()
            self.stream_events[r] = []
            self.marks[r] = {}

    # ------------------------------------------------------------------ host side
    def _settle(self, r: int, owed: float) -> float:
        """Seconds rank r's host loses paying ``owed`` of its comm debt with its own work: the
        debt, plus `preempt_s` per collective it was for (its comm thread preempted the work);
        nothing once idle time has paid it all. The debt is settled either way."""
        calls = self.owed_calls[r]
        self.debt[r] = 0.0
        self.owed_calls[r] = 0
        if not owed > 0.0:
            return 0.0
        return owed + self.preempt_s * calls

    def host(self, r: int, seconds: float) -> None:
        """Host work on rank r (plus any communication debt it has to pay, `_settle`)."""
        work = seconds * self.scale
        self.busy[r] += work + self.debt[r]
        self.cpu[r] += work + self._settle(r, self.debt[r])

    def host_all(self, ranks: Sequence[int], seconds: float, comm: float = 0.0, idle: float = 0.0) -> None:
        """`host` on each of `ranks` (the same work on every rank, one call); ``comm``: the part
        of ``seconds`` spent in blocking collectives, not stretched by ``scale``; ``idle``:
        seconds the ranks will sit idle in blocking collectives within the same unit of work,
        which pay the debt before the work does (a rank blocked on its peers leaves its core to
        its own comm thread: on an oversubscribed CPU the forward's TP collectives absorb the
        parameter gathers in flight)."""
        cpu, busy, debt, settle = self.cpu, self.busy, self.debt, self._settle
        work = seconds * self.scale if self.scale == 1.0 or not comm else (seconds - comm) * self.scale + comm
        for r in ranks:
            owed = debt[r] - idle
            if owed > 0.0:
                busy[r] += work + owed
                cpu[r] += work + settle(r, owed)
            else:
                busy[r] += work
                cpu[r] += work
                if debt[r]:
                    settle(r, 0.0)

    def wait(self, r: int, handle: Handle) -> None:
        # idle = max(0, end - cpu); cpu = max(cpu, end); debt = max(0, debt - idle), spelled out
        cpu, end = self.cpu[r], handle.end
        idle = end - cpu
        if not idle > 0.0:
            idle = 0.0
        if end > cpu:
            self.cpu[r] = end
        debt = self.debt[r] - idle
        if debt > 0.0:
            self.debt[r] = debt
        else:
            self.debt[r] = 0.0
            self.owed_calls[r] = 0

    def mark(self, ranks: Sequence[int], name: str) -> None:
        """Record each rank's time (since its ``origin``) under ``name``; ``name:busy`` its host
        work so far, ``name:apart`` the host work since its last collective (`slowest_lag`)."""
        for r in ranks:
            self.marks[r][name] = self.cpu[r] - self.origin[r]
            self.marks[r][f"{name}:busy"] = self.busy[r]
            self.marks[r][f"{name}:apart"] = self.busy[r] - self.met[r]

    def slowest_lag(self, name: str) -> float:
        """How much later than the simulated ranks the slowest real rank reaches mark ``name``:
        the ranks left their last collective together and each did its ``name:apart`` seconds of
        work since, which on a shared machine they finish apart (``lag``, else `peer_wait`: the
        later of two after that much work; `canzona.hardware.Hardware.lag_after`). A measurement
        that takes the max over ranks of a span ending at the mark (the optimizer step) reads
        that much more than the lockstep timeline; 0 without a drift curve or with one rank."""
        if self.lag is None or self.world < 2:
            return 0.0
        return self.lag(max(m[f"{name}:apart"] for m in self.marks))

    @contextmanager
    def phase(self, ranks: Sequence[int], name: str, label: str | None = None) -> Iterator[None]:
        """A `StepTimer.phase` block on each of `ranks`; a phase nested in another is booked to
        its own name only (as the executor's timer does)."""
        starts = [self.cpu[r] for r in ranks]
        for r in ranks:
            self._nested[r].append(0.0)
        yield
        for r, s in zip(ranks, starts):
            dur = self.cpu[r] - s
            inner = self._nested[r].pop()
            if self._nested[r]:
                self._nested[r][-1] += dur
            self.phase_s[r][name] += dur - inner
            self.events[r].append((label or name, name, (s - self.origin[r]) * 1e3, dur * 1e3))

    def open(self, r: int) -> float:
        """Start a `phase` block on rank r alone (the interpreter's per-action blocks, without a
        context manager's cost); returns what `close` needs."""
        self._nested[r].append(0.0)
        return self.cpu[r]

    def close(self, r: int, start: float, name: str, label: str | None = None) -> None:
        """End the block `open` started on rank r: booked exactly as `phase` books it."""
        dur = self.cpu[r] - start
        nested = self._nested[r]
        inner = nested.pop()
        if nested:
            nested[-1] += dur
        self.phase_s[r][name] += dur - inner
        self.events[r].append((label or name, name, (start - self.origin[r]) * 1e3, dur * 1e3))

    def span(self, r: int, seconds: float | None, name: str, label: str | None = None) -> None:
        """A `phase` block on rank r holding only host work (`host` of ``seconds``; None: none),
        booked exactly as ``open``, ``host``, ``close`` would book it, in one call."""
        cpu = self.cpu
        start = cpu[r]
        if seconds is not None:
            work = seconds * self.scale
            self.busy[r] += work + self.debt[r]
            cpu[r] += work + self._settle(r, self.debt[r])
        dur = cpu[r] - start
        nested = self._nested[r]
        if nested:
            nested[-1] += dur
        self.phase_s[r][name] += dur
        self.events[r].append((label or name, name, (start - self.origin[r]) * 1e3, dur * 1e3))

    # ------------------------------------------------------------------ collectives
    def collective(self, ranks: Sequence[int], stream: str, seconds: float, label: str,
                   transfer_s: float | None = None, issued: Sequence[float] | None = None,
                   worked: Sequence[float] | None = None, overlap: float | None = None) -> Handle:
        """One collective over `ranks`, issued by each member at its current host time (or at
        ``issued[k]`` for the k-th member, whose ``busy`` then was ``worked[k]``); returns its
        handle. `transfer_s`: the part of `seconds` that keeps a CPU busy (default: all of it).
        ``overlap``: this collective's share hidden behind compute (default: the timeline's)."""
        busy = (seconds if transfer_s is None else transfer_s) * self.scale
        # the latency waits on the peers and holds no core: only the transfer is stretched
        dur = seconds * self.scale if self.scale == 1.0 or transfer_s is None else seconds - transfer_s + busy
        at = [self.cpu[r] for r in ranks] if issued is None else issued
        drift = 0.0  # the last member's arrival after the peers' drift (`peer_wait`)
        if self.peer_wait is not None and len(ranks) > 1:
            done = [self.busy[r] for r in ranks] if worked is None else worked
            drift = self.peer_wait(max(d - self.met[r] for d, r in zip(done, ranks)))
            for d, r in zip(done, ranks):
                self.met[r] = d
        if self.lanes == 1:
            clocks = self.streams[stream]
            start = max(max(max(at) + drift, clocks[r]) for r in ranks)
            end = start + dur
            for r in ranks:
                clocks[r] = end
        else:  # the lane of each member that frees first
            lanes = self.lane_clocks[stream]
            start = max(max(at) + drift, max(min(lanes[r]) for r in ranks))
            end = start + dur
            for r in ranks:
                free = lanes[r]
                free[free.index(min(free))] = end
        if dur > 0:
            # one event shared by the members' lists (read-only once recorded)
            ev = {"name": label, "cat": "comm", "start_ms": start * 1e3, "dur_ms": dur * 1e3, "lane": f"{stream} stream"}
            hidden = self.overlap if overlap is None else min(1.0, max(0.0, overlap))
            debt = (1.0 - hidden) * busy
            for r in ranks:
                self.stream_events[r].append(ev)
                if debt:
                    self.debt[r] += debt
                    self.owed_calls[r] += 1
        return Handle(label, start, end, max(at))

    def blocking(self, ranks: Sequence[int], stream: str, seconds: float, label: str) -> Handle:
        """A synchronous collective: issue, then every member waits for it."""
        h = self.collective(ranks, stream, seconds, label, 0.0)
        for r in ranks:
            self.wait(r, h)
            self.debt[r] = 0.0  # the host was blocked for the whole collective
            self.owed_calls[r] = 0
        return h

    # ------------------------------------------------------------------ results
    def phases_ms(self, r: int) -> dict[str, float]:
        return {k: v * 1e3 for k, v in self.phase_s[r].items()}

    def rank_events(self, r: int, with_streams: bool = True) -> list[dict]:
        """Rank r's phase events and (optionally) its comm-stream events, times since its origin."""
        shift = self.origin[r] * 1e3
        streams = [{**e, "start_ms": e["start_ms"] - shift} for e in self.stream_events[r]] if with_streams else []
        evs = [{"name": label, "cat": CATEGORY.get(name, name), "start_ms": start, "dur_ms": dur}
               for label, name, start, dur in self.events[r]] + streams
        return sorted(evs, key=lambda e: e["start_ms"])  # stable: blocks keep their program order
