"""NCCL's rules over real gloo ranks: each planted violation raises `NcclRuleError` before the
collective starts (so no rank is left waiting), where gloo alone would have run it or failed
with something else; a correct trial passes with the rules on."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def _expect_rule_error(fn) -> str:
    from canzona.dist_rules import NcclRuleError

    try:
        fn()
    except NcclRuleError as e:
        return str(e)
    return "no error"


def _planted_worker(rank: int, world: int) -> dict[str, str]:
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    from canzona import dist_rules
    from canzona.model.parallel import init_parallel

    ctx = init_parallel(1, "cpu", 30.0)
    out: dict[str, str] = {"installed": str(dist_rules.installed())}
    ok = torch.ones(2)
    dist.all_reduce(ok)  # a correct call goes through
    out["sum"] = str(ok.tolist())

    dist_rules.declare_device("cuda:0")  # as a CUDA rank whose tensor was left on the CPU
    out["device"] = _expect_rule_error(lambda: dist.all_reduce(torch.ones(2)))
    out["megatron_alias"] = _expect_rule_error(
        lambda: mappings.dist_all_gather_func(torch.empty(2 * world), torch.ones(2), group=ctx.dp_group))
    dist_rules.declare_device(ctx.device)

    bits = torch.tensor([rank + 1], dtype=torch.int32)
    out["band"] = _expect_rule_error(lambda: dist.all_reduce(bits, op=dist.ReduceOp.BAND))
    dist.all_reduce.__wrapped__(bits, op=dist.ReduceOp.BAND)  # gloo alone runs it: 1 & 2
    out["band_gloo"] = str(int(bits))
    out["monitored_barrier"] = _expect_rule_error(lambda: dist.monitored_barrier())
    out["recv_any"] = _expect_rule_error(lambda: dist.recv(torch.empty(1)))

    device_only = dist.new_group(list(range(world)), backend="cuda:gloo")  # a group without a CPU half
    objs: list = [None] * world
    out["object_device_group"] = _expect_rule_error(lambda: dist.all_gather_object(objs, rank, group=device_only))
    dist.all_gather_object(objs, {"rank": rank})  # the world group has its CPU backend
    out["objects"] = str([o["rank"] for o in objs])
    return out


def test_planted_violations_raise_before_the_collective(run_ranks) -> None:
    for r in run_ranks(_planted_worker, 2, timeout_s=120):
        assert r["installed"] == "True" and r["sum"] == "[2.0, 2.0]"
        assert "all_reduce: tensor is on cpu but this rank's collectives run on cuda:0" in r["device"]
        assert "all_gather_into_tensor" in r["megatron_alias"] and "is on cpu" in r["megatron_alias"]
        assert "no reduction BAND" in r["band"] and r["band_gloo"] == "0"
        assert "NCCL has no monitored_barrier" in r["monitored_barrier"]
        assert "cannot receive from any source" in r["recv_any"]
        assert "object collectives need a group with a CPU backend" in r["object_device_group"]
        assert "cuda only" in r["object_device_group"] and r["objects"] == "[0, 1]"


def test_trial_ranks_run_under_the_rules(tmp_path) -> None:
    from canzona.config import load_config
    from canzona.run import run_trial

    cfg = load_config(["model=qwen3-8b", "model.width_div=64", "model.num_layers=2", "parallel.dp=2",
                       "train.steps=1", "train.warmup=0"])
    summary = run_trial(cfg, tmp_path)
    assert summary["world"]["nccl_rules"] is True and summary["world"]["backend"] == "gloo"
    assert summary["matrix_owner_counts"] == {"min": 1, "max": 1}
