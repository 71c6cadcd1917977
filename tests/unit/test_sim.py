"""The simulator: hand-checkable timelines, the executor-mirroring iteration, the paper projection,
the spec-derived hardware files and the validation plumbing. No timing is asserted against the clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from canzona.config import load_config
from canzona.hardware import (
    COLLECTIVES,
    HARDWARE_DIR,
    SPECS,
    Hardware,
    Link,
    load_hardware,
    spec_hardware,
)
from canzona.inventory import build_inventory, model_config
from canzona.plan.from_config import make_plan
from canzona.records import STEP_FIELDS
from canzona.sim.simulate import project, simulate
from canzona.sim.timeline import Timeline
from canzona.sim.validate import compare, compare_sweep

METHODS = ["canzona", "sync", "layerwise", "adamw"]
PAPER = ["model=qwen3-32b", "train.micro_batch=1", "train.seq_len=4096", "optimizer.ns_dtype=bfloat16"]
TINY = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1"]
MS = 1e-3


def toy_hardware(*, slope_s: float = MS, overhead_s: float = 0.0, latency_s: float = 1e-4, bw: float = 1e9,
                step_latency_s: float = 0.0, elementwise: bool = False, **extra) -> dict:
    """A hardware description where every matrix update costs `slope_s` (+ `overhead_s` per shape group per call),
    nothing else costs anything unless `elementwise`, and every collective is latency + volume / bw."""
    shapes = {f"{m}x{n}" for name in ("qwen3-0.6b", "qwen3-4b") for div in (16,)
              for p in build_inventory(model_config(name, div, 2), split_fused=False) if p.kind == "matrix"
              for _, (m, n) in p.matrices}
    link = {"latency_s": latency_s, "step_latency_s": step_latency_s, "bandwidth_Bps": bw}
    zero = 0.0 if not elementwise else 1e-9
    data = {
        "name": "toy", "source": "test", "device": {"name": "toy", "kind": "cuda"},
        "topology": {"ranks_per_node": None},
        "compute": {"matmul_flops_per_s": {"float32": 1e12}, "memory_bytes_per_s": 1e30, "call_overhead_s": 0.0,
                    "overlap": 1.0},
        "updates": {"muon": {s: slope_s for s in shapes}},
        "batched": {"muon": {s: {"slope_s": slope_s, "overhead_s": overhead_s} for s in shapes}},
        "update_overhead_s": {"muon": overhead_s},
        "adamw_seconds_per_element": zero, "adamw_tensor_overhead_s": 0.0,
        "apply_seconds_per_element": zero, "apply_call_overhead_s": 0.0,
        "copy_seconds_per_byte": 0.0, "copy_call_overhead_s": 0.0,
        "model": {"dtype": "float32", "forward": {"fixed_s": 0.01, "layer_s": 0.0, "flops_per_s": 1e30},
                  "backward": {"fixed_s": 0.02, "layer_s": 0.0, "flops_per_s": 1e30}},
        "collectives": {"intra": {k: dict(link) for k in COLLECTIVES}},
    }
    data.update(extra)
    return data


# ---------------------------------------------------------------- timeline and collective model
def test_single_collective_is_latency_plus_bytes_over_bandwidth() -> None:
    hw = Hardware(toy_hardware(latency_s=1e-4, bw=1e9, step_latency_s=1e-5))
    n = 8_000_000
    # two ranks: one ring step; reduce-scatter moves (P-1)/P of the buffer
    assert hw.collective("reduce_scatter", n, [0, 1]) == pytest.approx(1e-4 + 0.5 * n / 1e9)
    assert hw.collective("all_gather", n, [0, 1]) == pytest.approx(1e-4 + 0.5 * n / 1e9)
    # all-reduce on 4 ranks: the tree's 2·log2(P) = 4 latency steps (fewer than the ring's 6),
    # the ring's 2(P-1)/P of the buffer
    assert hw.collective("all_reduce", n, [0, 1, 2, 3]) == pytest.approx(1e-4 + 3 * 1e-5 + 1.5 * n / 1e9)
    assert hw.collective("all_reduce", n, [0, 1]) == pytest.approx(1e-4 + 1 * 1e-5 + 1.0 * n / 1e9)
    assert hw.collective("broadcast", n, [0, 1, 2]) == pytest.approx(1e-4 + 1e-5 + n / 1e9)
    assert hw.collective("all_reduce", n, [0]) == 0.0
    tl = Timeline(2)
    tl.host(0, 0.5)  # rank 1 issues at t=0, rank 0 at t=0.5: the collective starts at 0.5
    h = tl.collective([0, 1], "dp", hw.collective("reduce_scatter", n, [0, 1]), "rs")
    assert (h.start, h.end) == pytest.approx((0.5, 0.5 + 1e-4 + 0.004))
    tl.wait(1, h)
    assert tl.cpu == pytest.approx([0.5, h.end])  # rank 0 has not waited yet
    h2 = tl.collective([0, 1], "dp", 1.0, "next")  # same stream: runs after the first
    assert h2.start == pytest.approx(h.end)


def test_inter_node_groups_use_the_network_level() -> None:
    data = toy_hardware(bw=100e9)
    data["topology"] = {"ranks_per_node": 8}
    data["collectives"]["inter"] = {k: {"latency_s": 1e-4, "bandwidth_Bps": 10e9} for k in COLLECTIVES}
    hw = Hardware(data)
    assert hw.level([0, 1, 7]) == "intra" and hw.level([0, 8]) == "inter"
    assert hw.collective("all_gather", 1e9, [0, 8]) == pytest.approx(1e-4 + 0.5e9 / 10e9)
    assert hw.collective("all_gather", 1e9, [0, 1]) == pytest.approx(1e-4 + 0.5e9 / 100e9)


def test_balanced_ranks_never_wait_and_overlap_hides_comm() -> None:
    tl = Timeline(4)
    for r in range(4):
        tl.host(r, 1.0)
    h = tl.collective(range(4), "dp", 0.25, "ar")
    for r in range(4):
        tl.host(r, 0.5)  # compute while the collective runs
        tl.wait(r, h)
    assert tl.cpu == pytest.approx([1.5] * 4)  # 1 + max(0.5, 0.25)
    cpu = Timeline(1, overlap=0.0)  # CPU: communication competes with compute
    h = cpu.collective([0], "dp", 0.25, "ar")
    cpu.host(0, 0.5)
    cpu.wait(0, h)
    assert cpu.cpu[0] == pytest.approx(0.75)


def test_coalesced_rooted_calls_cost_the_busiest_members_pieces() -> None:
    """Uneven DP shards as one coalesced group of rooted calls: every piece travels a chain that
    all members but its root forward, so member k moves every piece but its own; the group costs
    one latency plus the busiest member's transfers (even pieces: the ring's (P-1)/P)."""
    from canzona.program.actions import Call
    from canzona.sim.interpret import ProgramSim

    hw = Hardware(toy_hardware(latency_s=1e-4, bw=1e9))
    assert hw.coalesces  # CUDA hardware launches a coalesced group together
    sim = ProgramSim.__new__(ProgramSim)  # only the collective model is exercised
    sim.hw = hw
    members = [0, 1, 2, 3]

    def group(op: str, pieces: list[int]) -> list[list[Call]]:
        calls = [Call(op, "dp", n, n, "float32", root=k, coalesced=True) for k, n in enumerate(pieces)]
        return [calls] * len(members)

    for op in ("reduce", "broadcast"):
        seconds, transfer = sim._seconds(group(op, [1000] * 4), members)
        even = hw.collective_parts("reduce_scatter", 4 * 4000, members)[1]
        assert transfer == pytest.approx(even) and seconds == pytest.approx(1e-4 + even)
        # one member owns nothing: it forwards all 7000 elements
        _, transfer = sim._seconds(group(op, [4000, 2000, 1000, 0]), members)
        assert transfer == pytest.approx(4 * 7000 / 1e9)
    # not coalesced (gloo): the calls run one after another, latencies and transfers add
    solo = [[Call("reduce", "dp", 1000, 1000, "float32", root=k) for k in range(4)]] * 4
    seconds, transfer = sim._seconds(solo, members)
    assert transfer == pytest.approx(4 * 4 * 1000 / 1e9) and seconds == pytest.approx(4e-4 + transfer)


@pytest.mark.parametrize("overlap", ["true", "false"])
def test_param_sync_waits_for_peers_still_in_their_step_are_kept_apart(overlap: str) -> None:
    """A rank that ends its optimizer step early waits, in its parameter sync, for a DP peer that
    has not issued the gather yet: that part (``param_sync_peer_ms``) is the step's imbalance, and
    ``param_sync_transfer_ms`` is the exposed parameter sync without it."""
    model = {"dtype": "float32", "forward": {"fixed_s": 1e-6, "layer_s": 0.0, "flops_per_s": 1e30},
             "backward": {"fixed_s": 1e-6, "layer_s": 0.0, "flops_per_s": 1e30}}
    hw = toy_hardware(slope_s=10 * MS, latency_s=1e-5, model=model)
    base = TINY + ["parallel.dp=3", f"dist.overlap_param_gather={overlap}", "optimizer.clip_grad=0"]
    res = project(load_config(base + ["method=canzona"]), hw, events="none")
    rows = res["steps"]
    slow = max(rows, key=lambda r: r["optimizer_step_ms"])
    fast = min(rows, key=lambda r: r["optimizer_step_ms"])
    gap = slow["optimizer_step_ms"] - fast["optimizer_step_ms"]
    assert gap >= 9.0  # 4 matrices on 3 ranks: one rank updates two of them
    assert slow["param_sync_peer_ms"] == pytest.approx(0.0, abs=1e-9)  # nobody to wait for
    assert fast["param_sync_peer_ms"] == pytest.approx(gap, rel=0.05)
    for r in rows:
        assert 0.0 <= r["param_sync_peer_ms"] <= r["param_sync_ms"] + 1e-9
    assert res["param_sync_transfer_ms"] == pytest.approx(
        max(r["param_sync_ms"] - r["param_sync_peer_ms"] for r in rows))
    assert res["param_sync_transfer_ms"] < res["param_sync_ms"] - 0.9 * gap
    # ZeRO-1's even shards: every rank issues its gathers at the same time
    even = project(load_config(base + ["method=adamw", "optimizer.name=adamw"]), hw, events="none")
    assert all(r["param_sync_peer_ms"] == pytest.approx(0.0, abs=1e-9) for r in even["steps"])
    assert even["param_sync_transfer_ms"] == pytest.approx(even["param_sync_ms"])


def test_forward_tp_all_reduces_sit_in_their_units() -> None:
    """Megatron's forward TP all-reduces happen inside each layer (and the embedding and loss),
    where the DP gathers in flight overlap them, not in one block after the forward."""
    from canzona.sim.model import model_work

    cfg = load_config(TINY + ["model.num_layers=3", "parallel.tp=2", "method=canzona"])
    plan = make_plan(cfg, device="cuda")
    hw = load_hardware("h100")
    work = model_work(cfg, plan, hw, [0, 1])
    tp_s = [t for _, _, t in work.forward_units]
    assert len(tp_s) == 3 + 2 and all(t > 0 for t in tp_s)  # embedding, 3 layers, head
    # Megatron's count: 2 activation all-reduces per layer + the embedding's, 3 small ones in the loss
    act = hw.collective("all_reduce", work.tokens * cfg.model_cfg().hidden * hw.activation_bytes, [0, 1])
    small = hw.collective("all_reduce", work.tokens * 4, [0, 1])
    assert sum(tp_s) == pytest.approx((2 * 3 + 1) * act + 3 * small)
    assert tp_s[1] == tp_s[2] == tp_s[3] and tp_s[1] > tp_s[0]  # two activation all-reduces per layer
    res = project(cfg, hw, events="all")
    fwd = [e for e in res["steps"][0]["events"] if e["name"] == "forward TP all-reduces"]
    assert len(fwd) == len(tp_s)


def test_sequence_parallel_trades_each_tp_all_reduce_for_a_gather_and_a_scatter() -> None:
    """parallel.sequence_parallel: forward, 2 all-gathers + 2 reduce-scatters per layer, the
    embedding's reduce-scatter and the output layer's all-gather; backward adds the column-parallel
    inputs' re-gathers (4 all-gathers + 2 reduce-scatters per layer) and the norms' partial
    gradients; the walk and its buckets stay. At TP 1 it is ignored, as Megatron ignores it."""
    from canzona.sim.model import model_work

    hw = load_hardware("h100")
    works, cfgs = {}, {}
    for spv in ("false", "true"):
        cfg = cfgs[spv] = load_config(TINY + ["model.num_layers=3", "parallel.tp=2", "method=canzona",
                                              f"parallel.sequence_parallel={spv}"])
        works[spv] = model_work(cfg, make_plan(cfg, device="cuda"), hw, [0, 1])
    plain, sp = works["false"], works["true"]
    act = plain.tokens * cfgs["true"].model_cfg().hidden * hw.activation_bytes
    ag, rs = hw.collective("all_gather", act, [0, 1]), hw.collective("reduce_scatter", act, [0, 1])
    small = hw.collective("all_reduce", plain.tokens * 4, [0, 1])
    assert sum(t for _, _, t in sp.forward_units) == pytest.approx(3 * 2 * (ag + rs) + rs + ag + 3 * small)
    assert [d for _, d, _ in sp.backward_units] == [d for _, d, _ in plain.backward_units]
    hidden_norms = 2 * 3 + 1
    norm = hw.collective("all_reduce", cfgs["true"].model_cfg().hidden * 4, [0, 1])
    ar = hw.collective("all_reduce", act, [0, 1])
    extra = sum(s for s, _, _ in sp.backward_units) - sum(s for s, _, _ in plain.backward_units)
    # the communication inside those seconds is stated apart (not stretched on a shared CPU)
    assert sum(c for _, _, c in sp.backward_units) - sum(c for _, _, c in plain.backward_units) == pytest.approx(extra)
    # per layer 4 AG + 2 RS against 2 AR; head AG + RS against AR; embedding AG; 7 norms
    assert extra == pytest.approx(3 * (4 * ag + 2 * rs - 2 * ar) + (ag + rs - ar) + ag + hidden_norms * norm)
    assert any("sequence parallelism: b·s·hidden" in a for a in project(cfgs["true"], hw)["assumptions"])
    one = load_config(TINY + ["model.num_layers=3", "method=canzona", "parallel.sequence_parallel=true"])
    assert not one.sequence_parallel
    assert model_work(one, make_plan(one, device="cuda"), hw, [0]) == model_work(
        load_config(TINY + ["model.num_layers=3", "method=canzona"]), make_plan(one, device="cuda"), hw, [0])


def test_recompute_runs_each_layer_forward_again_in_backward() -> None:
    """train.recompute=full: the backward walk gains each layer's forward (its TP all-reduces
    included) just before that layer's gradients; nothing else changes."""
    from canzona.sim.model import model_work

    hw = load_hardware("h100")
    works = {}
    for rc in ("none", "full"):
        cfg = load_config(TINY + ["model.num_layers=3", "parallel.tp=2", "method=canzona", f"train.recompute={rc}"])
        works[rc] = model_work(cfg, make_plan(cfg, device="cuda"), hw, [0, 1])
    none, full = works["none"], works["full"]
    assert full.forward_units == none.forward_units
    assert [d for _, d, _ in full.backward_units] == [d for _, d, _ in none.backward_units]
    extra = [f - n for (f, _, _), (n, _, _) in zip(full.backward_units, none.backward_units)]
    layers = [sec + tp for _, sec, tp in none.forward_units[1:-1]]
    assert sorted(e for e in extra if e > 1e-12) == pytest.approx(sorted(layers))
    assert sum(extra) == pytest.approx(sum(layers))


