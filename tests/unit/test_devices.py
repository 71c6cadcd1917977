"""`canzona.devices`: the one resolution of a device setting (auto | cpu | cuda) against what
this machine has; a trial's device and threads per rank from its config
(`canzona.plan.from_config`). CUDA visibility is patched, so both answers are checked on any
machine."""

from __future__ import annotations

import pytest

from canzona import devices
from canzona.config import load_config
from canzona.errors import ConfigError
from canzona.plan import from_config


@pytest.mark.parametrize("visible", [False, True])
def test_auto_is_cuda_when_visible(monkeypatch: pytest.MonkeyPatch, visible: bool) -> None:
    monkeypatch.setattr(devices, "cuda_visible", lambda: visible)
    assert devices.resolve_device("auto") == ("cuda" if visible else "cpu")
    assert devices.resolve_device("cpu", required=True) == "cpu"
    assert devices.device_here("cpu") and devices.device_here("cuda") == visible


def test_cuda_without_a_gpu_is_planned_but_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_visible", lambda: False)
    cfg = load_config(["dist.device=cuda"])
    assert from_config.trial_device(cfg) == "cuda"  # a plan for a cluster, made from a laptop
    with pytest.raises(ConfigError, match=r"dist.device=cuda but no CUDA device is visible; use dist.device=cpu or auto"):
        from_config.trial_device(cfg, required=True)
    with pytest.raises(ConfigError, match=r"^device=cuda but no CUDA device is visible; use device=cpu or auto"):
        devices.resolve_device("cuda", required=True, key="device")


def test_threads_per_rank_share_the_cores_unless_set() -> None:
    cfg = load_config(["parallel.dp=4", "parallel.tp=2"])
    assert from_config.threads_per_rank(cfg, cores=16) == 2  # the trial's 8 ranks share 16 cores
    assert from_config.threads_per_rank(cfg, ranks=2, cores=16) == 8  # 2 of its ranks on this host
    assert from_config.threads_per_rank(cfg, cores=4) == 1  # never below one
    assert from_config.threads_per_rank(cfg, ranks=0, cores=4) == 4
    assert from_config.threads_per_rank(load_config(["dist.threads_per_rank=3"]), cores=64) == 3
