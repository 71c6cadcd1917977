"""Simulate one training iteration of any method on a hardware description.

`simulate` lowers the plan to every rank's program (`canzona.program.lower`, the programs the
executor runs) and runs them through `canzona.sim.interpret.ProgramSim` on a `Timeline`; the
simulator holds no rules of its own about methods, collectives or the pipeline.
`project(cfg, hardware)` returns a summary-like dict (see its docstring); `write_trial` records
it like a measured trial; ``python -m canzona.sim.simulate`` prints one projection.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from canzona.config import TrialConfig
from canzona.hardware import DEFAULT_HARDWARE, Hardware, load_hardware
from canzona.overrides import Renamed
from canzona.plan.from_config import threads_per_rank
from canzona.plan.summary import plan_record
from canzona.plan.types import Plan
from canzona.program.count import count_programs
from canzona.program.lower import lower
from canzona.records import PHASES, write_records
from canzona.sim.claims import PAPER_CLAIMS  # re-exported: the paper's headline, beside projections
from canzona.sim.interpret import ProgramSim
from canzona.sim.model import ModelWork, forward_flops, model_work

# The command's own keys that were renamed (its trial keys: `canzona.config.RENAMED`).
RENAMED = {"profile": Renamed("hardware", "the hardware file: h100, h200, a100, local, or a YAML path")}


# ---------------------------------------------------------------------------------- entry points
def oversubscription(cfg: TrialConfig, hw: Hardware) -> tuple[float, int, int]:
    """CPU hardware: (how much longer a rank's work takes than the calibration timed it, at least
    1; threads; cores). Where ranks × threads per rank exceed the cores, that ratio, and more
    where the file measured what a rank's idle threads use (``idle_threads_cpu_per_s``, ρ):
    the R ranks keep R·ρ of the C cores busy, so each rank's threads share C − R·ρ, where the
    calibration's processes, a core each, had 1 − ρ: the ratio × (1 − ρ) · C / (C − R·ρ)."""
    cores = hw.device.get("cores")
    if hw.device.get("kind", "cpu") != "cpu" or not cores:
        return 1.0, 1, 0
    cores = int(cores)
    threads = threads_per_rank(cfg, cores=cores)  # as a trial of this world on those cores would run
    ratio = cfg.world_size * threads / cores
    if ratio <= 1.0:
        return 1.0, threads, cores
    idle = min(hw.idle_threads_cpu_per_s, 0.5 * cores / cfg.world_size)  # (never more than half the cores)
    return ratio * (1.0 - idle) * cores / (cores - cfg.world_size * idle), threads, cores


def simulate(cfg: TrialConfig, hardware: Any, plan: Plan | None = None) -> ProgramSim:
    """Run the timeline of one iteration; returns the simulator (timeline in ``.tl``).

    On an oversubscribed CPU (more ranks × threads than cores) the host work and the collectives'
    transfers are stretched by that ratio throughout the iteration, the optimizer step included
    (`canzona.sim.timeline`; latencies are not: a rank waiting on its peers holds no core). The
    step is not given a smaller ratio for ranks that wait: measured on the README's first sweep
    (4 ranks on 2 cores, docs/results.md), the ranks' compute phases take the full ratio even
    where their mean number of busy ranks is lower.
    """
    from canzona.plan.from_config import make_plan

    hw = load_hardware(hardware)
    if plan is None:  # planned for the hardware's device, with its roofline where it is not this machine's
        kind = str(hw.device.get("kind", "cpu"))
        plan = make_plan(cfg, device=kind, hardware=hw)
    programs = lower(plan)
    scale, _, _ = oversubscription(cfg, hw)
    if scale > 1.0:
        hw = hw.oversubscribed()
    sim = ProgramSim(cfg, plan, programs, hw, scale, scale)
    sim.run()
    sim.programs_ = programs
    return sim