def test_a_trial_in_another_dtype_than_the_pass_fit_runs_at_the_matmul_rates_ratio() -> None:
    """A file whose passes were timed in fp32 prices a bf16 trial at its bf16/fp32 matmul ratio
    (a GPU's bf16 runs about 8x fp32: an fp32 fit priced bf16 trials 2-4x slow on an H200)."""
    from canzona.sim.model import forward_flops, model_work

    data = toy_hardware()
    data["compute"]["matmul_flops_per_s"]["bfloat16"] = 8e12
    data["model"]["forward"]["flops_per_s"] = 1e12
    hw = load_hardware(data)
    for dtype, rate in (("fp32", 1e12), ("bf16", 8e12)):
        cfg = load_config(TINY + ["method=canzona", f"train.dtype={dtype}"])
        work = model_work(cfg, make_plan(cfg, device="cuda"), hw, [0])
        flops = forward_flops(cfg.model_cfg(), 1, cfg.train.micro_batch, cfg.train.seq_len)
        assert work.forward_s == pytest.approx(0.01 + flops / rate)


def test_a_gradient_lands_at_its_calibrated_rate_per_dtype() -> None:
    """The hook's ``grad_view.add_(grad)``: priced per element in the trial's dtype where the file
    calibrated it (a bf16 gradient's mixed-dtype add is no copy on a CPU), else as copies."""
    from canzona.sim.model import model_work

    cfg = load_config(TINY + ["method=canzona", "train.dtype=bf16"])
    plan = make_plan(cfg, device="cuda")
    base = model_work(cfg, plan, load_hardware(toy_hardware()), [0])
    rates = {"float32": 1e-9, "bfloat16": 4e-9}
    priced = model_work(cfg, plan, load_hardware(toy_hardware(grad_add_seconds_per_element=rates)), [0])
    numel = sum(p.numel for p in plan.params)
    extra = sum(sec for sec, _, _ in priced.backward_units) - sum(sec for sec, _, _ in base.backward_units)
    assert extra == pytest.approx(numel * 4e-9)  # the toy file's copies cost nothing


