"""Dry runs (`canzona.trial.dryrun`): ranks of a job executed in worker processes on fake CUDA
tensors and torch's fake process group.

- every method and DP collective on a small model: the executor's calls per action equal the
  rank's program (checked here again from the report's recorded calls), and the long-lived
  memory the dry run measured equals the analytic count of the plan to the byte;
- planted violations -- a CPU tensor handed to a collective, an all-gather output of the wrong
  size -- and a rank over its memory limit fail the dry run with one line naming the rank, and
  nothing is written;
- a rank that owns nothing still runs (its gradient-norm contribution is a zero on its device);
- the full-size Qwen3-32B job, dp=32 x tp=8, ranks 0 and 255.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from canzona.config import load_config
from canzona.plan.from_config import make_plan
from canzona.program.check import compare_recorded
from canzona.program.lower import lower
from canzona.trial.dryrun import dry_run_trial
from canzona.trial.dryrun.report import GIB

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PLANTS = Path(__file__).with_name("dryrun_plants.py")
SMALL = ["model=qwen3-0.6b", "model.width_div=8", "model.num_layers=2", "parallel.dp=2", "parallel.tp=2",
         "train.seq_len=32", "dist.dry_run=true"]
LONG_LIVED = ("parameters", "gradients", "main_parameters", "optimizer_state")


def _check_against_plan(cfg, report: dict, ranks: list[int] | None = None) -> None:
    """Calls and long-lived memory of every rank of ``report`` (``ranks``, default the first and
    the last) against the plan."""
    assert report["errors"] == []
    plan = make_plan(cfg, device="cuda")
    assert [r["rank"] for r in report["ranks"]] == (ranks or [0, cfg.world_size - 1])
    for r, program in zip(report["ranks"], lower(plan, [r["rank"] for r in report["ranks"]])):
        assert r["program_check"] == []
        assert r["backends"] == {"dp": "fake", "tp": "fake"}  # Megatron's groups live on the fake backend
        assert compare_recorded(program, r["executor_calls"]) == []
        assert r["executor_calls"], "no collective recorded"
        mem = r["memory"]
        assert {k: mem["after_run"][k] for k in LONG_LIVED} == r["expected"]  # margin: none
        assert mem["peak_bytes"] >= sum(r["expected"].values())
        assert mem["peak_bytes"] == mem["at_peak"]["total"]
        for k in LONG_LIVED:
            assert mem["at_peak"][k] <= r["expected"][k]


@pytest.mark.parametrize("extra", [
    ["method=canzona", "dist.dp_collective=reduce_loop"],
    ["method=canzona", "dist.dp_collective=coalesced"],
    ["method=canzona", "dist.dp_collective=padded"],
    ["method=canzona", "dist.dp_collective=all_to_all"],
    ["method=canzona", "train.dtype=fp32"],
    ["method=canzona", "optimizer=shampoo"],
    ["method=sync"],
    ["method=sync", "dist.sync_variant=zero1_gather"],
    ["method=layerwise", "optimizer=soap"],
    ["method=adamw", "optimizer=adamw"],
], ids=lambda e: "-".join(x.split("=")[1] for x in e))
def test_small_dry_run_equals_the_plan(extra: list[str], tmp_path: Path) -> None:
    cfg = load_config([*SMALL, *extra])
    report = dry_run_trial(cfg, "first,last", tmp_path)
    _check_against_plan(cfg, report)
    assert json.loads((tmp_path / "dryrun.json").read_text()) == json.loads(json.dumps(report))
    assert "rank  dp  tp  params  grads" in (tmp_path / "dryrun.txt").read_text()


MOE = ["model=qwen3-30b-a3b", "model.width_div=16", "model.num_layers=2", "model.num_experts=8", "model.top_k=2",
       "train.seq_len=32", "dist.dry_run=true", "parallel.sequence_parallel=true"]


@pytest.mark.parametrize("extra", [
    ["method=canzona", "parallel.dp=2", "parallel.tp=2", "parallel.ep=2", "parallel.etp=1"],
    ["method=canzona", "parallel.dp=2", "parallel.tp=2", "parallel.ep=2", "parallel.etp=2"],
    ["method=sync", "parallel.dp=4", "parallel.ep=2"],
], ids=["canzona-etp1", "canzona-etp2", "sync-dp4ep2"])
def test_small_moe_dry_run_equals_the_plan(extra: list[str], tmp_path: Path) -> None:
    """An MoE model on fake CUDA (balanced routing: fake tensors have no values to route by):
    the token dispatch's all-to-alls pass NCCL's rules, the executor's calls (expert buffer on
    the expert-DP / expert-TP groups) equal the rank's program, and the long-lived memory, with
    the rank's experts, equals the plan's count to the byte."""
    cfg = load_config([*MOE, *extra])
    report = dry_run_trial(cfg, "first,last", tmp_path)
    _check_against_plan(cfg, report)
    for r in report["ranks"]:
        ops = {(c["op"], c["axis"]) for c in r["collectives"]}
        assert ("alltoall_base", "ep") in ops, ops  # the token dispatch, over the EP group
        assert any(axis == "edp" for _, axis in ops), ops  # the expert buffer's reductions


def test_recompute_keeps_only_layer_inputs(tmp_path: Path) -> None:
    """train.recompute=full on fake CUDA tensors: the same calls and long-lived memory as without,
    and each decoder layer adds only its input (micro-batch x seq x hidden, bf16) to what the
    forward keeps for backward, where it keeps many such tensors without recomputation."""
    forward = {}
    for rc in ("none", "full"):
        for layers in (2, 4):
            cfg = load_config([*SMALL, "method=canzona", "train.seq_len=512", f"model.num_layers={layers}",
                               f"train.recompute={rc}"])
            report = dry_run_trial(cfg, "first", tmp_path / f"{rc}{layers}")
            _check_against_plan(cfg, report, [0])
            phases = {(p["iteration"], p["phase"]): p["bytes"] for p in report["ranks"][0]["memory"]["phase_peaks"]}
            forward[rc, layers] = phases[2, "forward"] - phases[2, "input"]
    cfg = load_config([*SMALL, "train.seq_len=512"])
    layer_input = cfg.train.micro_batch * 512 * cfg.model_cfg().hidden * 2
    per_layer = {rc: (forward[rc, 4] - forward[rc, 2]) / 2 for rc in ("none", "full")}
    assert layer_input <= per_layer["full"] <= 1.1 * layer_input
    assert per_layer["none"] > 5 * layer_input


def test_sequence_parallel_keeps_a_tp_slice_of_each_layer_input(tmp_path: Path) -> None:
    """parallel.sequence_parallel on fake CUDA tensors (the rank's code on NCCL's rules): the same
    long-lived memory and matching calls; with full recomputation each decoder layer keeps only
    its TP rank's slice of its input (Megatron's sequence parallelism), and without it the forward
    keeps less than plain TP does."""
    forward = {}
    for spv, rc in (("true", "full"), ("true", "none"), ("false", "none")):
        for layers in (2, 4):
            cfg = load_config([*SMALL, "method=canzona", "train.seq_len=512", f"model.num_layers={layers}",
                               f"train.recompute={rc}", f"parallel.sequence_parallel={spv}"])
            report = dry_run_trial(cfg, "first", tmp_path / f"{spv}{rc}{layers}")
            _check_against_plan(cfg, report, [0])
            phases = {(p["iteration"], p["phase"]): p["bytes"] for p in report["ranks"][0]["memory"]["phase_peaks"]}
            forward[spv, rc, layers] = phases[2, "forward"] - phases[2, "input"]
    cfg = load_config([*SMALL, "train.seq_len=512"])
    slice_ = cfg.train.micro_batch * 512 * cfg.model_cfg().hidden * 2 // cfg.parallel.tp
    per_layer = {k: (forward[(*k, 4)] - forward[(*k, 2)]) / 2 for k in (("true", "full"), ("true", "none"), ("false", "none"))}
    assert slice_ <= per_layer["true", "full"] <= 1.1 * slice_
    assert per_layer["true", "none"] < per_layer["false", "none"]


def _cli(tmp_path: Path, *args: str, plant: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CANZONA_DRYRUN_SETUP"}
    if plant:
        env["CANZONA_DRYRUN_SETUP"] = f"{PLANTS}:{plant}"
    return subprocess.run([sys.executable, "-m", "canzona.run", *SMALL, *args, f"out={tmp_path / 'out'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_cpu_tensor_reaching_a_collective_fails_the_rank(tmp_path: Path) -> None:
    done = _cli(tmp_path, "dist.dry_run_ranks=0", plant="cpu_tensor_to_all_reduce")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "error: dry run: rank 0 (dp 0, tp 0): NcclRuleError: torch.distributed.all_reduce: tensor is on cpu "
        "but this rank's collectives run on cuda:0 (at executor/comm.py:")
    assert not (tmp_path / "out").exists()


def test_collective_of_the_wrong_size_fails_the_rank(tmp_path: Path) -> None:
    cfg = load_config([*SMALL, "method=adamw", "optimizer=adamw"])
    os.environ["CANZONA_DRYRUN_SETUP"] = f"{PLANTS}:short_all_gather_output"
    try:
        report = dry_run_trial(cfg, "last", tmp_path / "out")
    finally:
        del os.environ["CANZONA_DRYRUN_SETUP"]
    assert report["ranks"] == []
    assert len(report["errors"]) == 1
    assert report["errors"][0].startswith(
        "rank 3 (dp 1, tp 1): CollectiveError: c10d._allgather_base_ over the dp group (2 ranks): output of ")
    assert not (tmp_path / "out").exists()


def test_rank_over_the_memory_limit_fails(tmp_path: Path) -> None:
    done = _cli(tmp_path, "dist.dry_run_memory_gb=0.01")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert [ln.split(" would run out of memory")[0] for ln in lines] == [
        "error: dry run: rank 0 (dp 0, tp 0)", "error: dry run: rank 3 (dp 1, tp 1)"]
    assert all("exceeds dist.dry_run_memory_gb=0.01" in ln for ln in lines)
    assert not (tmp_path / "out").exists()


def test_rank_that_owns_nothing_runs(tmp_path: Path) -> None:
    """Canzona on a one-layer model over 16 DP ranks leaves some ranks without a shard: they
    still take part in the gradient norm's all-reduce, with a zero on their device."""
    cfg = load_config(["model=qwen3-0.6b", "model.width_div=8", "model.num_layers=1", "parallel.dp=16",
                       "train.seq_len=32", "dist.dry_run=true"])
    idle = [p.rank for p in lower(make_plan(cfg, device="cuda")) if not p.main_ranges]
    assert idle, "the plan gives every rank a shard: pick a layout that leaves one idle"
    _check_against_plan(cfg, dry_run_trial(cfg, [0, idle[-1]]), [0, idle[-1]])