def assumptions(cfg: TrialConfig, hw: Hardware, scale: float, step_scale: float = 1.0,
                plan: Plan | None = None) -> list[str]:
    """What a projection rests on, one line each (shown with every projection in the report)."""
    from canzona.optim import registry

    opt = cfg.optimizer.name
    has_table = bool(hw.batched.get(opt))
    ex = plan.execution if plan is not None else None
    matmul_dtype = registry.get(opt).matmul_dtype(cfg.optimizer) if opt in registry.NAMES else "float32"
    out = [
        f"hardware {hw.name} ({hw.source}); device {hw.device.get('name')}",
        "the programs the executor runs (canzona.program.lower), interpreted on a per-rank timeline: a collective "
        "starts when every member has issued it and its stream is free; a rank blocks at a wait",
        "steady state: with the overlapped parameter gather two iterations are simulated and the second measured; "
        "the median step has no Shampoo/SOAP preconditioner refresh",
        "forward flops 2·T·(local matmul weights, output layer included) + 4·L·(heads·head_dim/tp)·seq·T, "
        "backward twice that, at the hardware's rate plus fixed and per-layer overheads; "
        + (f"{cfg.train.grad_accum} micro-batches per iteration (gradient accumulation)" if cfg.train.grad_accum > 1
           else "one micro-batch per iteration (no gradient accumulation)")
        + ", no pipeline parallelism, "
        + ("full activation recomputation (each layer's forward, TP collectives included, again in backward)"
           if cfg.train.recompute == "full" else "no activation recomputation"),
        (f"Megatron sequence parallelism: b·s·hidden {hw.model_dtype} activations all-gathered into each "
         "column-parallel linear and reduce-scattered out of each row-parallel one (forward: 2 + 2 per layer, "
         "embedding reduce-scatter, output-layer all-gather; backward: the column-parallel inputs gathered again, "
         "4 all-gathers + 2 reduce-scatters per layer), 3 small cross-entropy all-reduces, the norms' partial "
         "gradients all-reduced over TP; all on the critical path (Megatron hides part of the backward's behind "
         "the weight-gradient GEMMs)") if cfg.sequence_parallel else
        (f"Megatron TP all-reduces of b·s·hidden {hw.model_dtype} activations: 2 per layer + 1 embedding forward, "
         "2 per layer + 1 output layer backward, 3 small cross-entropy all-reduces; no sequence parallelism"),
    ]
    if opt == "muon" and getattr(cfg.optimizer, "batch_equal_shapes", False):
        out.append("optimizer.batch_equal_shapes: each call's equal-shape matrices in one stacked Newton–Schulz, "
                   + ("priced from the hardware file's stacked timing (stacked_slope_s)" if hw.stacked_measured(opt)
                      else "priced as one at a time: the hardware file has no stacked timing (calibrate it)"))
    if cfg.model_cfg().moe:
        mcfg, lay = cfg.model_cfg(), cfg.expert_layout()
        out.append(
            f"MoE: {mcfg.num_experts} experts per layer, top-{mcfg.top_k}, over EP {lay.ep} x expert-TP {lay.etp} x "
            f"expert-DP {lay.edp}; balanced routing (every expert the same share of the tokens: a real router's "
            "imbalance makes the busiest expert's rank slower); each rank routes its T/tp tokens; the dispatch and "
            "the combine one all-to-all each over the EP group forward and again backward (the share kept "
            "locally not sent), blocking, plus an all-gather and a reduce-scatter over expert-TP when it is > 1; "
            "no auxiliary load-balancing loss, no token dropping; the expert buffer reduced over its expert-DP "
            "group, its gradients scaled by 1/DP")
    if ex is not None:
        out += [
            f"dtypes: parameters, activations and the parameter all-gather {ex.dtype} ({ex.dtype_reason}); gradients, "
            "their reduction and the TP gathers/scatters float32; "
            + ("fp32 main parameters updated and copied into the model inside the step"
               if ex.dtype != "float32" else "the model's parameters are the main parameters"),
            (f"gradient-norm clipping at {ex.clip_grad:g} inside the step: a {ex.clip_norm_dtype} sum of squares per "
             "rank and its all-reduce, then scaling" if ex.clip_grad > 0 else "no gradient clipping"),
            ("parameter all-gather overlapped with the next forward as Megatron does: one bucket in flight, each "
             "waited for in the pre-hook of the first module using it, which dispatches the next"
             if ex.overlap_param_gather else "parameter all-gather after the step, not overlapped"),
            f"uneven DP shards: dist.dp_collective={ex.dp_collective} (per bucket: even, padded, or the per-shard "
            "rooted calls as one coalesced group" + ("" if hw.coalesces else ", run one after another on this device")
            + "); bucket reductions issued from backward hooks" * ex.overlap_grad_reduce,
        ]
    out += [
        "collectives: latency + (steps - 1)·step latency + bytes/bandwidth, ring volumes and steps (all-reduce: "
        "the tree's 2·log2 P steps when fewer); a group spanning more than one node runs at the network bandwidth "
        "(one NIC per GPU); concurrent groups do not contend; "
        + (f"a group runs {hw.comm_lanes} of its collectives at once (gloo's worker threads), each in issue order"
           if hw.comm_lanes > 1 else "a group runs its collectives one after another (one stream per communicator)"),
        f"ranks TP-contiguous (rank = dp_rank·tp + tp_rank), {hw.ranks_per_node or 'all'} ranks per node",
        f"communication/compute overlap fraction {hw.overlap:g}"
        + (f" (the gradient buckets' reductions beside the backward: {hw.grad_reduce_overlap:g}, measured as the "
           "runtime issues them)" if hw.grad_reduce_overlap != hw.overlap else ""),
        ("optimizer updates from the hardware file's measured per-shape table (unmeasured shapes scaled by flops), "
         "matrix by matrix as the executor runs them"
         if has_table else
         f"optimizer updates from flops at {hw.matmul_flops.get(matmul_dtype, hw.matmul_flops['float32']) / 1e12:.3g} "
         f"TFLOP/s ({matmul_dtype}) plus elementwise passes at the memory bandwidth, matrix by matrix"),
    ]
    if scale > 1.0:
        ag = hw.links["intra"]["all_gather"]
        out.append(f"CPU oversubscribed: {cfg.world_size} ranks on {hw.device.get('cores')} cores: host work and "
                   f"collectives ×{scale:.3g} (the optimizer step too; gloo's calls keep a core busy, latency "
                   "included), the model pass's blocking TP collectives not stretched"
                   + (f"; the ratio includes the {hw.idle_threads_cpu_per_s * 1e3:.2g} ms of CPU a second each rank's idle "
                      "threads use (the calibration's)" if hw.idle_threads_cpu_per_s else "")
                   + (f"; every collective waits {hw.sched_wait_s * 1e3:.2g} ms more for its peers to be scheduled "
                      "(the calibration's contended measurement)" if hw.sched_wait_s else "")
                   + (f"; after the backward, each collective's own CPU, caller's and gloo's threads (the calibration's: "
                      f"{ag.call_cpu_s * 1e3:.2g} ms + {ag.call_cpu_s_per_byte * 1e9:.2g} ms/MB for an all-gather "
                      f"over two) is charged, stretched, to its issuing rank's host" if ag.call_cpu_s or ag.call_cpu_s_per_byte
                      else ""))
    contended_curve = scale > 1.0 and bool(hw.sched_wait_curve)
    drift = hw.oversubscribed().peer_wait if contended_curve else hw.peer_wait
    if drift and cfg.world_size > 1:
        out.append("every collective starts after its members' drift: the wait the calibration measured after the "
                   "most work a member did since its previous collective ("
                   + ", ".join(f"{t * 1e3:.2g} ms after {w * 1e3:.2g} ms" for w, t in drift)
                   + ("; under oversubscription: canzona.calibrate.contended's curve beyond its wait after a layer's work"
                      if contended_curve else "; canzona.calibrate.peer_wait")
                   + "); the optimizer step, as the records take it (the slowest "
                   "rank's), longer than the lockstep ranks' by the drift of the work after their last collective"
                   + (" (the whole contended curve: no collective there waits the scheduling wait)" if contended_curve else ""))
    calib_threads = hw.device.get("threads")
    if hw.device.get("kind") == "cpu" and calib_threads and cfg.dist.threads_per_rank not in (None, calib_threads):
        out.append(f"trial uses {cfg.dist.threads_per_rank} threads per rank, the hardware file was timed with {calib_threads}")
    return out


