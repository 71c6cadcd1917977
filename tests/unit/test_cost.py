"""The planner's default cost: measured on this machine into a calibration cache (taken once,
extended by new shapes, refused or re-taken when corrupt or foreign), the roofline of a hardware
file where nothing can be measured, and a plan that says where its costs came from.

Timings are never asserted (shared machine): only the mechanism. Every test gets its own cache
folder (``CANZONA_CACHE_DIR``) and a tiny model, so a calibration takes about a second.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from canzona.calibrate import cache
from canzona.calibrate.cache import Need, ensure, settings_key, this_device
from canzona.config import load_config
from canzona.cost import ELEMENTWISE_FLOP_EQUIVALENT
from canzona.errors import ConfigError
from canzona.hardware import load_hardware, spec_hardware
from canzona.inventory import ParamSpec, build_inventory
from canzona.optim import registry
from canzona.optim.section import OptimizerSection
from canzona.plan.from_config import make_cost_model, make_plan, select_cost_model
from canzona.plan.summary import plan_record
from canzona.program.count import compute_metrics
from canzona.roofline import RooflineCost

TINY = ["model=qwen3-0.6b", "model.width_div=32", "model.num_layers=1", "parallel.dp=2", "dist.threads_per_rank=1"]
WIDER = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1", "parallel.dp=2", "dist.threads_per_rank=1"]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the plan of a device this machine lacks")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    return tmp_path


def _needs(overrides: list[str]) -> list[Need]:
    cfg = load_config(overrides)
    shapes = [s for p in build_inventory(cfg.model_cfg()) if p.kind == "matrix" for _, s in p.matrices]
    d = registry.get(cfg.optimizer.name)
    return [Need(cfg.optimizer.name, cfg.optimizer, tuple(d.calibration_shapes(shapes, cfg.optimizer)))]


def _file(cache_dir: Path) -> Path:
    return cache_dir / this_device("cpu", 1).file_name()


def test_calibration_is_taken_once_then_reused(cache_dir: Path) -> None:
    said: list[str] = []
    cfg = load_config(TINY)
    first = select_cost_model(cfg, "cpu", log=said.append)
    path = _file(cache_dir)
    assert path.exists() and [p.name for p in cache_dir.glob("*.yaml")] == [path.name]
    assert "calibration taken" in said[-1] and str(path) in said[-1]
    assert first.name == "measured" and first.source.startswith(f"measured: {path} (")
    data = yaml.safe_load(path.read_text())
    assert data["identity"] == this_device("cpu", 1).as_dict()
    table = data["updates"][settings_key("muon", cfg.optimizer)]
    assert set(table) == {"128x32", "32x64", "192x32", "32x96"} and all(e["step_s"] > 0 for e in table.values())
    stamp = path.stat().st_mtime_ns
    # a second planning times nothing and leaves the file alone
    _, timed = ensure("cpu", 1, _needs(TINY), log=said.append)
    assert timed == [] and path.stat().st_mtime_ns == stamp
    plan = make_plan(cfg)
    assert path.stat().st_mtime_ns == stamp
    assert plan.cost_model == "measured" and plan.cost_source == first.source
    # the costs are the cache's: a matrix is its kernel's step time, AdamW per tensor + per element
    spec = next(p for p in plan.params if p.shape == (128, 32))
    assert plan.cost[plan.params.index(spec)] == table["128x32"]["step_s"]
    emb = plan.params[0]
    ew = data["elementwise"]
    assert plan.cost[0] == pytest.approx(ew["tensor_overhead_s"] + emb.numel * ew["seconds_per_element"])


def test_new_shapes_are_added_incrementally(cache_dir: Path) -> None:
    said: list[str] = []
    _, timed = ensure("cpu", 1, _needs(TINY), log=said.append)
    key = settings_key("muon", OptimizerSection())
    before = yaml.safe_load(_file(cache_dir).read_text())
    assert len(timed) == 4
    _, timed = ensure("cpu", 1, _needs(WIDER), log=said.append)
    after = yaml.safe_load(_file(cache_dir).read_text())
    assert sorted(t.split()[-1] for t in timed) == ["256x64", "384x64", "64x128", "64x192"]
    assert "extended by 4 shape(s)" in said[-1]
    # what was there is kept as it was; only the new shapes were timed
    assert {k: after["updates"][key][k] for k in before["updates"][key]} == before["updates"][key]
    assert after["elementwise"] == before["elementwise"] and after["rates"] == before["rates"]
    assert len(after["updates"][key]) == 8
    # another optimizer setting is timed on its own (Newton-Schulz steps change every time)
    three = [*TINY, "optimizer.ns_steps=3"]
    _, timed = ensure("cpu", 1, _needs(three), log=said.append)
    assert len(timed) == 4 and settings_key("muon", load_config(three).optimizer) != key


def test_refreshing_optimizers_keep_the_refresh_apart(cache_dir: Path) -> None:
    """Shampoo's refresh is timed on its own and amortised over the interval of the plan's config."""
    cfg5 = load_config([*TINY, "optimizer=shampoo", "optimizer.precondition_frequency=5"])
    calibration, _ = ensure("cpu", 1, _needs([*TINY, "optimizer=shampoo", "optimizer.precondition_frequency=5"]))
    entry = calibration.table("shampoo", cfg5.optimizer)["192x32"]
    assert entry["step_s"] > 0 and entry["refresh_s"] >= 0
    model = make_cost_model("measured", "shampoo", settings=cfg5.optimizer, calibration=calibration)
    spec = ParamSpec(name="fc1", shape=(192, 32), tp_dim=0, kind="matrix")
    assert model.cost(spec) == pytest.approx(entry["step_s"] + entry["refresh_s"] / 5)


def test_corrupt_or_foreign_cache_is_set_aside_and_taken_anew(cache_dir: Path) -> None:
    path = _file(cache_dir)
    path.write_text("format: canzona-calibration/1\nidentity: [not, a, mapping\n")
    said: list[str] = []
    calibration, timed = ensure("cpu", 1, _needs(TINY), log=said.append)
    assert len(timed) == 4 and "is not a readable calibration" in said[0] and "moved it to" in said[0]
    assert len(list(cache_dir.glob(f"{path.name}.bad-*"))) == 1
    good = yaml.safe_load(path.read_text())
    # a negative time is as corrupt as broken YAML
    bad = copy.deepcopy(good)
    next(iter(next(iter(bad["updates"].values())).values()))["step_s"] = -1.0
    path.write_text(yaml.safe_dump(bad))
    said.clear()
    ensure("cpu", 1, _needs(TINY), log=said.append)
    assert "not a non-negative number" in said[0]
    # a file of another host (copied over, or a shared folder) is not this machine's timings
    foreign = copy.deepcopy(good)
    foreign["identity"]["host"] = "elsewhere"
    path.write_text(yaml.safe_dump(foreign))
    said.clear()
    calibration, timed = ensure("cpu", 1, _needs(TINY), log=said.append)
    assert "belongs to elsewhere" in said[0] and len(timed) == 4
    assert calibration.identity == this_device("cpu", 1).as_dict()


def test_an_unwritable_cache_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cfg = load_config([*TINY, f"planner.cost_cache={tmp_path / 'file' / 'cache'}"])
    with pytest.raises(ConfigError, match="cannot be written at .*planner.cost_cache") as e:
        make_plan(cfg)
    assert "\n" not in str(e.value)


def test_explicit_hardware_and_tables_are_refused_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("updates: [unclosed\n")
    cfg = load_config([*TINY, "planner.cost=measured", f"planner.measured_table={bad}"])
    with pytest.raises(ConfigError, match="is not valid YAML") as e:
        make_plan(cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="not found"):
        make_plan(load_config([*TINY, "planner.cost=roofline", "planner.cost_hardware=h900"]))
    with pytest.raises(ConfigError, match="auto, measured, roofline, flops, numel"):
        load_config([*TINY, "planner.cost=guess"])


def test_roofline_follows_the_hardware_rates() -> None:
    base = spec_hardware("h100")
    fast = copy.deepcopy(base)
    fast["compute"]["matmul_flops_per_s"] = {k: 2 * v for k, v in base["compute"]["matmul_flops_per_s"].items()}
    fast["compute"]["memory_bytes_per_s"] *= 2
    fast["compute"]["call_overhead_s"] += 1e-3
    del fast["adamw_seconds_per_element"]  # from the memory bandwidth: AdamW's bytes per element
    s = OptimizerSection()
    fc1 = ParamSpec(name="fc1", shape=(3072, 1024), tp_dim=0, kind="matrix")
    muon = registry.get("muon")
    slow_cost, fast_cost = RooflineCost.on(base, "muon", s), RooflineCost.on(fast, "muon", s)
    flops_s = muon.steady_flops(fc1.shape, s) / base["compute"]["matmul_flops_per_s"]["float32"]
    bytes_s = muon.elementwise_passes * 4 * fc1.numel / base["compute"]["memory_bytes_per_s"]
    overhead = base["compute"]["call_overhead_s"]
    assert slow_cost.cost(fc1) == pytest.approx(flops_s + bytes_s + overhead)
    assert fast_cost.cost(fc1) == pytest.approx(flops_s / 2 + bytes_s / 2 + overhead + 1e-3)
    # Newton-Schulz in bf16 runs at the bf16 peak
    bf16 = OptimizerSection(ns_dtype="bfloat16")
    assert RooflineCost.on(base, "muon", bf16).cost(fc1) == pytest.approx(
        muon.steady_flops(fc1.shape, bf16) / base["compute"]["matmul_flops_per_s"]["bfloat16"] + bytes_s + overhead)
    # blocked preconditioners: one overhead per kernel, refreshes at the eigendecomposition rate
    blocked = OptimizerSection(name="shampoo", max_preconditioner_dim=1024)
    kernels = registry.get("shampoo").kernels(fc1.shape, blocked)
    assert len(kernels) == 3
    extra = RooflineCost.on(fast, "shampoo", blocked).cost(fc1) - RooflineCost.on(base, "shampoo", blocked).cost(fc1)
    sh = registry.get("shampoo")
    saved = sum(sh.steady_flops(k, blocked) / base["compute"]["matmul_flops_per_s"]["float32"] / 2
                + sh.elementwise_passes * 4 * k[0] * k[1] / base["compute"]["memory_bytes_per_s"] / 2 for k in kernels)
    assert extra == pytest.approx(3 * 1e-3 - saved)
    refresh = sum(sh.refresh_flops(k, blocked) for k in kernels) / base["compute"]["eigh_flops_per_s"] / 10
    assert RooflineCost.on(base, "shampoo", blocked).cost(fc1) == pytest.approx(
        sum(sh.steady_flops(k, blocked) for k in kernels) / base["compute"]["matmul_flops_per_s"]["float32"]
        + refresh + sh.elementwise_passes * 4 * fc1.numel / base["compute"]["memory_bytes_per_s"] + 3 * overhead)
    # elementwise AdamW: a per-tensor overhead plus its bytes at the memory bandwidth
    emb = ParamSpec(name="emb", shape=(151936, 1024), tp_dim=0, kind="adamw")
    assert fast_cost.cost(emb) == pytest.approx(base["adamw_tensor_overhead_s"] + emb.numel * 40.0 / (
        2 * base["compute"]["memory_bytes_per_s"]))
    # no fixed flop equivalent is left in it: the embedding costs what its bytes cost
    assert slow_cost.cost(emb) / slow_cost.cost(fc1) != pytest.approx(
        ELEMENTWISE_FLOP_EQUIVALENT * emb.numel / muon.flops(fc1.shape, s))


@pytest.mark.parametrize("optimizer", ["muon", "shampoo", "soap"])
def test_the_roofline_and_the_simulator_price_an_update_with_one_method(optimizer: str) -> None:
    """`Hardware.update_seconds` is the formula (steady flops / matmul rate [+ refresh flops /
    eigendecomposition rate / interval] + passes × 4 bytes × m·n / bandwidth), bit for bit; the
    roofline's kernel adds its overhead, the simulator's slope on a file without a table is it."""
    hw = load_hardware("a100")
    d = registry.get(optimizer)
    s = OptimizerSection(name=optimizer, ns_steps=3, ns_dtype="bfloat16", precondition_frequency=7)
    for m, n in ((128, 384), (1024, 3072), (5120, 5120)):
        rate = hw.matmul_flops.get(d.matmul_dtype(s), hw.matmul_flops["float32"])
        every = d.refresh_every(s) if d.refresh_every is not None else None
        refresh = d.refresh_flops((m, n), s) / hw.eigh_flops / every if every else 0.0
        formula = d.steady_flops((m, n), s) / rate + refresh + d.elementwise_passes * 4.0 * m * n / hw.memory_Bps
        assert hw.update_seconds(optimizer, m, n, s, refresh=True) == formula
        roofline = RooflineCost.on(hw, optimizer, s)
        assert roofline.kernel_seconds(m, n) == formula + roofline.kernel_overhead_s
        steady = d.steady_flops((m, n), s) / rate + d.elementwise_passes * 4.0 * m * n / hw.memory_Bps
        assert hw.update_seconds(optimizer, m, n, s) == steady  # the median step: no refresh
        assert hw.matrix_batch(optimizer, m, n, "bfloat16", 3)[1] == steady  # the simulator's slope


@no_gpu
def test_a_cuda_plan_on_a_cpu_machine_uses_the_roofline(cache_dir: Path) -> None:
    plan = make_plan(load_config(["model=qwen3-8b", "parallel.dp=8", "parallel.tp=4", "dist.device=cuda"]))
    assert plan.cost_model == "roofline" and plan.cost_source == "roofline: hardware/h100.yaml"
    assert plan.execution.device == "cuda" and not list(cache_dir.iterdir())  # nothing timed
    a100 = make_plan(load_config(["model=qwen3-8b", "parallel.dp=8", "parallel.tp=4", "dist.device=cuda",
                                  "planner.cost_hardware=a100"]))
    assert a100.cost_source == "roofline: hardware/a100.yaml"
    record = plan_record(plan, compute_metrics(plan))
    assert record["cost_model"] == "roofline" and record["cost_source"] == plan.cost_source
    with pytest.raises(ConfigError, match="no cuda device to time"):
        make_plan(load_config(["model=qwen3-8b", "parallel.dp=8", "dist.device=cuda", "planner.cost=measured"]))
    # the simulator's hardware, when it passes one, wins over planner.cost_hardware
    cfg = load_config(["model=qwen3-8b", "parallel.dp=8", "dist.device=cuda"])
    assert select_cost_model(cfg, "cuda", hardware="h200").source == "roofline: hardware/h200.yaml"


def test_the_plan_cli_says_where_its_costs_came_from(cache_dir: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "canzona.plan", *TINY, *extra], capture_output=True, text=True)

    first = run("--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)  # the cache's message goes to stderr, the JSON stays clean
    path = _file(cache_dir)
    assert doc["cost_model"] == "measured" and doc["cost_source"].startswith(f"measured: {path} (")
    assert f"calibration taken: {path}" in first.stderr
    text = run()
    assert text.returncode == 0 and f"calibration reused: {path}" in text.stderr
    assert f"costs: {doc['cost_source']}" in text.stdout.splitlines()[1]
    flops = run("planner.cost=flops", "--json")
    assert json.loads(flops.stdout)["cost_source"].startswith("flops: muon flop counts")
