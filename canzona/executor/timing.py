"""Per-rank phase timing of one step: milliseconds per phase, named marks, and a timeline.

Use, once per step::

    timer.reset()                              # the step starts here
    with timer.phase("forward"):               # accumulate into ms["forward"], add a timeline event
        ...
    timer.mark("grads_reduced")                # a named instant
    ...
    timer.finish()                             # resolve everything (the step's one synchronisation)
    timer.ms["forward"], timer.between("grads_reduced", "updated"), timer.at("updated"), timer.events

What a number means depends on the device:

- **CPU**: host wall-clock time (``time.perf_counter``) between the boundaries. gloo's
  collectives and the maths are synchronous from Python's point of view, so a phase's time is
  the work done in it, and a ``wait`` phase is the host blocked on an in-flight collective.
  On CPU every mark also reads the CPU time of this rank's main thread and of its whole
  process (`cpu_between`): the rest is the CPU its other threads -- gloo's workers and
  transport loops -- spent, which on a CPU shared by more ranks than cores is taken from the
  ranks' compute (docs/results.md § Predicted against measured).
- **CUDA**: *stream time on the compute stream*. Each boundary records a CUDA event on the
  current stream; nothing synchronises until `finish`, which waits for the last event once.
  A phase's time is therefore the time the compute stream took to get from the phase's first
  to its last queued work, idle gaps included (when the host is the bottleneck, that is the
  host's time). NCCL runs on its own streams and is *not* waited for at the boundaries, so
  communication overlaps compute as it does untimed; it shows up where the compute stream waits
  for it (``work.wait()`` makes the stream, not the host, wait): in ``wait``, ``grad_reduce``
  and ``param_sync``, i.e. the exposed part of the communication. Calling
  ``torch.cuda.synchronize`` at every boundary instead would wait for the NCCL streams too,
  serialise the overlap the pipeline exists for and book communication to the wrong phase.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Union

import torch

from canzona.records import CATEGORY

Stamp = Union[float, "torch.cuda.Event"]
START = "start"


class StepTimer:
    """Phase timing of one step on ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.reset()

    def reset(self) -> None:
        """Start a new step: forget the last one and mark ``start``."""
        self._spans: list[tuple[str, str, Stamp, Stamp, int | None, int]] = []  # ..., enclosing span, id
        self._open: list[int] = []  # ids of the phases open now (a phase may open inside another)
        self._next_id = 0
        self._marks: dict[str, Stamp] = {}
        self._cpu_marks: dict[str, tuple[float, float]] = {}  # CPU only: (main thread, process) CPU seconds
        self._resolved: tuple[dict[str, float], list[dict[str, float | str]], dict[str, float]] | None = None
        self._marks[START] = self._stamp()
        self._cpu_stamp(START)

    def _cpu_stamp(self, name: str) -> None:
        if not self.cuda:
            self._cpu_marks[name] = (time.thread_time(), time.process_time())

    def _stamp(self) -> Stamp:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # on the current stream
            return event
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str, label: str | None = None) -> Iterator[None]:
        """Time a block as phase ``name``; ``label`` names its timeline event (e.g. "gather g3").
        A phase opened inside another (a parameter-gather wait in a forward pre-hook) is booked
        to its own name and taken out of the enclosing phase's time."""
        start = self._stamp()
        parent = self._open[-1] if self._open else None
        me = self._next_id
        self._next_id += 1
        self._open.append(me)
        try:
            yield
        finally:
            self._open.pop()
            self._spans.append((name, label or name, start, self._stamp(), parent, me))

    def mark(self, name: str) -> None:
        """Record the instant ``name`` (read it after `finish` with `at` or `between`)."""
        self._marks[name] = self._stamp()
        self._cpu_stamp(name)

    def cpu_between(self, a: str, b: str) -> tuple[float, float] | None:
        """(this thread's, the process's other threads') CPU milliseconds from mark ``a`` to mark
        ``b`` (``"start"``: the step's start); None on CUDA or where a mark is missing."""
        if a not in self._cpu_marks or b not in self._cpu_marks:
            return None
        (t0, p0), (t1, p1) = self._cpu_marks[a], self._cpu_marks[b]
        return (t1 - t0) * 1e3, max(0.0, (p1 - p0) - (t1 - t0)) * 1e3

    def finish(self) -> None:
        """End the step: wait for the last boundary (CUDA: one event synchronisation) and resolve
        every phase, mark and event to milliseconds since ``start``."""
        end = self._stamp()
        if self.cuda:
            end.synchronize()  # type: ignore[union-attr]
        start = self._marks[START]

        def since(stamp: Stamp) -> float:
            return self._elapsed(start, stamp)

        ms: dict[str, float] = defaultdict(float)
        events: list[dict[str, float | str]] = []
        name_of = {me: name for name, _, _, _, _, me in self._spans}
        for name, label, a, b, parent, _ in self._spans:
            t0, dur = since(a), self._elapsed(a, b)
            ms[name] += dur
            if parent is not None:
                ms[name_of[parent]] -= dur
            events.append({"name": label, "cat": CATEGORY.get(name, name), "phase": name, "start_ms": t0,
                           "dur_ms": dur})
        marks = {name: since(stamp) for name, stamp in self._marks.items()}
        self._resolved = (dict(ms), events, marks)

    def _elapsed(self, a: Stamp, b: Stamp) -> float:
        if self.cuda:
            return float(a.elapsed_time(b))  # type: ignore[union-attr]
        return (b - a) * 1e3  # type: ignore[operator]

    def _done(self) -> tuple[dict[str, float], list[dict[str, float | str]], dict[str, float]]:
        if self._resolved is None:
            raise RuntimeError("StepTimer: call finish() before reading the step's times")
        return self._resolved

    @property
    def ms(self) -> dict[str, float]:
        """Milliseconds per phase name, summed over its blocks (phases never entered: absent)."""
        return self._done()[0]

    @property
    def events(self) -> list[dict[str, float | str]]:
        """The step's timeline: ``{"name", "cat", "start_ms", "dur_ms"}`` per phase block."""
        return self._done()[1]

    def at(self, mark: str) -> float:
        """Milliseconds from ``start`` to ``mark``."""
        marks = self._done()[2]
        if mark not in marks:
            raise KeyError(f"StepTimer: no mark {mark!r}; marks: {', '.join(marks)}")
        return marks[mark]

    def between(self, a: str, b: str) -> float:
        """Milliseconds from mark ``a`` to mark ``b``."""
        return self.at(b) - self.at(a)
