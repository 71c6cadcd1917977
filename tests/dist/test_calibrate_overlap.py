"""The calibration's overlap of a gradient reduction with compute, measured against the model's
backward (what a trial's reductions run beside) on two gloo ranks. Timings are never asserted
(shared machine): the structure, the bounds, and that both ranks agree on one figure."""

from __future__ import annotations

import pytest


def _overlap_worker(rank: int, world: int) -> dict:
    import torch

    from canzona.calibrate.clock import Clock
    from canzona.calibrate.comm import time_overlap
    from canzona.calibrate.model_pass import backward_work
    from canzona.model.parallel import destroy_parallel, init_parallel

    torch.set_num_threads(1)
    init_parallel(1, "cpu", 120.0)
    try:
        clock = Clock("cpu")
        return time_overlap(True, clock, backward_work(rank, world, clock))
    finally:
        destroy_parallel()


@pytest.mark.slow
def test_overlap_against_the_backward_on_gloo() -> None:
    from util import run_ranks

    res = run_ranks(_overlap_worker, 2, timeout_s=240)
    assert res[0] == res[1]  # the slowest rank's medians, all-reduced: one figure for the file
    r = res[0]
    assert r["against"] == "backward" and 0.0 <= r["overlap"] <= 1.0
    assert r["compute"] > 0 and r["comm"] > 0 and r["both"] > 0


def _grad_overlap_worker(rank: int, world: int) -> dict:
    import torch

    from canzona.calibrate.clock import Clock
    from canzona.calibrate.grad_overlap import time_grad_reduce_overlap
    from canzona.model.parallel import destroy_parallel, init_parallel

    torch.set_num_threads(1)
    ctx = init_parallel(1, "cpu", 120.0)
    try:
        return time_grad_reduce_overlap(rank, world, Clock("cpu"), ctx, 1, True)
    finally:
        destroy_parallel()


@pytest.mark.slow
def test_the_gradient_buckets_overlap_as_the_runtime_issues_them() -> None:
    """The executor's runtime on the reference model, bucket reductions from the backward's hooks
    and after it: several buckets, both ranks agree, the share is the clipped difference."""
    from util import run_ranks

    res = run_ranks(_grad_overlap_worker, 2, timeout_s=240)
    assert res[0] == res[1]
    r = res[0]
    assert r["buckets"] > 2  # a bucket to overlap while the backward still runs
    assert r["backward_ms"] > 0 and r["reduce_ms"] > 0 and r["overlapped_ms"] > 0
    expect = (r["backward_ms"] + r["reduce_ms"] - r["overlapped_ms"]) / min(r["backward_ms"], r["reduce_ms"])
    assert r["raw"] == pytest.approx(expect)
    assert r["overlap"] == min(1.0, max(0.0, r["raw"]))