def project(cfg: TrialConfig, hardware: Any, *, plan: Plan | None = None, events: str = "auto") -> dict[str, Any]:
    """Predicted summary of one trial (one iteration, max over ranks, milliseconds).

    Keys: ``iteration_ms``, ``optimizer_step_ms``, ``param_sync_ms``, ``param_sync_transfer_ms``
    (the exposed parameter sync less waiting for peers still in their step), ``param_gather_ms``
    (the gathers' own transfer time) and ``param_sync_bound_ms`` (the part of it longer than the
    forward it overlaps: exposed whatever the schedule), ``grad_reduce_ms``,
    ``forward_ms``, ``backward_ms`` (and the ``*_median`` / ``*_p10`` / ``*_p90`` names of
    summary.json, all equal), ``phases_ms`` (max over ranks per phase), ``breakdown`` (the
    critical rank's optimizer step by phase), ``steps`` (one steps.jsonl-style row per rank,
    ``events`` in the records format plus comm-stream events with ``lane``), ``plan``,
    ``world``, ``projected: True``, ``hardware``, ``assumptions``, ``config``, ``sim_seconds``.
    ``events``: "all", "none", or "auto" (all ranks up to 64, else the critical, the fastest
    and rank 0).
    """
    from canzona.plan.from_config import refuse_peer

    refuse_peer(cfg)
    t0 = time.perf_counter()
    hw = load_hardware(hardware)
    sim = simulate(cfg, hw, plan)
    tl, plan_ = sim.tl, sim.plan
    world = sim.world
    metrics = count_programs(plan_, sim.programs_)
    step_ms = [(tl.marks[r]["step_end"] - tl.marks[r]["step_start"]) * 1e3 for r in range(world)]
    iter_ms = [tl.marks[r]["end"] * 1e3 for r in range(world)]  # marks count from each rank's iteration start
    critical = int(np.argmax(step_ms))
    keep = set(range(world))
    if events == "none":
        keep = set()
    elif events == "auto" and world > 64:
        keep = {critical, int(np.argmin(step_ms)), 0}
    rows = []
    for r in range(world):
        d, t = sim.grid.coords(r)
        ph = tl.phases_ms(r)
        rows.append({
            "step": 0, "measured": True, "rank": r, "dp_rank": d, "tp_rank": t,
            "iteration_ms": iter_ms[r], "optimizer_step_ms": step_ms[r],
            "step_start_ms": tl.marks[r]["step_start"] * 1e3,
            **{f"{p}_ms": ph.get(p, 0.0) for p in PHASES},
            "compute_load": float(metrics.compute[d, t]), "loss": None, "param_gather_ms": sim.gather_ms(r),
            "param_sync_peer_ms": sim.peer_ms(r),
            "events": tl.rank_events(r) if r in keep else [],
        })
    phases_max = {p: max(row[f"{p}_ms"] for row in rows) for p in PHASES}
    out: dict[str, Any] = {
        "projected": True,
        "hardware": hw.describe(),
        "assumptions": assumptions(cfg, hw, sim.scale, sim.step_scale, plan_),
        "iteration_ms": max(iter_ms),
        # the slowest rank's step, as the records take it (max over ranks): the lockstep step plus
        # the ranks' drift over the work after their last collective (`Timeline.slowest_lag`)
        "optimizer_step_ms": max(step_ms) + tl.slowest_lag("step_end") * 1e3,
        "param_sync_ms": phases_max["param_sync"],
        # the exposed parameter sync less the waits for peers still in their optimizer step
        "param_sync_transfer_ms": max(row["param_sync_ms"] - row["param_sync_peer_ms"] for row in rows),
        # the gathers' own transfer time, and what of it no forward can hide: Megatron overlaps the
        # gather with the next forward only, so a gather longer than that forward is exposed by at
        # least the difference (max over ranks)
        "param_gather_ms": max(row["param_gather_ms"] - row["param_sync_peer_ms"] for row in rows),
        "param_sync_bound_ms": max(max(0.0, row["param_gather_ms"] - row["param_sync_peer_ms"] - row["forward_ms"])
                                   for row in rows),
        "grad_reduce_ms": phases_max["grad_reduce"],
        "forward_ms": phases_max["forward"],
        "backward_ms": phases_max["backward"],
        "phases_ms": phases_max,
        "phases_ms_mean": {p: float(np.mean([row[f"{p}_ms"] for row in rows])) for p in PHASES},
        "param_sync_peer_ms_mean": float(np.mean([row["param_sync_peer_ms"] for row in rows])),
        "critical_rank": critical,
        "breakdown": {p: rows[critical][f"{p}_ms"] for p in ("gather", "compute", "scatter", "apply")},
        "model_flops_per_rank": {"forward": sim.work.forward_flops, "tokens": sim.work.tokens},
        "steps": rows,
        "world": {"world_size": world, "dp": sim.dp, "tp": sim.tp, "backend": "simulated",
                  "device": hw.device.get("kind"), "device_name": hw.device.get("name"),
                  **({"ep": plan_.experts.layout.ep, "etp": plan_.experts.layout.etp} if plan_.experts else {})},
        "plan": plan_record(plan_, metrics),
        "config": cfg.to_dict(),
    }
    for key in ("iteration_ms", "optimizer_step_ms", "param_sync_ms", "grad_reduce_ms"):
        for q in ("median", "p10", "p90"):
            out[f"{key}_{q}"] = out[key]
    out["sim_seconds"] = time.perf_counter() - t0
    return out


