"""Per-rank phase timing: accumulated milliseconds per phase plus a timeline of events.

On CUDA each phase boundary synchronises the device so wall-clock time means finished work;
on CPU the collectives and maths are synchronous from Python's point of view already.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from canzona.records import CATEGORY


class StepTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.events: list[dict[str, float | str]] = []
        self._children: list[float] = []  # time of nested phases, per open phase
        self._sync()
        self.t0 = time.perf_counter()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    @contextmanager
    def phase(self, name: str, label: str | None = None) -> Iterator[None]:
        """Time a block as `name`; `label` names the timeline event (e.g. "gather g3"). A phase
        opened inside another (a parameter-gather wait in a forward pre-hook) is booked to its
        own name and not to the enclosing one."""
        self._sync()
        start = self.now_ms()
        self._children.append(0.0)
        try:
            yield
        finally:
            self._sync()
            dur = self.now_ms() - start
            nested = self._children.pop()
            if self._children:
                self._children[-1] += dur
            self.ms[name] += dur - nested
            self.events.append({"name": label or name, "cat": CATEGORY.get(name, name), "start_ms": start, "dur_ms": dur})
