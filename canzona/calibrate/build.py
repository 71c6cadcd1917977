"""Running the calibration and assembling its hardware file (format: `canzona.hardware`)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from canzona.calibrate.comm import CALL_CPU, ONE_ELEMENT
from canzona.calibrate.compute import measure_compute
from canzona.calibrate.fit import fit_call_cpu, fit_link, fit_pass
from canzona.calibrate.model_pass import pass_dtype
from canzona.calibrate.settings import Options
from canzona.calibrate.workers import run_workers
from canzona.devices import resolve_device
from canzona.hardware import COLLECTIVES, SPECS, Link, spec_hardware
from canzona.host_memory import retain_freed_memory

# Links written when collectives are neither measured nor taken from a spec (collectives=false on CPU).
PLACEHOLDER_LINK = {"latency_s": 1e-4, "step_latency_s": 1e-4, "bandwidth_Bps": 1e9}


def processes(opts: Options, kind: str, gpus: int) -> int:
    """How many worker processes time the device (0: this process alone, nothing distributed).

    CPU: two, sharing the cores as a trial's ranks do, whenever collectives or the model are
    timed. CUDA: one per GPU, two when two are visible and collectives are wanted; with one GPU
    a single worker (for the model pass) or none.
    """
    if kind == "cpu":
        return 2 if (opts.collectives or opts.model) else 0
    if opts.collectives and gpus >= 2:
        return 2
    return 1 if opts.model else 0


def match_spec(opts: Options, device_name: str) -> str | None:
    """The spec-derived hardware standing in for what cannot be measured here (``spec=auto``: the one
    whose key appears in the device's name, e.g. h200 for "NVIDIA H200")."""
    if opts.spec == "none":
        return None
    if opts.spec != "auto":
        return opts.spec
    return next((key for key in SPECS if key in device_name.lower()), None)


# What a calibration measures, by version: 2 adds gradient clipping's norm and scaling passes,
# times AdamW through the executor's fused kernel and records the CPU's speed probe (`canzona.calibrate.machine` retakes older files)
CALIBRATION_FORMAT = 16  # 3: a CPU's scheduling wait of collectives under oversubscription (`canzona.calibrate.contended`);
# 4: the model passes timed in the dtype trials train in (`model_pass.pass_dtype`), Muon in ``ns_dtype``;
# 5: a gradient's landing in the fp32 buffer per element and dtype (``grad_add_seconds_per_element``);
# 6: the step's passes (norm, scale, AdamW, apply) timed with cold caches on a CPU, AdamW without
#    an extra pass over its second moment, the fp32 -> model cast per dtype (``cast_seconds_per_element``);
# 7: the overlap measured against the model's backward when the model is timed (`comm.time_overlap`)
# 8: a collective's wait for its peers by the work done since they last met (`canzona.calibrate.peer_wait`)
# 9: a link's latency per ring step from the fitted intercept (an all-reduce's two steps at 2 processes
#    were priced twice the intercept before), the one-element all-reduce (``one_element_s``)
# 10: the contended wait after a layer's work (2.5 ms) instead of 0.3 ms, more rounds; the small
#     collectives' means over four times the repeats
# 11: the contended wait after several amounts of work apart (``compute.sched_wait_curve``,
#     `canzona.calibrate.contended`), what an oversubscribed trial's collectives wait by
# 12: a gradient's landing out of cache too, at an embedding's size (``grad_add_large``)
# 13: the CPU a collective costs its process after work apart, caller and gloo's threads
#     (``collectives.intra.<kind>.call_cpu_s`` and ``call_cpu_s_per_byte``, `canzona.calibrate.comm.time_call_cpu`)
# 14: what a rank's idle threads use a second (``compute.idle_threads_cpu_per_s``, `canzona.calibrate.comm.idle_threads_cpu`)
# 15: a CPU's processes keep the memory they free, as a trial's CPU ranks now do (`canzona.host_memory`;
#     ``calibration.host_allocator``): glibc's page faults no longer decide a model pass's time
# 16: the gradient buckets' reductions' overlap with the backward, as a trial's runtime issues them
#     (``compute.grad_reduce_overlap``, `canzona.calibrate.grad_overlap`)


def calibrate(opts: Options, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Measure this machine and return its hardware description (a dict; `write_hardware` writes
    it); with ``repeats`` > 1, that many calibrations in a row, number by number their median
    (`canzona.calibrate.repeat`), with the spread of a few headline numbers recorded."""
    if opts.repeats <= 1:
        return _calibrate_once(opts, log)
    runs = []
    for k in range(opts.repeats):
        log(f"calibration {k + 1} of {opts.repeats}:")
        runs.append(_calibrate_once(opts, log))
    return merge_calibrations(runs, log)


def merge_calibrations(runs: list[dict[str, Any]], log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Several calibrations of this machine as one: number by number their median
    (`canzona.calibrate.repeat`), ``calibration.repeats`` their count and ``spread`` how far a
    few headline numbers moved between them."""
    from canzona.calibrate.repeat import median_of, spread

    if len(runs) == 1:
        return runs[0]
    out = median_of(runs)
    out["calibration"] = {**out["calibration"], "repeats": len(runs), "spread": spread(runs)}
    log("  median of the calibrations; their spread: " + ", ".join(
        f"{k} {lo:g}-{hi:g}" for k, (lo, hi) in out["calibration"]["spread"].items()))
    return out


def _calibrate_once(opts: Options, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """One calibration of this machine (`calibrate`)."""
    import torch

    started = time.perf_counter()

    def stamp(what: str) -> None:
        log(f"  [{time.perf_counter() - started:5.1f} s] {what}")

    kind = resolve_device(opts.device, required=True, key="device")  # the device timed must be here
    gpus = torch.cuda.device_count() if kind == "cuda" else 0  # read on CUDA only
    # before anything is timed here (compute without workers, the speed probe): as a trial's CPU rank runs
    allocator = retain_freed_memory() if kind == "cpu" else None
    world = processes(opts, kind, gpus)
    backend = "nccl" if kind == "cuda" else "gloo"
    log(f"calibrating {kind}{f' ({gpus} GPU(s) visible)' if kind == 'cuda' else ''} with {opts.threads} "
        f"thread(s){' (quick)' if opts.quick else ''} ...")
    workers: dict[str, Any] = {}
    if world:
        workers = run_workers(opts, kind, world)
        compute = workers["compute"]
        stamp(f"compute ({world} process(es) at once)" + (f", collectives ({backend})" if workers.get("collectives") else "")
              + (", model" if workers.get("model") else ""))
    else:
        compute = measure_compute(opts, torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else "cpu")
        stamp("compute (this process)")
    basics, upd = compute["basics"], compute["updates"]
    log(f"  matmul {basics['matmul_float32'] / 1e9:.1f} GFLOP/s fp32, AdamW {basics['adamw_seconds_per_element'] * 1e9:.3f} "
        f"ns/element; optimizer updates: {', '.join(f'{o} {len(t)} shapes' for o, t in upd['updates'].items())}")

    device = _device_info(opts, kind, gpus)
    spec = match_spec(opts, device["name"]) if kind == "cuda" else None
    notes: list[str] = []
    collectives, collectives_source, overlap = _collectives(opts, kind, gpus, workers, spec, notes)
    # the latency of a 64-float all-reduce between two processes (two ring steps), which the
    # contended and drift measurements take out of their differences
    pair_latency = Link(**collectives["intra"]["all_reduce"]).parts("all_reduce", 2, 256.0, ring=True)[0]
    if workers.get("collectives"):
        intra = collectives["intra"]["all_reduce"]
        log(f"  collectives ({backend}, 2 processes): all_reduce {pair_latency * 1e6:.0f} us + "
            f"{intra['bandwidth_Bps'] / 1e9:.2f} GB/s"
            + (f", one element {intra['one_element_s'] * 1e6:.0f} us" if "one_element_s" in intra else ""))
    grad = workers.get("grad_reduce_overlap")
    if grad:
        log(f"  gradient reductions beside the backward ({grad['buckets']} buckets, as the runtime issues them): "
            f"{grad['overlapped_ms']:.1f} ms overlapped, {grad['backward_ms']:.1f} + {grad['reduce_ms']:.1f} ms apart: "
            f"overlap {grad['overlap']:.2f} (the general one {overlap:.2f})")
    for note in notes:
        log(f"  note: {note}")
    contended = None
    if kind == "cpu" and workers.get("collectives") and opts.threads == 1:
        from canzona.calibrate.contended import measure_sched_wait

        contended = measure_sched_wait(int(device.get("cores") or 0), pair_latency, opts.quick)
        if contended:
            stamp(f"collectives with {contended['processes']} processes on {contended['cores']} cores: "
                  f"{contended['sched_wait_s'] * 1e3:.2f} ms scheduling wait each after a layer's work; "
                  + ", ".join(f"{w * 1e3:.2f} ms after {work * 1e3:.1f} ms" for work, w in contended["curve"]))
    drift = None
    if kind == "cpu" and workers.get("collectives") and opts.threads == 1:
        from canzona.calibrate.peer_wait import measure_peer_wait

        drift = measure_peer_wait(int(device.get("cores") or 0), pair_latency, opts.quick)
        if drift:
            stamp("peers' drift before a collective: " + ", ".join(
                f"{w * 1e3:.2f} ms after {work * 1e3:.1f} ms of work" for work, w in drift["points"]))
    mm = basics["matmul_float32"]
    model_dtype = pass_dtype(kind)
    model_mm = basics["matmul_bfloat16"] if model_dtype == "bfloat16" else mm
    model: dict[str, Any] = {"dtype": model_dtype}
    if workers.get("model"):
        pts = workers["model"]
        model.update(source="measured", forward=fit_pass(pts, "forward_s", 0.5 * model_mm),
                     backward=fit_pass(pts, "backward_s", 0.5 * model_mm), points=pts)
        log(f"  model: forward {model['forward']['flops_per_s'] / 1e9:.1f} GFLOP/s + "
            f"{model['forward']['layer_s'] * 1e3:.2f} ms/layer")
    else:
        model.update(source="estimated from the matmul rate (model=false or quick=true)",
                     forward={"fixed_s": 2e-3, "layer_s": 1.5e-3, "flops_per_s": 0.5 * model_mm},
                     backward={"fixed_s": 3e-3, "layer_s": 3e-3, "flops_per_s": 0.5 * model_mm})
    measured_by = f"{world or 1} process(es)" + (" on their own GPUs" if kind == "cuda" else "")
    hardware = {
        "name": opts.name,
        "source": "calibrated" if collectives_source != "spec" else f"calibrated, collectives spec-derived ({spec})",
        "description": f"calibrated on {device['host']} ({device['name']}, {device['cores']} cores) with "
                       f"{opts.threads} thread(s) per process, {measured_by}; collectives: {collectives_source}",
        "device": device,
        "topology": {"ranks_per_node": SPECS[spec].ranks_per_node if spec else None},
        "compute": {
            "matmul_flops_per_s": {"float32": mm, "bfloat16": basics["matmul_bfloat16"]},
            "eigh_flops_per_s": upd["eigh_flops_per_s"],
            "memory_bytes_per_s": 1.0 / basics["copy_seconds_per_byte"],
            "call_overhead_s": float(np.median(list(upd["update_overhead_s"].values()))) if upd["update_overhead_s"] else 0.0,
            "overlap": overlap,
            **({"grad_reduce_overlap": float(grad["overlap"])} if grad else {}),
            "sched_wait_s": contended["sched_wait_s"] if contended else 0.0,
            "peer_wait": drift["points"] if drift else [],
            "sched_wait_curve": contended["curve"] if contended else [],
            "idle_threads_cpu_per_s": float(workers.get("idle_threads_cpu_per_s", 0.0)),
        },
        "ns_dtype": opts.ns_dtype_for(kind),
        "precondition_frequency": opts.precondition_frequency,
        "updates": upd["updates"],
        "batched": upd["batched"],
        "update_overhead_s": upd["update_overhead_s"],
        **{k: basics[k] for k in ("adamw_seconds_per_element", "adamw_tensor_overhead_s", "apply_seconds_per_element",
                                  "apply_call_overhead_s", "copy_seconds_per_byte", "copy_call_overhead_s",
                                  "norm_seconds_per_byte", "norm_call_overhead_s", "scale_seconds_per_byte",
                                  "scale_call_overhead_s", "grad_add_seconds_per_element", "grad_add_large",
                                  "cast_seconds_per_element")
           if k in basics},
        "model": model,
        "collectives": collectives,
        "notes": notes,
        "calibration": {
            "format": CALIBRATION_FORMAT,
            "quick": opts.quick, "budget_s": opts.budget_s, "width_divs": list(opts.width_divs), "device": kind,
            "compute_processes": world or 1, "spec": spec, "collectives_source": collectives_source,
            "shapes_skipped": upd["skipped"], "shapes_retimed": upd.get("retimed", 0),
            "overlap_measurement": workers.get("overlap"),
            "grad_reduce_overlap_measurement": grad, "collective_samples": workers.get("collectives"),
            "contended_measurement": contended, "peer_wait_measurement": drift,
            "seconds": None,
        },
    }
    if kind == "cpu":  # this machine's speed at calibration time (`canzona.calibrate.probe`)
        from canzona.calibrate.probe import speed_probe

        hardware["calibration"]["host_allocator"] = allocator
        hardware["calibration"]["speed_probe_flops_per_s"] = speed_probe()
        if workers.get("speed_probe_all_cores"):  # the workers' probe, all of them at once (`per_core`)
            hardware["calibration"]["speed_probe_all_cores_flops_per_s"] = workers["speed_probe_all_cores"]
    hardware["calibration"]["seconds"] = round(time.perf_counter() - started, 1)
    return hardware


def _collectives(opts: Options, kind: str, gpus: int, workers: dict[str, Any], spec: str | None,
                 notes: list[str]) -> tuple[dict[str, Any], str, float]:
    """(the hardware file's ``collectives``, where they came from: measured | spec | placeholder,
    the overlap fraction)."""
    samples = workers.get("collectives")
    if samples:
        out: dict[str, Any] = {"intra": {k: fit_link(k, samples[k]) for k in COLLECTIVES}}
        if samples.get(ONE_ELEMENT):
            out["intra"]["all_reduce"]["one_element_s"] = float(samples[ONE_ELEMENT][0][1])
        cpu = samples.get(CALL_CPU) or {}
        for k in COLLECTIVES:
            if cpu.get(k):
                out["intra"][k].update(fit_call_cpu(k, cpu[k]))
        if cpu.get(ONE_ELEMENT):
            out["intra"]["all_reduce"]["one_element_call_cpu_s"] = float(cpu[ONE_ELEMENT][0][1])
        if spec:
            out["inter"] = spec_hardware(spec)["collectives"]["inter"]
            notes.append(f"collectives between nodes (inter) are spec-derived ({spec}): one node cannot measure them")
        return out, "measured", float((workers.get("overlap") or {}).get("overlap", 0.0))
    why = ("collectives=false" if not opts.collectives
           else f"{gpus} GPU visible: the collectives need two" if kind == "cuda" else "not measured")
    if spec:
        sp = spec_hardware(spec)
        notes.append(f"{why}; kept the spec-derived collectives and overlap of {spec} "
                     f"(canzona.hardware.spec_hardware('{spec}'))")
        return sp["collectives"], "spec", float(sp["compute"]["overlap"])
    notes.append(f"{why}; collectives are placeholders (100 us, 1 GB/s), not measurements"
                 + (": give spec=h100|h200|a100 to use a spec's" if kind == "cuda" else ""))
    return {"intra": {k: dict(PLACEHOLDER_LINK) for k in COLLECTIVES}}, "placeholder", 0.0


def _device_info(opts: Options, kind: str, gpus: int) -> dict[str, Any]:
    import torch

    name = torch.cuda.get_device_name(torch.cuda.current_device()) if kind == "cuda" else (
        platform.processor() or platform.machine())
    info = {"name": name, "kind": kind, "host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch": str(torch.__version__), "cores": os.cpu_count(), "threads": opts.threads,
            "python": platform.python_version()}
    if kind == "cuda":
        info["gpus_visible"] = gpus
    return info


def write_hardware(hardware: dict[str, Any], out: str | Path) -> Path:
    """Write the hardware file as YAML (atomically), with a header saying what wrote it."""
    from canzona.records import atomic_write_text

    out = Path(out)
    header = (f"# Calibrated hardware file, written by `python -m canzona.calibrate` on {hardware['device']['host']} "
              f"at {hardware['device']['date']}.\n# Format: canzona/hardware.py. `updates` is the table "
              "planner.cost=measured reads (seconds per update of one matrix).\n")
    atomic_write_text(out, header + yaml.safe_dump(hardware, sort_keys=False, width=110))
    return out