def test_a_large_gradient_lands_at_the_out_of_cache_rate() -> None:
    """``grad_add_large`` (a CPU calibration's landing at an embedding's size): up to 2^20
    elements the warm rate, from its size on the large one, between them interpolated in
    log2(size); a file without it prices every size warm."""
    from canzona.hardware import GRAD_ADD_WARM_ELEMENTS

    warm = {"float32": 1e-9}
    plain = load_hardware(toy_hardware(grad_add_seconds_per_element=warm))
    hw = load_hardware(toy_hardware(grad_add_seconds_per_element=warm,
                                    grad_add_large={"elements": 1 << 24, "seconds_per_element": {"float32": 3e-9}}))
    for n in (1000, GRAD_ADD_WARM_ELEMENTS):
        assert hw.grad_add(n, "float32", 1.5) == plain.grad_add(n, "float32", 1.5) == pytest.approx(n * 1e-9)
    assert hw.grad_add(1 << 22, "float32", 1.5) == pytest.approx((1 << 22) * 2e-9)  # halfway in log2
    assert hw.grad_add(1 << 26, "float32", 1.5) == pytest.approx((1 << 26) * 3e-9)
    assert plain.grad_add(1 << 26, "float32", 1.5) == pytest.approx((1 << 26) * 1e-9)
    assert hw.grad_add(1 << 26, "bfloat16", 1.5) == plain.grad_add(1 << 26, "bfloat16", 1.5)  # uncalibrated dtype: copies


