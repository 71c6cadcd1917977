"""Timing a call on the calibration's device: host clock on CPU, CUDA events on a GPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def solo(go: bool) -> bool:
    """The ``sync`` of a calibration that runs in one process: nothing to agree with."""
    return go


class Clock:
    """Seconds one call takes on ``device``.

    On CPU the host's wall clock around the call. On CUDA an event before and after on the
    current stream, waited for once: the time the stream took to run what the call queued
    (collectives included: the stream waits for NCCL's), not the host's launch time.
    """

    def __init__(self, device: Any):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def time(self, fn: Callable[[], Any]) -> float:
        return self.call(fn)[0]

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
        """(seconds, result) of ``fn(*args)``."""
        if not self.cuda:
            t0 = time.perf_counter()
            result = fn(*args)
            return time.perf_counter() - t0, result
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn(*args)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, result

    def median(self, fn: Callable[[], Any], repeats: int, cap_s: float,
               sync: Callable[[bool], bool] = solo, before: Callable[[], Any] | None = None) -> float:
        """Typical time of fn(): the median of up to ``repeats`` runs (stops early past ``cap_s``
        in total). The median, not the minimum: trials run on a machine that is not quiet
        either. ``sync`` first lines the calibrating processes up, so they time the work at once;
        ``before`` runs untimed ahead of each run (`cold_caches`)."""
        sync(True)
        times: list[float] = []
        for _ in range(repeats):
            if before is not None:
                before()
            times.append(self.time(fn))
            if sum(times) > cap_s:
                break
        return statistics.median(times)
