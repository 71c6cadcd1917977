"""Calibration: a quick run on this machine yields a hardware file that the cost model, the planner and
the simulator all accept. Timings are never asserted (shared machine); only structure and sanity.
A GPU calibration is checked where a GPU exists (``gpu`` marker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from canzona import host_memory
from canzona.calibrate import (
    calibrate,
    calibration_shapes,
    fit_link,
    fit_pass,
    local_sweep_models,
    local_sweep_shapes,
    parse_args,
    write_hardware,
)
from canzona.calibrate.model_pass import pass_dtype
from canzona.config import load_config
from canzona.cost import FlopsCost, load_measured
from canzona.errors import ConfigError
from canzona.hardware import COLLECTIVES, load_hardware
from canzona.inventory import build_inventory, model_config
from canzona.plan.from_config import make_plan
from canzona.sim.simulate import project

REPO = Path(__file__).resolve().parents[2]


def _check_hardware(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert data["source"] == "calibrated"
    dev = data["device"]
    assert dev["host"] and dev["date"] and dev["torch"] and dev["cores"] >= 1 and dev["kind"] == "cpu"
    for opt in ("muon", "shampoo", "soap"):
        cost = load_measured(path, opt, FlopsCost(opt))
        assert cost.table and all(v > 0 for v in cost.table.values())
        # the local sweep's shapes come first, so they are measured, not extrapolated
        for name, div in local_sweep_models():
            for p in build_inventory(model_config(name, div, 1)):
                if p.kind == "matrix":
                    assert cost.cost(p) > 0
        assert not cost.missing
    assert load_measured(path, "adamw", FlopsCost("adamw")).adamw_seconds_per_element > 0
    hw = load_hardware(str(path))
    assert set(hw.links["intra"]) == set(COLLECTIVES)
    cfg = load_config(["model=qwen3-0.6b", "model.width_div=8", "model.num_layers=2", "parallel.dp=2",
                       "planner.cost=measured", f"planner.measured_table={path}"])
    assert make_plan(cfg).cost_model == "measured"
    res = project(cfg, hw)
    assert res["optimizer_step_ms"] > 0 and res["iteration_ms"] > res["optimizer_step_ms"]


def test_quick_calibration_in_process(tmp_path: Path) -> None:
    opts = parse_args([f"out={tmp_path / 'quick.yaml'}", "quick=true", "collectives=false", "budget_s=1.5",
                       "device=cpu"])
    assert opts.model is False and opts.name == "quick" and opts.width_divs == (8, 16, 32)
    hw = calibrate(opts, log=lambda *_: None)
    path = write_hardware(hw, opts.out)
    _check_hardware(path)
    assert hw["model"]["source"].startswith("estimated")
    assert hw["calibration"]["collectives_source"] == "placeholder" and hw["calibration"]["compute_processes"] == 1
    assert any("placeholders" in note for note in hw["notes"])
    # Muon's stacked Newton-Schulz (optimizer.batch_equal_shapes) is timed beside the loop, per shape
    muon = hw["batched"]["muon"]
    assert muon and all(e["stacked_slope_s"] >= 0.0 for e in muon.values())
    # timed as the trials run: Muon in the option's default dtype on a CPU, the model (had it been
    # timed; the estimate says which rate it used) in what train.dtype=auto resolves to here
    assert hw["ns_dtype"] == "float32" and hw["model"]["dtype"] == pass_dtype("cpu")
    assert all(hw["grad_add_seconds_per_element"][d] > 0 for d in ("float32", "bfloat16"))
    # and out of cache, at an embedding gradient's size (quick: 2^22 elements)
    assert hw["grad_add_large"]["elements"] == 1 << 22
    assert all(hw["grad_add_large"]["seconds_per_element"][d] > 0 for d in ("float32", "bfloat16"))
    assert all(hw["cast_seconds_per_element"][d] > 0 for d in ("float32", "bfloat16"))
    assert hw["model"]["forward"]["flops_per_s"] == 0.5 * hw["compute"]["matmul_flops_per_s"][pass_dtype("cpu")]


def test_ns_dtype_follows_the_device_unless_given() -> None:
    auto = parse_args(["out=x.yaml"])
    assert (auto.ns_dtype_for("cpu"), auto.ns_dtype_for("cuda")) == ("float32", "bfloat16")
    given = parse_args(["out=x.yaml", "ns_dtype=bfloat16"])
    assert (given.ns_dtype_for("cpu"), given.ns_dtype_for("cuda")) == ("bfloat16", "bfloat16")
    with pytest.raises(ConfigError, match="ns_dtype"):
        parse_args(["out=x.yaml", "ns_dtype=fp8"])


@pytest.mark.slow
def test_quick_calibration_cli_with_gloo_collectives(quick_calibration) -> None:
    """``python -m canzona.calibrate quick=true device=cpu`` (the session's run, tests/conftest.py)."""
    out, proc = quick_calibration.path, quick_calibration.proc
    assert proc.returncode == 0, proc.stderr
    _check_hardware(out)
    data = yaml.safe_load(out.read_text())
    assert len(data["calibration"]["collective_samples"]["all_reduce"]) >= 3
    # the one-element all-reduce, timed apart and written beside the fitted line
    (one,) = data["calibration"]["collective_samples"]["all_reduce_one_element"]
    assert one[0] == 4.0 and data["collectives"]["intra"]["all_reduce"]["one_element_s"] == one[1] > 0
    # a call's CPU (caller and gloo's threads) after work apart, at every size, fitted per kind: never nothing
    cpu = data["calibration"]["collective_samples"]["call_cpu"]
    assert set(cpu) == {*COLLECTIVES, "all_reduce_one_element"}
    assert all(len(cpu[k]) >= 3 and all(c >= 0 for _, c in cpu[k]) for k in COLLECTIVES)
    assert all(link["call_cpu_s"] >= 0 and link["call_cpu_s_per_byte"] >= 0
               and link["call_cpu_s"] + link["call_cpu_s_per_byte"] > 0
               for link in data["collectives"]["intra"].values())
    assert data["collectives"]["intra"]["all_reduce"]["one_element_call_cpu_s"] == cpu["all_reduce_one_element"][0][1]
    # what the idle process groups' threads use, a share of a core (none where gloo's loops sleep)
    assert 0.0 <= data["compute"]["idle_threads_cpu_per_s"] < 1.0
    assert data["calibration"]["collectives_source"] == "measured" and data["notes"] == []
    assert data["calibration"]["host_allocator"] == host_memory.POLICY  # timed as a trial's CPU rank runs
    assert data["calibration"]["speed_probe_all_cores_flops_per_s"] > 1e8  # the workers' probe, all at once
    assert 0.0 <= data["compute"]["overlap"] <= 1.0
    # without the model timed (model=false, quick's default) the overlap is measured against matmuls
    assert data["calibration"]["overlap_measurement"]["against"] == "matmul"
    # and the gradient buckets' reductions are not measured apart (the runtime runs the model):
    # the simulator prices them with ``overlap`` (`Hardware.grad_reduce_overlap`)
    assert "grad_reduce_overlap" not in data["compute"]
    assert data["calibration"]["grad_reduce_overlap_measurement"] is None
    # the contended collectives (canzona.calibrate.contended): measured where 2 x cores processes fit
    cores, contended = data["device"]["cores"], data["calibration"]["contended_measurement"]
    if 2 * cores <= 8:
        assert contended["processes"] == 2 * cores and contended["with_all_reduce_s"] > contended["compute_s"] > 0
        assert data["compute"]["sched_wait_s"] == contended["sched_wait_s"] >= 0.0
        # and after each chunk: the wait held non-decreasing in the work, the layer-sized chunk's
        # raw reading the one kept as sched_wait_s
        from canzona.calibrate.contended import CHUNK_MATMULS, CHUNKS

        curve = contended["curve"]
        assert data["compute"]["sched_wait_curve"] == curve and len(curve) == len(CHUNKS)
        works, waits = [w for w, _ in curve], [t for _, t in curve]
        assert works == sorted(works) and waits == sorted(waits) and waits[0] >= 0.0
        layer = contended["samples"][CHUNKS.index(CHUNK_MATMULS)]
        assert (layer["compute_s"], layer["with_all_reduce_s"]) == (contended["compute_s"], contended["with_all_reduce_s"])
        assert contended["sched_wait_s"] <= waits[CHUNKS.index(CHUNK_MATMULS)]
    else:
        assert contended is None and data["compute"]["sched_wait_s"] == 0.0 and data["compute"]["sched_wait_curve"] == []
    # the peers' drift by the work between collectives (canzona.calibrate.peer_wait): on as many
    # processes as cores, one point per compute chunk, the work growing with the chunk
    drift = data["calibration"]["peer_wait_measurement"]
    if 2 <= cores <= 8:
        from canzona.calibrate.peer_wait import CHUNKS

        works = [w for w, _ in drift["points"]]
        assert drift["processes"] == cores - cores % 2 and len(works) == len(CHUNKS)
        waits = [t for _, t in drift["points"]]
        assert works == sorted(works) and works[0] > 0 and waits == sorted(waits) and waits[0] >= 0.0
        assert data["compute"]["peer_wait"] == drift["points"]
    else:
        assert drift is None and data["compute"]["peer_wait"] == []


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_quick_gpu_calibration(tmp_path: Path) -> None:
    """On CUDA: collectives over NCCL with two GPUs; with one, the spec's collectives, said so."""
    import torch

    out = tmp_path / "gpu.yaml"
    proc = subprocess.run([sys.executable, "-m", "canzona.calibrate", f"out={out}", "quick=true", "device=cuda"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(out.read_text())
    assert data["device"]["kind"] == "cuda" and data["calibration"]["device"] == "cuda"
    assert data["ns_dtype"] == "bfloat16" and data["model"]["dtype"] == "bfloat16"
    for opt in ("muon", "shampoo", "soap"):
        assert all(v > 0 for v in data["updates"][opt].values())
    source = data["calibration"]["collectives_source"]
    if torch.cuda.device_count() >= 2:
        assert source == "measured"
    else:
        assert source in ("spec", "placeholder") and data["notes"]
        assert (source == "spec") == (data["calibration"]["spec"] is not None)
    assert set(load_hardware(str(out)).links["intra"]) == set(COLLECTIVES)


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="out=PATH is required"):
        parse_args(["quick=true"])
    with pytest.raises(ConfigError, match="unknown calibrate key 'qiuck'; allowed under top level: budget_s"):
        parse_args(["out=x.yaml", "qiuck=true"])
    with pytest.raises(ConfigError, match="optimizers"):
        parse_args(["out=x.yaml", "optimizers=muon,lion"])
    with pytest.raises(ConfigError, match="unknown flag --fast"):
        parse_args(["out=x.yaml", "--fast"])
    with pytest.raises(ConfigError, match="quick"):
        parse_args(["out=x.yaml", "quick=maybe"])
    with pytest.raises(ConfigError, match="device='tpu'; allowed: auto, cpu, cuda"):
        parse_args(["out=x.yaml", "device=tpu"])
    with pytest.raises(ConfigError, match="spec='mi300x'"):
        parse_args(["out=x.yaml", "spec=mi300x"])
    with pytest.raises(ConfigError, match="width_divs"):
        parse_args(["out=x.yaml", "width_divs=8,x"])
    proc = subprocess.run([sys.executable, "-m", "canzona.calibrate", "quick=true"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error:")


def test_shapes_put_the_local_sweep_first() -> None:
    shapes = calibration_shapes([16, 32])
    local = local_sweep_shapes()
    first = local_sweep_models()[0]
    assert [p.shape for p in build_inventory(model_config(*first, 1)) if p.kind == "matrix"] == local[:4]
    assert shapes[: len(local)] == local
    assert len(shapes) == len(set(shapes))
    assert (25600 * 2, 5120) in shapes  # full-size Qwen3-32B fc1 is listed (timed if the budget allows)


def test_fits_recover_known_parameters() -> None:
    sizes = [1e3, 1e5, 1e6, 1e7]
    samples = [[n, 2e-4 + 0.5 * n / 2e9] for n in sizes]  # reduce-scatter over 2 ranks moves half
    link = fit_link("reduce_scatter", samples)
    assert link["latency_s"] == pytest.approx(2e-4, rel=1e-6) and link["bandwidth_Bps"] == pytest.approx(2e9, rel=1e-6)
    pts = [{"layers": L, "flops": f, "forward_s": 1e-3 + L * 2e-3 + f / 1e10, "backward_s": 0.0}
           for L, f in [(1, 1e7), (2, 2e7), (4, 3e7), (2, 9e7)]]
    fit = fit_pass(pts, "forward_s", 1.0)
    assert np.allclose([fit["fixed_s"], fit["layer_s"], fit["flops_per_s"]], [1e-3, 2e-3, 1e10], rtol=1e-6)


def test_the_call_cpu_fit_recovers_a_line_and_keeps_both_terms_non_negative() -> None:
    """A collective's CPU per call (`canzona.calibrate.comm.time_call_cpu`) on (1, volume): a line
    is recovered; a falling one (noise about a constant) is its mean, a line through zero its slope."""
    from canzona.calibrate.fit import fit_call_cpu
    from canzona.hardware import Link

    sizes = [1024.0, 65536.0, 524288.0, 4194304.0]
    fit = fit_call_cpu("all_gather", [[n, 3e-4 + 0.5 * n * 1e-9] for n in sizes])  # 2 ranks: half the bytes
    assert fit == pytest.approx({"call_cpu_s": 3e-4, "call_cpu_s_per_byte": 1e-9}, rel=1e-6)
    link = Link(1e-4, 1e9, 1e-4, 0.0, **fit)
    assert link.call_cpu("all_gather", 2, 4194304.0) == pytest.approx(3e-4 + 0.5 * 4194304 * 1e-9, rel=1e-6)
    # at 4 ranks: three ring steps of the per-call part, the ring's volume
    assert link.call_cpu("all_gather", 4, 4194304.0, ring=True) == pytest.approx(9e-4 + 0.75 * 4194304 * 1e-9, rel=1e-6)
    falling = fit_call_cpu("all_reduce", [[n, 4e-4 - i * 1e-5] for i, n in enumerate(sizes)])
    assert falling == pytest.approx({"call_cpu_s": 3.85e-4, "call_cpu_s_per_byte": 0.0})
    through_zero = fit_call_cpu("broadcast", [[n, n * 2e-9 - 1e-6] for n in sizes])
    assert through_zero["call_cpu_s"] == 0.0 and through_zero["call_cpu_s_per_byte"] == pytest.approx(2e-9, rel=1e-3)


def test_a_fitted_all_reduce_prices_the_two_process_timings_it_was_fitted_on() -> None:
    """The intercept of two processes' all-reduce timings is both ring steps' latency: the link
    gives each step half of it, so at two ranks the file prices exactly what was measured (it
    priced twice the intercept before calibration format 9), and each further ring step one
    such step (gloo: ``ring``)."""
    from canzona.hardware import Link

    sizes = [1024.0, 65536.0, 524288.0, 4194304.0]
    samples = [[n, 1.2e-3 + n / 1.5e9] for n in sizes]  # 2 ranks move 2·(1/2)·N bytes
    fit = fit_link("all_reduce", samples)
    link = Link(**fit)
    for n, t in samples:
        assert sum(link.parts("all_reduce", 2, n, ring=True)) == pytest.approx(t, rel=1e-6)
    assert link.parts("all_reduce", 4, 1024.0, ring=True)[0] == pytest.approx(3 * 1.2e-3, rel=1e-6)


def test_a_one_element_all_reduce_is_priced_by_its_own_timing() -> None:
    """gloo sends a one-element all-reduce (the step barrier, the gradient norm) far faster
    than the link's line says; a link that timed it prices such all-reduces by that timing,
    scaled by ring steps beyond two ranks, and anything larger by the line."""
    from canzona.hardware import Link

    link = Link(latency_s=6e-4, bandwidth_Bps=1e9, step_latency_s=6e-4, one_element_s=3e-4)
    assert link.parts("all_reduce", 2, 4.0, ring=True) == (3e-4, 0.0)
    assert link.parts("all_reduce", 4, 4.0, ring=True) == (pytest.approx(9e-4), 0.0)
    assert link.parts("all_reduce", 2, 8.0, ring=True)[0] == pytest.approx(1.2e-3)
    assert Link(6e-4, 1e9, 6e-4).parts("all_reduce", 2, 4.0, ring=True)[0] == pytest.approx(1.2e-3)


def test_process_layout_and_what_one_gpu_keeps() -> None:
    """The decisions a GPU calibration takes, checked without a GPU: how many processes, and
    with one GPU the spec's collectives kept and said so."""
    from canzona.calibrate.build import _collectives, match_spec, processes
    from canzona.hardware import spec_hardware

    opts = parse_args(["out=x.yaml", "quick=true"])
    assert processes(opts, "cpu", 0) == 2  # gloo collectives between two processes
    assert processes(opts, "cuda", 8) == 2 and processes(opts, "cuda", 1) == 0  # quick: no model pass
    assert processes(parse_args(["out=x.yaml"]), "cuda", 1) == 1  # the model pass, no collectives
    assert match_spec(opts, "NVIDIA H200") == "h200" and match_spec(opts, "NVIDIA GeForce RTX 4090") is None
    assert match_spec(parse_args(["out=x.yaml", "spec=none"]), "NVIDIA H200") is None
    notes: list[str] = []
    links, source, overlap = _collectives(opts, "cuda", 1, {}, "h200", notes)
    assert source == "spec" and links == spec_hardware("h200")["collectives"] and overlap == 1.0
    assert "1 GPU visible" in notes[0] and "h200" in notes[0]
    notes.clear()
    links, source, _ = _collectives(opts, "cuda", 1, {}, None, notes)
    assert source == "placeholder" and "spec=h100|h200|a100" in notes[0]
    assert set(links["intra"]) == set(COLLECTIVES)