def test_the_main_parameters_are_cast_into_the_model_at_their_calibrated_rate() -> None:
    """``CopyToModel`` (fp32 main -> the model's bf16 parameters) priced per element in the
    training dtype where the file calibrated it, else as a copy of the fp32 bytes."""
    cfg = load_config(TINY + ["method=adamw", "train.dtype=bf16"])
    copy = project(cfg, toy_hardware(copy_seconds_per_byte=1e-9))
    cast = project(cfg, toy_hardware(copy_seconds_per_byte=1e-9,
                                     cast_seconds_per_element={"float32": 1e-9, "bfloat16": 2e-9}))
    numel = sum(p.numel for p in make_plan(cfg, device="cuda").params)  # the buffer pads a little more
    assert copy["phases_ms"]["apply"] == pytest.approx(numel * 4e-9 * 1e3, rel=1e-3)
    assert cast["phases_ms"]["apply"] == pytest.approx(copy["phases_ms"]["apply"] / 2)


# ---------------------------------------------------------------- the iteration
def test_one_rank_step_is_the_sum_of_its_updates() -> None:
    cfg = load_config(TINY + ["method=canzona"])
    res = project(cfg, toy_hardware(slope_s=MS))
    # 4 matrices (qkv, proj, fc1, fc2), four shapes: one batched call, 1 ms each; nothing else costs
    assert res["optimizer_step_ms"] == pytest.approx(4.0)
    assert res["param_sync_ms"] == 0.0 and res["grad_reduce_ms"] == 0.0
    assert res["iteration_ms"] == pytest.approx(10.0 + 20.0 + 4.0)  # forward + backward fixed + step
    over = project(cfg, toy_hardware(slope_s=MS, overhead_s=0.5 * MS))
    assert over["optimizer_step_ms"] == pytest.approx(4.0 + 4 * 0.5)


