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
