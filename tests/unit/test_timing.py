"""`canzona.executor.timing.StepTimer`: what a step's numbers are made of. On CPU with the host
clock; on CUDA (``gpu`` marker) that boundaries do not synchronise: neither the compute stream
nor another stream (NCCL's) is waited for before `finish`."""

from __future__ import annotations

import pytest
import torch

from canzona.executor.timing import StepTimer


def _work() -> None:
    a = torch.randn(64, 64)
    for _ in range(20):
        a = a @ a / 64


def test_phases_marks_and_timeline_on_cpu() -> None:
    timer = StepTimer(torch.device("cpu"))
    timer.reset()
    with timer.phase("forward"):
        _work()
    timer.mark("mid")
    with timer.phase("gather", "gather g0"):
        _work()
    with timer.phase("gather", "gather g1"):
        _work()
    timer.mark("end")
    with pytest.raises(RuntimeError, match="finish"):
        _ = timer.ms
    timer.finish()
    assert set(timer.ms) == {"forward", "gather"}
    names = [e["name"] for e in timer.events]
    assert names == ["forward", "gather g0", "gather g1"]
    assert [e["cat"] for e in timer.events] == ["model", "comm", "comm"]
    assert timer.ms["gather"] == pytest.approx(timer.events[1]["dur_ms"] + timer.events[2]["dur_ms"])
    starts = [e["start_ms"] for e in timer.events]
    assert 0.0 <= starts[0] <= timer.at("mid") <= starts[1] <= starts[2] <= timer.at("end")
    assert timer.between("mid", "end") == pytest.approx(timer.at("end") - timer.at("mid"))
    assert timer.at("end") >= sum(timer.ms.values()) > 0
    with pytest.raises(KeyError, match="no mark 'nope'"):
        timer.at("nope")
    timer.reset()  # a new step forgets the last one
    timer.finish()
    assert timer.ms == {} and timer.events == [] and timer.at("start") == 0.0


def _burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU (not wall) time."""
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_between_splits_the_main_thread_from_the_others() -> None:
    """The main thread's CPU and the other threads' (gloo's, in a trial) between two marks: a
    helper thread that spends 30 ms of CPU shows up as the others', the main thread's 20 ms as
    its own -- CPU time, whatever the machine's load."""
    import threading

    timer = StepTimer(torch.device("cpu"))
    timer.reset()
    timer.mark("a")
    helper = threading.Thread(target=_burn_cpu, args=(0.03,))
    helper.start()
    _burn_cpu(0.02)
    helper.join()
    timer.mark("b")
    mine, others = timer.cpu_between("a", "b")
    assert mine >= 20.0 and others >= 29.0
    assert mine < 200.0 and others < 200.0  # not wall time of a loaded machine: the helper stopped at 30 ms
    whole = timer.cpu_between("start", "b")
    # the wider span holds at least as much (the two clocks are read a few microseconds apart:
    # the main thread's CPU between the reads can land on either side)
    assert whole[0] >= mine and whole[1] >= others - 0.1
    assert timer.cpu_between("a", "nope") is None


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_cuda_boundaries_do_not_synchronise() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    a = torch.randn(4096, 4096, device=dev)
    side = torch.cuda.Stream(dev)  # stands in for NCCL's stream
    timer = StepTimer(dev)
    torch.cuda.synchronize(dev)
    timer.reset()
    with timer.phase("compute"):
        for _ in range(50):
            a = a @ a / 4096
    assert not torch.cuda.current_stream(dev).query()  # the phase ended without waiting for its work
    with timer.phase("apply"):
        a.add_(1.0)
    timer.mark("end")
    # other-stream work queued after the step's last compute-stream work and independent of it
    # (enqueued earlier, the GPU may schedule it ahead of the compute stream's last kernel)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        b = a.clone()
        for _ in range(400):
            b = b @ b / 4096
    timer.finish()
    assert not side.query()  # finish waited for the compute stream only, not the other stream
    assert timer.ms["compute"] > 0 and timer.at("end") >= timer.ms["compute"] + timer.ms["apply"]
    torch.cuda.synchronize(dev)


def test_cpu_use_reads_the_cores_share_of_the_step() -> None:
    """Two steps of 4 ranks, each step 100 ms long (its slowest rank): every rank spent 40 ms in
    its main thread and 8 in the others in step 0, so the 4 ranks used 192 ms of CPU (0.96 of
    2 cores' 200); in step 1, 30 and 5: 140 ms. Medians over the steps, shares of this
    machine's cores (``os.cpu_count``, as the calibration counts them)."""
    import os

    from canzona.trial.summary import cpu_use

    cores = os.cpu_count() or 1

    def rows(main: float, other: float) -> list[dict]:
        return [{"step_thread_cpu_ms": main, "step_other_threads_cpu_ms": other,
                 "optimizer_step_ms": 100.0 if r == 0 else 90.0} for r in range(4)]

    got = cpu_use({0: rows(40, 8), 1: rows(30, 5)}, world=4)
    assert got["step_thread_cpu_ms_mean"] == 35 and got["step_other_threads_cpu_ms_mean"] == 6.5
    assert got["cores"] == cores
    assert got["step_cores_busy"] * cores == pytest.approx((192 + 140) / 2 / 100, rel=1e-12)  # float rounding only
    assert "step_cores_busy" not in cpu_use({0: rows(40, 8)}, world=4, all_local=False)  # ranks elsewhere
    assert cpu_use({0: [{"optimizer_step_ms": 1.0}]}, world=1) == {}  # a GPU trial's rows: no CPU times