def test_equal_costs_split_evenly_over_dp_and_sync_is_redundant(tmp_path: Path) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy_hardware(slope_s=MS, latency_s=0.0, bw=1e30)))
    base = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "parallel.dp=2", "bucket.size=1000",
            "planner.cost=measured", f"planner.measured_table={path}"]
    canz = project(load_config(base + ["method=canzona"]), str(path))
    sync = project(load_config(base + ["method=sync"]), str(path))
    # 8 matrices of equal cost: canzona gives each DP rank 4, sync computes all 8 on both
    assert [r["optimizer_step_ms"] for r in canz["steps"]] == pytest.approx([4.0, 4.0])
    assert [r["optimizer_step_ms"] for r in sync["steps"]] == pytest.approx([8.0, 8.0])


def test_pipeline_depth_hides_tp_communication() -> None:
    base = ["model=qwen3-4b", "model.width_div=16", "model.num_layers=2", "parallel.tp=2", "method=canzona"]
    hw = toy_hardware(slope_s=MS, latency_s=0.4 * MS)
    serial = project(load_config(base + ["planner.pipeline_depth=0"]), hw)
    piped = project(load_config(base + ["planner.pipeline_depth=2"]), hw)
    groups = piped["plan"]["micro_groups"][0]
    assert groups > 1
    assert piped["optimizer_step_ms"] < serial["optimizer_step_ms"]
    # depth 0: every group pays a gather and a scatter in full
    assert serial["optimizer_step_ms"] >= 2 * groups * 0.4 + 0.99 * piped["breakdown"]["compute"]


def test_phases_and_events_follow_the_records_format() -> None:
    res = project(load_config(TINY + ["parallel.dp=2", "parallel.tp=2", "method=canzona"]), "h100", events="all")
    assert res["projected"] is True and res["hardware"]["name"] == "h100" and res["assumptions"]
    row = res["steps"][0]
    assert set(STEP_FIELDS) <= set(row)
    names = {e["name"].split()[0] for e in row["events"]}
    assert {"forward", "backward", "grad_reduce", "param_sync"} <= names
    for e in row["events"]:
        assert set(e) >= {"name", "cat", "start_ms", "dur_ms"} and e["dur_ms"] >= 0
        assert e["cat"] in {"compute", "comm", "wait", "model"}
    for r in res["steps"]:
        assert r["iteration_ms"] >= r["optimizer_step_ms"]
    assert res["iteration_ms"] == max(r["iteration_ms"] for r in res["steps"])
    assert res["optimizer_step_ms_median"] == res["optimizer_step_ms"]
    json.dumps(res)  # serialisable as a summary


@pytest.mark.parametrize("collective", ["padded", "reduce_loop", "all_to_all"])
def test_every_dp_collective_and_the_sync_variants_run(collective: str) -> None:
    for method in METHODS:
        cfg = load_config(TINY + ["parallel.dp=4", "parallel.tp=2", f"method={method}", f"dist.dp_collective={collective}",
                                  "bucket.size=2000"])
        res = project(cfg, "a100", events="none")
        assert res["iteration_ms"] > 0
    z = project(load_config(TINY + ["parallel.dp=2", "method=sync", "dist.sync_variant=zero1_gather"]), "h200")
    assert z["grad_reduce_ms"] > 0