def test_qwen3_32b_dp32_tp8_ranks_0_and_255(tmp_path: Path) -> None:
    """The full-size job of the issue, on this CPU: the flat buffers, main parameters and
    optimizer state the dry run measured are the analytic count exactly (margin: 0 bytes), both
    ranks fit 80 GiB, and every group's calls line up across all 256 programs."""
    cfg = load_config(["model=qwen3-32b", "parallel.dp=32", "parallel.tp=8", "method=canzona",
                       "train.micro_batch=1", "train.seq_len=4096", "dist.dp_collective=reduce_loop",
                       "dist.dry_run=true", "dist.dry_run_ranks=0,255"])
    t0 = time.perf_counter()
    report = dry_run_trial(cfg, out=tmp_path)
    print(f"Qwen3-32B dp=32 tp=8 ranks 0 and 255: {time.perf_counter() - t0:.0f} s; "
          + ", ".join(f"rank {r['rank']} peak {r['memory']['peak_bytes'] / GIB:.2f} GiB" for r in report["ranks"]))
    _check_against_plan(cfg, report)
    assert report["program_matching"] == "every group's calls line up"
    for r in report["ranks"]:
        assert {k: r["memory"]["at_peak"][k] for k in LONG_LIVED} == r["expected"]
        assert r["memory"]["at_peak"]["activations"] > 0
        assert r["fits_gb"]["80"]
