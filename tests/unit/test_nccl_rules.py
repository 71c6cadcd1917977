"""NCCL's rules as a pure check (`canzona.dist_rules.check_call`) and how `install` reaches the
call sites; the same rules over real gloo ranks are in tests/dist/test_nccl_rules_gloo.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from canzona import dist_rules
from canzona.dist_rules import NcclRuleError, check_call


@pytest.fixture(autouse=True)
def cpu_rank() -> Iterator[None]:
    dist_rules.declare_device("cpu")
    yield
    dist_rules.declare_device(None)


def test_tensors_must_be_on_the_declared_device() -> None:
    t = torch.zeros(4)
    check_call("all_reduce", {"tensor": t})
    dist_rules.declare_device("cuda:0")
    with pytest.raises(NcclRuleError, match=r"all_reduce: tensor is on cpu but this rank's collectives run on cuda:0"):
        check_call("all_reduce", {"tensor": t})
    dist_rules.declare_device("meta")  # a rank whose device is not the CPU: lists are checked item by item
    with pytest.raises(NcclRuleError, match=r"tensor_list\[1\] is on cpu"):
        check_call("all_gather", {"tensor_list": [torch.zeros(2, device="meta"), torch.zeros(2)],
                                  "tensor": torch.zeros(2, device="meta")})


def test_tensors_must_be_dense_contiguous_and_of_an_nccl_dtype() -> None:
    with pytest.raises(NcclRuleError, match="dense and contiguous"):
        check_call("broadcast", {"tensor": torch.zeros(4, 3).t()})
    with pytest.raises(NcclRuleError, match="dense and contiguous"):
        check_call("all_reduce", {"tensor": torch.zeros(4, 3).to_sparse()})
    with pytest.raises(NcclRuleError, match="dtype torch.int16"):
        check_call("all_reduce", {"tensor": torch.zeros(4, dtype=torch.int16)})
    check_call("all_reduce", {"tensor": torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)})
    for dtype in (torch.bfloat16, torch.float16, torch.bool, torch.int64, torch.uint8):
        check_call("all_reduce", {"tensor": torch.zeros(4, dtype=dtype)})


def test_collectives_and_reductions_nccl_lacks() -> None:
    for name in ("monitored_barrier", "all_gather_coalesced"):
        with pytest.raises(NcclRuleError, match=f"torch.distributed.{name}: NCCL"):
            check_call(name, {})
    with pytest.raises(NcclRuleError, match="cannot receive from any source"):
        check_call("recv", {"tensor": torch.zeros(2)})
    check_call("recv", {"tensor": torch.zeros(2), "src": 1})
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        with pytest.raises(NcclRuleError, match=f"no reduction {op.name}"):
            check_call("all_reduce", {"tensor": torch.zeros(2, dtype=torch.int32), "op": op})
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG, dist.ReduceOp(dist.ReduceOp.MIN)):
        check_call("reduce_scatter_single", {"output": torch.zeros(1), "input": torch.zeros(2), "op": op})


def test_install_wraps_the_module_attribute_and_aliases_taken_before() -> None:
    """Calls through ``torch.distributed.X`` and through megatron's import-time alias
    (``dist_all_gather_func``) are both checked: they raise before any process group is needed."""
    from megatron.core.tensor_parallel import mappings

    original = torch.distributed.distributed_c10d.all_reduce
    was = dist_rules.installed()
    dist_rules.install()
    dist_rules.declare_device("meta")
    try:
        assert dist.all_reduce is torch.distributed.distributed_c10d.all_reduce
        for call in (lambda: dist.all_reduce(torch.zeros(2)),
                     lambda: mappings.dist_all_gather_func(torch.empty(4), torch.zeros(2))):
            with pytest.raises(NcclRuleError, match="is on cpu but this rank's collectives run on meta"):
                call()
    finally:
        if not was:
            dist_rules.uninstall()
    if not was:
        assert dist.all_reduce is original


def test_install_from_env_reads_the_switch() -> None:
    was = dist_rules.installed()
    try:
        assert dist_rules.install_from_env({dist_rules.ENV: "0"}) is was
        assert dist_rules.install_from_env({dist_rules.ENV: "1"}) is True
    finally:
        if not was:
            dist_rules.uninstall()