# ---------------------------------------------------------------- the paper projection
@pytest.mark.parametrize("layout", [("32", "8"), ("64", "4")])
def test_paper_projection_every_method(layout: tuple[str, str]) -> None:
    dp, tp = layout
    out = {}
    for method in METHODS:
        cfg = load_config(PAPER + [f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}"])
        res = project(cfg, "h100")
        assert res["world"]["world_size"] == 256
        assert len(res["steps"]) == 256 and sum(1 for r in res["steps"] if r["events"]) <= 3
        out[method] = res
    # the claim under test: Canzona's optimizer step is faster than the synchronous baseline's
    assert out["canzona"]["optimizer_step_ms"] < out["sync"]["optimizer_step_ms"]
    assert out["canzona"]["optimizer_step_ms"] < out["layerwise"]["optimizer_step_ms"]


def test_spec_hardwares_are_the_generator_output_and_labelled() -> None:
    for key in SPECS:
        data = yaml.safe_load((HARDWARE_DIR / f"{key}.yaml").read_text())
        assert data == spec_hardware(key)
        assert data["source"] == "spec-derived" and data["inputs"]["sources"] and data["inputs"]["efficiency"]
        hw = load_hardware(key)
        assert hw.ranks_per_node == SPECS[key].ranks_per_node and set(hw.links) == {"intra", "inter"}
        assert hw.collective("all_reduce", 1e9, list(range(16))) > hw.collective("all_reduce", 1e9, list(range(8)))


def test_unknown_hardware_is_a_one_line_error() -> None:
    from canzona.errors import ConfigError

    with pytest.raises(ConfigError, match="not found"):
        load_hardware("no-such-hardware")


def test_a_hardware_file_left_in_profiles_says_where_to_move_it(tmp_path: Path, monkeypatch) -> None:
    """profiles/ became hardware/: a (git-ignored) calibration left there is not read silently."""
    import canzona.hardware as hardware
    from canzona.errors import ConfigError

    old = tmp_path / "profiles"
    old.mkdir()
    (old / "local.yaml").write_text(yaml.safe_dump(spec_hardware("a100")))
    monkeypatch.setattr(hardware, "BEFORE_RENAME_DIR", old)
    monkeypatch.setattr(hardware, "HARDWARE_DIR", tmp_path / "hardware")
    monkeypatch.setattr(hardware, "LOCAL_FILE", tmp_path / "hardware" / "local.yaml")
    with pytest.raises(ConfigError, match=r"profiles/local.yaml is from before profiles/ was renamed hardware/: "
                                          r"move it to .*hardware/local.yaml"):
        load_hardware("local")
    with pytest.raises(ConfigError, match="move it to"):
        hardware.local_file()  # the default of a measured sweep's report
    (old / "local.yaml").unlink()
    assert hardware.local_file() is None


def test_link_seconds_monotone_in_bytes() -> None:
    link = Link(1e-5, 1e9, 1e-6)
    assert link.seconds("all_gather", 8, 1e6) < link.seconds("all_gather", 8, 2e6)


# ---------------------------------------------------------------- validation plumbing
def _fake_trial(root: Path, name: str, overrides: list[str], factor: float) -> Path:
    """A trial folder whose measurements are the projection times `factor`."""
    cfg = load_config(overrides)
    res = project(cfg, toy_hardware(), events="none")
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({**cfg.to_dict(), "out": str(d)}))
    summary = {f"{k}_median": res[k] * factor for k in ("iteration_ms", "optimizer_step_ms", "param_sync_ms", "grad_reduce_ms")}
    (d / "summary.json").write_text(json.dumps(summary))
    rows = [{**r, "measured": True, **{k: v * factor for k, v in r.items() if k.endswith("_ms")}} for r in res["steps"]]
    (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "status.json").write_text(json.dumps({"status": "done"}))
    return d


def test_compare_reports_signed_percent_errors(tmp_path: Path) -> None:
    d = _fake_trial(tmp_path, "t1", TINY + ["parallel.dp=2", "method=canzona"], 1.25)
    row = compare(d, toy_hardware())
    assert row["optimizer_step_ms_error_pct"] == pytest.approx(-20.0)
    assert row["phases"]["compute"]["error_pct"] is None or row["phases"]["compute"]["error_pct"] == pytest.approx(-20.0)
    _fake_trial(tmp_path, "t2", TINY + ["parallel.dp=2", "method=sync"], 0.5)
    bad = tmp_path / "t3"
    bad.mkdir()
    (bad / "config.yaml").write_text("method: nope\n")
    (bad / "summary.json").write_text("{}")
    res = compare_sweep(tmp_path, toy_hardware())
    assert len(res["trials"]) == 2 and len(res["errors"]) == 1
    by = {m["method"]: m for m in res["by_method"]}
    assert by["sync"]["optimizer_step_ms_median_abs_error_pct"] == pytest.approx(100.0)
    assert res["overall"]["optimizer_step_ms_worst_trial"] == "t2"


def test_a_trial_is_priced_in_the_dtype_its_run_resolved(tmp_path: Path) -> None:
    """``train.dtype=auto`` follows the machine (bf16 on CUDA and on a CPU with native bf16): a
    record is priced in the dtype its run took (summary.json's ``plan.execution.dtype``), not in
    what auto would mean where it is validated."""
    overrides = TINY + ["parallel.dp=2", "method=canzona"]
    d = _fake_trial(tmp_path, "t1", overrides, 1.0)
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**summary, "plan": {"execution": {"dtype": "float32"}}}))
    as_run = project(load_config([*overrides, "train.dtype=fp32"]), toy_hardware(), events="none")
    here = project(load_config(overrides), toy_hardware(), events="none")  # auto: bf16 on the toy's CUDA
    assert as_run["iteration_ms"] != here["iteration_ms"]
    assert compare(d, toy_hardware())["iteration_ms_predicted"] == as_run["iteration_ms"]


def _with_probe(d: Path, trial_id: str, probe: float) -> None:
    """Give a fake trial's run a speed probe and the trial it repeats."""
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**summary, "speed_probe_flops_per_s": probe}))
    (d / "status.json").write_text(json.dumps({"status": "done", "trial_id": trial_id}))