def write_trial(cfg: TrialConfig, hardware: Any, out: str | Path) -> dict[str, Any]:
    """Project one trial and write its records like a measured trial (canzona/records.py):
    config.yaml, steps.jsonl (one row per rank, ``projected: true``), summary.json (the
    `project` dict less ``steps``, plus ``hardware_inputs`` (`Hardware.inputs`), ``peak_memory_mb: None``,
    ``host``, ``versions``).
    The sweep launcher's status.json is not written. Returns the summary."""
    out = Path(out)
    hw = load_hardware(hardware)
    res = project(cfg, hw)
    rows = [{**r, "projected": True} for r in res.pop("steps")]
    summary = {**res, "hardware_inputs": hw.inputs(), "peak_memory_mb": None, "host": "simulated",
               "versions": {"simulator": "canzona.sim", "hardware": res["hardware"]["name"]}}
    write_records(out, {**cfg.to_dict(), "out": str(out)}, rows, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m canzona.sim.simulate hardware=h100 model=qwen3-32b parallel.dp=32 parallel.tp=8 [--json]``."""
    from canzona.cli import run_command

    return run_command("canzona.sim.simulate", _simulate, argv)


def _simulate(argv: list[str]) -> int:
    from canzona.config import SHORTHANDS, load_config, trial_key_docs
    from canzona.overrides import refuse_renamed, split_argv

    args = split_argv(argv, flags=("--json",), shorthands=SHORTHANDS,
                      keys=["hardware", *(d.key for d in trial_key_docs())])
    refuse_renamed(RENAMED, args.overrides)
    hardware = next((v for k, v in args.overrides if k == "hardware"), DEFAULT_HARDWARE)
    cfg = load_config([f"{k}={v}" for k, v in args.overrides if k != "hardware"])
    res = project(cfg, hardware, events="none")
    if "--json" in args.flags:
        res.pop("steps")
        print(json.dumps(res, indent=2, default=str))
        return 0
    ep = f" ep={cfg.parallel.ep}" if cfg.parallel.ep > 1 else ""
    print(f"{cfg.method.label} {cfg.optimizer.name} {cfg.model.name} dp={cfg.parallel.dp} tp={cfg.parallel.tp}{ep} on {hardware} "
          f"(projected): iteration {res['iteration_ms']:.1f} ms, optimizer step {res['optimizer_step_ms']:.2f} ms, "
          f"param sync {res['param_sync_ms']:.2f} ms")
    print("  phases (max over ranks, ms): " + ", ".join(f"{k} {v:.2f}" for k, v in res["phases_ms"].items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PAPER_CLAIMS", "ModelWork", "forward_flops", "model_work", "oversubscription", "project", "simulate",
           "write_trial"]