def test_the_sweep_speed_scales_every_prediction_by_one_factor(tmp_path: Path) -> None:
    """The calibration probed 100 GFLOP/s; three runs of one trial and one of another probed
    50, 80, 100 and 40 (factors 2, 1.25, 1, 2.5: median 1.625). Every prediction times 1.625,
    whatever its own run's probe: a trial measured at 1.625x its prediction is exact there."""
    hw = toy_hardware(calibration={"speed_probe_flops_per_s": 100e9})
    factor = 1.625
    for name, probe in (("a1", 50e9), ("a2", 80e9), ("a3", 100e9)):
        _with_probe(_fake_trial(tmp_path, name, TINY + ["parallel.dp=2", "method=canzona"], factor), "a", probe)
    _with_probe(_fake_trial(tmp_path, "b1", TINY + ["parallel.dp=2", "method=sync"], 1.5), "b", 40e9)
    pt = compare_sweep(tmp_path, hw)["per_trial"]
    assert pt["sweep_speed_factor"] == pytest.approx(factor) and pt["sweep_speed_runs"] == 4
    by = {r["trial"]: r for r in pt["trials"]}
    assert by["a"]["optimizer_step_ms_sweep_speed_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert by["a"]["iteration_ms_sweep_speed_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert by["a"]["optimizer_step_ms_error_pct"] == pytest.approx(100 * (1 / factor - 1))  # raw: -38.5 %
    # b: measured 1.5x the prediction -> 100 (1.625 / 1.5 - 1) = +8.3 % at the sweep's speed
    assert by["b"]["optimizer_step_ms_sweep_speed_error_pct"] == pytest.approx(100 / 12)
    assert pt["goal_met"] is False  # raw: canzona -38 %, sync -33 %
    assert pt["goal_met_sweep_speed"] is True  # canzona 0 %, sync 8.3 %
    methods = {m["method"]: m for m in pt["by_method"]}
    assert methods["sync"]["iteration_ms_sweep_speed_worst_abs_error_pct"] == pytest.approx(100 / 12)


def test_the_loaded_probe_decides_where_both_recorded_it(tmp_path: Path) -> None:
    """A calibration and a run that both recorded the every-core-busy probe are compared by it;
    the one-thread probe only where either lacks it (files and records from before it)."""
    from canzona.sim.validate import speed_factor

    cal = {"speed_probe_flops_per_s": 100e9, "speed_probe_all_cores_flops_per_s": 60e9}
    assert speed_factor(cal, {"speed_probe_flops_per_s": 100e9, "speed_probe_all_cores_flops_per_s": 40e9}) == (
        "speed_probe_all_cores_flops_per_s", pytest.approx(1.5))
    assert speed_factor(cal, {"speed_probe_flops_per_s": 80e9}) == ("speed_probe_flops_per_s", pytest.approx(1.25))
    assert speed_factor({"speed_probe_flops_per_s": 100e9}, {"speed_probe_all_cores_flops_per_s": 40e9}) == (None, None)
    hw = toy_hardware(calibration=cal)
    d = _fake_trial(tmp_path, "a1", TINY + ["parallel.dp=2", "method=canzona"], 1.5)
    _with_probe(d, "a", 100e9)  # the one-thread probe saw no drift; the loaded one saw 1.5x
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**summary, "speed_probe_all_cores_flops_per_s": 40e9}))
    pt = compare_sweep(tmp_path, hw)["per_trial"]
    assert pt["sweep_speed_factor"] == pytest.approx(1.5)
    assert pt["trials"][0]["optimizer_step_ms_sweep_speed_error_pct"] == pytest.approx(0.0, abs=1e-9)


def test_loaded_probe_per_core() -> None:
    """Four ranks on two cores each get about half a core: their sum over the two cores they
    share is one core's rate; two processes on four cores occupy two."""
    from canzona.calibrate.probe import per_core, throughput_probe

    assert per_core([25e9, 25e9, 24e9, 26e9], 2) == pytest.approx(50e9)
    assert per_core([50e9, 48e9], 4) == pytest.approx(49e9)
    with pytest.raises(ValueError, match="at least one rate"):
        per_core([], 2)
    assert throughput_probe(0.02) > 1e8  # a real matmul loop, flops per wall second


def test_no_probe_no_sweep_speed(tmp_path: Path) -> None:
    _fake_trial(tmp_path, "t1", TINY + ["parallel.dp=2", "method=canzona"], 1.0)
    pt = compare_sweep(tmp_path, toy_hardware())["per_trial"]
    assert pt["sweep_speed_factor"] is None and pt["goal_met_sweep_speed"] is None and pt["goal_met"] is True
    assert pt["trials"][0]["optimizer_step_ms_sweep_speed"] is None


def test_compare_reads_a_trial_recorded_before_the_rename(tmp_path: Path) -> None:
    """config.yaml written with canzona.cost_profile / canzona.measured_profile (before they were
    planner.cost_hardware / planner.measured_table): compared as the same trial."""
    d = _fake_trial(tmp_path, "t1", TINY + ["parallel.dp=2", "method=canzona", "planner.cost_hardware=a100"], 1.25)
    now = compare(d, toy_hardware())
    raw = yaml.safe_load((d / "config.yaml").read_text())
    raw["canzona"] = raw.pop("planner")  # the planner's settings were under canzona.*
    raw["canzona"]["cost_profile"] = raw["canzona"].pop("cost_hardware")
    raw["canzona"]["measured_profile"] = raw["canzona"].pop("measured_table")
    (d / "config.yaml").write_text(yaml.safe_dump(raw))
    assert compare(d, toy_hardware()) == now
    from canzona.config import read_config
    from canzona.errors import ConfigError

    upgraded = read_config(raw)
    assert upgraded["planner"]["cost_hardware"] == "a100" and "canzona" not in upgraded
    assert "cost_profile" in raw["canzona"]  # the record read is not changed
    with pytest.raises(ConfigError, match=r"^canzona\.\w+= is now planner\.\w+="):
        load_config(base=raw)  # given as a config (not read as a record): refused


def test_simulate_uses_a_given_plan() -> None:
    cfg = load_config(TINY + ["parallel.dp=2"])
    plan = make_plan(cfg)
    sim = simulate(cfg, "h100", plan)
    assert sim.plan is plan


def test_write_trial_round_trips_through_compare(tmp_path: Path) -> None:
    from canzona.sim.simulate import write_trial

    cfg = load_config(TINY + ["parallel.dp=2", "parallel.tp=2", "method=sync"])
    summary = write_trial(cfg, toy_hardware(), tmp_path / "t")
    assert summary["projected"] is True and "steps" not in summary
    rows = [json.loads(line) for line in (tmp_path / "t" / "steps.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["projected"] for r in rows)
    row = compare(tmp_path / "t", toy_hardware())
    assert row["optimizer_step_ms_error_pct"] == pytest.approx(0.0) and row["plan_matches"] is True


MOE = ["model=qwen3-30b-a3b", "model.width_div=16", "model.num_layers=2", "model.num_experts=8", "model.top_k=2",
       "method=canzona", "planner.cost=flops"]


def test_moe_dispatch_sits_in_each_layer_forward_and_backward(monkeypatch) -> None:
    """An MoE model's forward and backward each carry, per layer, the dispatch and combine
    all-to-alls over the EP group (priced by `moe_comm_seconds`: with them priced at zero both
    passes are shorter by exactly that, layer by layer); the projection records the EP grid and
    says it assumes balanced routing."""
    import canzona.sim.model as sim_model

    hw = load_hardware("h100")
    cfg = load_config([*MOE, "parallel.dp=4", "parallel.ep=2"])
    plan = make_plan(cfg, device="cuda")
    grid = plan.rank_layout
    ep, etp = grid.group("ep", 0)[1], grid.group("etp", 0)[1]
    comm = sim_model.moe_comm_seconds(cfg, hw, ep, etp)
    m = cfg.model_cfg()
    slots_bytes = cfg.train.micro_batch * cfg.train.seq_len * m.top_k * m.hidden * hw.activation_bytes
    assert comm == 2 * hw.collective("all_to_all", slots_bytes / 2, ep) > 0  # half stays on the rank
    priced = sim_model.model_work(cfg, plan, hw, [0], ep, etp)
    monkeypatch.setattr(sim_model, "moe_comm_seconds", lambda *a: 0.0)
    free = sim_model.model_work(cfg, plan, hw, [0], ep, etp)
    forward = [a - b for (_, a, _), (_, b, _) in zip(priced.forward_units, free.forward_units)]
    backward = [a - b for (a, _, _), (b, _, _) in zip(priced.backward_units, free.backward_units)]
    assert forward == pytest.approx([0.0, comm, comm, 0.0])  # embedding, two MoE layers, head
    assert sum(backward) == pytest.approx(2 * comm) and sum(1 for d in backward if d) == 2
    monkeypatch.undo()
    res = project(cfg, hw)
    assert res["world"]["ep"] == 2 and res["world"]["etp"] == 1 and res["iteration_ms"] > 0
    assert any(a.startswith("MoE: 8 experts per layer, top-2") for a in res["assumptions"])


def test_moe_expert_buffer_reduces_over_the_expert_dp_groups() -> None:
    """The expert buffer's bucket reductions run on the expert-DP groups' own streams, beside the
    dense DP ones."""
    from canzona.program.lower import lower
    from canzona.sim.interpret import ProgramSim

    hw = load_hardware("h100")
    cfg = load_config([*MOE, "parallel.dp=4", "parallel.ep=2"])
    plan = make_plan(cfg, device="cuda")
    sim = ProgramSim(cfg, plan, lower(plan), hw, 1.0, 1.0)
    sim.run()
    assert {"dp", "edp"} <= set(sim.tl.streams)
    assert all(t > 0 for t in sim.tl.streams["edp"])  # every rank's expert reductions took time


def test_batch_equal_shapes_prices_each_equal_shape_group_at_the_stacked_slope() -> None:
    """optimizer.batch_equal_shapes: a call's equal-shape matrices take the file's stacked
    slope (a group of one keeps the one-matrix slope); a file without stacked timings prices
    them one at a time and the projection says so."""
    hw = Hardware(toy_hardware(slope_s=MS))
    plain = hw.matrix_call("muon", [(64, 192)] * 4 + [(192, 64)], stacked=True)
    assert plain == pytest.approx(5 * MS) and not hw.stacked_measured("muon")
    data = toy_hardware(slope_s=MS)
    for entry in data["batched"]["muon"].values():
        entry["stacked_slope_s"] = 0.25 * MS
    fast = Hardware(data)
    assert fast.stacked_measured("muon")
    assert fast.matrix_call("muon", [(64, 192)] * 4 + [(192, 64)], stacked=True) == pytest.approx(4 * 0.25 * MS + MS)
    assert fast.matrix_call("muon", [(64, 192)] * 4, stacked=False) == pytest.approx(4 * MS)
    cfg = load_config([*TINY, "model.num_layers=4", "method=sync", "optimizer.batch_equal_shapes=true"])
    assert project(cfg, data)["optimizer_step_ms"] < project(cfg, toy_hardware(slope_s=MS))["optimizer_step_ms"]
    assert any("priced as one at a time" in a for a in project(cfg, toy_hardware(slope_s=MS))["assumptions"])
