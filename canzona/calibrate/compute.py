"""Timing the maths on one device: matmul rates, copies, AdamW, apply, and each matrix
optimizer's update per shape (steady state, one matrix at a time and in calls of several, and refreshes)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from canzona.calibrate.clock import Clock, solo
from canzona.calibrate.settings import Options
from canzona.calibrate.shapes import calibration_shapes, local_sweep_shapes
from canzona.hardware import refresh_flops, steady_flops

Sync = Callable[[bool], bool]


def time_basics(quick: bool, clock: Clock, sync: Sync = solo) -> dict[str, Any]:
    """Matmul rates, copies, AdamW and apply per element / per call. A GPU gets larger operands:
    at CPU sizes its kernels would measure launch overhead, not rates."""
    import torch

    from canzona.optim.adamw import fused_adamw_step
    from canzona.optim.rule import apply_update

    dev = clock.device
    gpu = clock.cuda
    out: dict[str, Any] = {}
    n = (2048 if quick else 4096) if gpu else (384 if quick else 768)
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    clock.time(lambda: a @ b)
    out["matmul_float32"] = 2 * n**3 / clock.median(lambda: a @ b, 5, 1.0, sync)
    ab, bb = a.bfloat16(), b.bfloat16()
    clock.time(lambda: ab @ bb)
    out["matmul_bfloat16"] = 2 * n**3 / clock.median(lambda: ab @ bb, 3, 1.0, sync)
    # a GPU's elementwise kernels reach their bandwidth only on large tensors: 2^24 elements
    # (64 MB) priced the fused AdamW at 16 ps/element on an H200, the trials ran at 9 (2026-12-04)
    # A step's passes over the gradient, the moments and the parameters find them out of cache:
    # backward and the reductions ran in between. Timed warm on a CPU, they came out about half
    # what the trials measured: they are timed cold (`cold_caches`), on 4 MB tensors (out of L2);
    # the warm copies (collective packing, a gradient landing) on tensors of their trial sizes
    elems = (1 << 26) if gpu else (1 << 20)
    warm = (1 << 26) if gpu else ((1 << 18) if quick else (1 << 20))
    cold = cold_caches(dev)
    x, y = torch.randn(elems, device=dev), torch.randn(elems, device=dev)
    # into a buffer allocated once, as the executor's packing does: a fresh output's page faults
    # (how many depends on the allocator's state, 6x in gVisor) are no copy's cost
    xw, yw, both = x[:warm], y[:warm], torch.empty(2 * warm, device=dev)
    t = clock.median(lambda: torch.cat([xw, yw], out=both), 5, 0.5, sync)
    tiny = [torch.randn(64, device=dev) for _ in range(32)]
    pair = torch.empty(128, device=dev)
    t_tiny = clock.median(lambda: [torch.cat([v, v], out=pair) for v in tiny], 5, 0.5, sync)
    out["copy_seconds_per_byte"] = t / (2 * warm * 4)
    out["copy_call_overhead_s"] = max(0.0, t_tiny / 32 - 2 * 64 * 4 * out["copy_seconds_per_byte"])
    # gradient clipping's two passes over the fp32 gradient, as the executor runs them
    # (`canzona.optim.clip`): the multi-tensor norm (a read) and the in-place scaling
    out.update(_pass_rates("norm", lambda ts: torch._foreach_norm(ts), x, tiny, clock, sync, cold))
    out.update(_pass_rates("scale", lambda ts: torch._foreach_mul_(ts, 0.999), x, tiny, clock, sync, cold))
    # AdamW as the executor's elementwise step runs it (`canzona.optim.adamw.fused_adamw_step`:
    # one fused kernel over a call's tensors). The second moment starts non-negative and stays so:
    # nothing but the step is timed (an abs_() inside the timed call had added a fifth of a pass)
    p, g, m, v = (torch.randn(elems, device=dev) for _ in range(4))
    v.abs_()
    adam = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    tiny4 = [[torch.randn(64, device=dev).abs_() for _ in range(32)] for _ in range(4)]

    def adam_big() -> None:
        fused_adamw_step([p], [g], [m], [v], 2, **adam)

    def adam_tiny() -> None:  # one call over 32 tensors: the per-tensor cost inside a call
        fused_adamw_step(*tiny4, 2, **adam)

    clock.time(adam_big)
    out["adamw_seconds_per_element"] = clock.median(adam_big, 5, 1.0, sync, cold) / elems
    out["adamw_tensor_overhead_s"] = max(0.0, clock.median(adam_tiny, 5, 0.5, sync) / 32
                                         - 64 * out["adamw_seconds_per_element"])
    # per training dtype: a gradient landing in the executor's fp32 buffer
    # (`canzona.executor.buffer`: grad_view.add_(grad); a bf16 gradient's mixed-dtype add runs
    # about twice the fp32 one on an AMX Xeon), timed warm (the gradient was just computed), and
    # the fp32 main parameters cast into the model's (`CopyToModel`: param.copy_(main)), cold
    grad_add, cast = {}, {}
    landing = m[:warm]
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        low = g.to(dtype)
        clock.time(lambda low=low: landing.add_(low[:warm]))
        grad_add[name] = clock.median(lambda low=low: landing.add_(low[:warm]), 5, 0.5, sync) / warm
        cast[name] = clock.median(lambda low=low: low.copy_(p), 5, 0.5, sync, cold) / elems
        del low
    out["grad_add_seconds_per_element"] = grad_add
    out["cast_seconds_per_element"] = cast
    if not gpu:
        out["grad_add_large"] = _large_landing(dev, quick, clock, sync)
    u = torch.randn(elems, device=dev)
    out["apply_seconds_per_element"] = clock.median(lambda: apply_update(p, u, 1e-3, 0.01), 5, 0.5, sync, cold) / elems
    ut = torch.randn(64, device=dev)
    t_ap = clock.median(lambda: [apply_update(q, ut, 1e-3, 0.01) for q in tiny4[0]], 5, 0.5, sync)
    out["apply_call_overhead_s"] = max(0.0, t_ap / 32 - 64 * out["apply_seconds_per_element"])
    return out


def _large_landing(dev: Any, quick: bool, clock: Clock, sync: Sync) -> dict[str, Any]:
    """The gradient landing (``grad_view.add_(grad)``) of a tensor the size of a trial's embedding
    gradient (2^24 elements, 64 MB in fp32; 2^22 quick), each time just written as backward
    writes it: out of cache, where the warm rate above is timed at 4 MB. On a 2-core Xeon VM
    (2 processes at once) 0.53-0.58 ns per fp32 element at 2^20 and 0.80-0.82 at the 0.6B-at-width/8
    embedding's 19.4M: the trials' backward ran 10-28 % over a prediction priced warm."""
    import torch

    big = (1 << 22) if quick else (1 << 24)
    buf = torch.zeros(big, device=dev)
    rates = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        grad = torch.empty(big, dtype=dtype, device=dev)
        buf.add_(grad.fill_(0.5))
        rates[name] = clock.median(lambda grad=grad: buf.add_(grad), 5, 1.0, sync, lambda grad=grad: grad.fill_(0.5)) / big
        del grad
    return {"elements": big, "seconds_per_element": rates}


def cold_caches(device: Any) -> Callable[[], None] | None:
    """What runs before each timed pass so that it finds its operands out of cache, as a trial's
    optimizer step does after backward: on a CPU, one write through a buffer the size of the
    last-level cache (32-256 MiB; sysfs's figure, 256 MiB where it has none). Measured on this
    project's 2-core Xeon VM, 2^20 fp32 elements: the norm 0.18 ns/element warm, 0.46-0.51
    after 128-512 MB written elsewhere; the trials' 0.36-0.5. None on a GPU: its operands
    (2^26 elements) are already several times its L2."""
    import torch

    if torch.device(device).type != "cpu":
        return None
    junk = torch.zeros(_last_level_cache_bytes() // 4)
    return lambda: junk.add_(1.0)


def _last_level_cache_bytes(floor: int = 32 << 20, cap: int = 256 << 20) -> int:
    from pathlib import Path

    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        try:
            sizes.append(int(text.rstrip("KMG")) * units.get(text[-1:], 1))
        except ValueError:
            continue
    return min(cap, max(floor, max(sizes, default=cap)))


def _pass_rates(name: str, run: Callable[[list], Any], big: Any, tiny: list, clock: Clock,
                sync: Sync, cold: Callable[[], None] | None = None) -> dict[str, float]:
    """``<name>_seconds_per_byte`` and ``<name>_call_overhead_s`` of one pass over fp32 tensors
    (``run`` on a list of tensors): one large tensor (after ``cold``), then 32 tiny ones."""
    clock.time(lambda: run([big]))
    per_byte = clock.median(lambda: run([big]), 5, 0.5, sync, cold) / (big.numel() * 4)
    t_tiny = clock.median(lambda: [run([v]) for v in tiny], 5, 0.5, sync)
    return {f"{name}_seconds_per_byte": per_byte,
            f"{name}_call_overhead_s": max(0.0, t_tiny / len(tiny) - tiny[0].numel() * 4 * per_byte)}


def time_update_tables(optimizers: tuple[str, ...] | list[str], shapes: list[tuple[int, int]], budget_s: float,
                       quick: bool, freq: int, rates: dict[str, float], clock: Clock, required: int = 0,
                       sync: Sync = solo, ns_dtype: str = "float32") -> dict[str, Any]:
    """A hardware file's optimizer tables (``batched``, ``updates``, ``update_overhead_s``,
    ``eigh_flops_per_s``): per optimizer and shape, steady slope / overhead (batch 1 and 4) and
    refresh seconds; the first ``required`` shapes are timed even past the budget.
    ``sync(go) -> go`` agrees on every go / skip decision across the calibrating processes (and
    lines them up), so they time the same shapes at the same moments, as a trial's ranks run
    their steps. Muon is timed with its Newton-Schulz in ``ns_dtype`` (the file says which: the
    simulator rescales to another dtype by the matmul rates); ``rates`` (matmul flop/s per dtype,
    ``float32`` at least) prices a shape against the budget in its optimizer's matmul dtype, and
    the refreshes' eigendecompositions at the fp32 rate.
    (The calibration cache's per-kernel table is `canzona.calibrate.kernels.time_kernel_updates`'s.)"""
    import torch

    from canzona.optim import registry
    from canzona.optim.registry import make_rule
    from canzona.optim.section import OptimizerSection

    dev = clock.device
    per_shape_cap = 0.05 if quick else 0.5  # skip shapes whose one update would take longer
    small = 0.02  # below this, also time a batch of 4 to split per-call overhead from slope
    refresh_cap = 0.05 if quick else 0.6
    batched: dict[str, dict[str, dict[str, float]]] = {o: {} for o in optimizers}
    flops_rate = rates["float32"]
    sections = {o: OptimizerSection(name=o, precondition_frequency=freq, ns_dtype=ns_dtype) for o in optimizers}
    rules = {o: make_rule(sec, "matrix") for o, sec in sections.items()}
    rate_of = {o: rates.get(registry.get(o).matmul_dtype(sec), flops_rate) for o, sec in sections.items()}
    # Muon's opt-in stacked Newton–Schulz (optimizer.batch_equal_shapes): timed on a batch of 4
    stacked = (make_rule(OptimizerSection(name="muon", batch_equal_shapes=True, ns_dtype=ns_dtype), "matrix")
               if "muon" in rules else None)
    overhead: dict[str, float] = {}
    eigh_samples: list[tuple[float, float]] = []  # (refresh flops, seconds)
    deadline = time.perf_counter() + budget_s

    def call(rule, grads, states, step, reps: int = 3) -> float:
        return clock.median(lambda: rule.directions(grads, states, step), reps, 0.3 * reps)

    def fresh(rule, m: int, n: int, count: int) -> tuple[list, list]:
        return ([torch.randn(m, n, device=dev) for _ in range(count)],
                [rule.init_state((m, n), dev, torch.float32) for _ in range(count)])

    def time_shape(o: str, m: int, n: int, reps: int) -> dict[str, float]:
        rule = rules[o]
        g1, s1 = fresh(rule, m, n, 1)
        rule.directions(g1, s1, 2)  # warm up
        t1 = call(rule, g1, s1, 2, reps)
        if t1 < small:
            g4, s4 = fresh(rule, m, n, 4)
            rule.directions(g4, s4, 2)
            t4 = call(rule, g4, s4, 2, reps)
            slope = max((t4 - t1) / 3, 0.25 * t1)
            ovh = min(max(t1 - slope, 0.0), t1)
        else:
            ovh = min(overhead[o], 0.5 * t1)
            slope = t1 - ovh
        entry = {"slope_s": slope, "overhead_s": ovh, "single_s": t1}
        if o == "muon" and stacked is not None:
            g4, s4 = fresh(stacked, m, n, 4)
            stacked.directions(g4, s4, 2)
            entry["stacked_slope_s"] = max((call(stacked, g4, s4, 2, reps) - ovh) / 4, 0.0)
        return entry

    for o, rule in rules.items():  # per-call overhead from a tiny matrix
        g, st = fresh(rule, 8, 16, 1)
        rule.directions(g, st, 2)
        overhead[o] = call(rule, g, st, 2)
    skipped = 0
    for k, (m, n) in enumerate(shapes):
        for o, rule in rules.items():
            est = steady_flops(o, m, n) / rate_of[o]
            go = k < required or (est <= per_shape_cap and time.perf_counter() <= deadline)
            if not sync(go):
                skipped += 1
                continue
            key = f"{m}x{n}"
            entry = time_shape(o, m, n, 5 if k < required else 3)
            if o != "muon":
                rf = refresh_flops(o, m, n)
                if sync(rf / (0.1 * flops_rate) <= refresh_cap and time.perf_counter() < deadline):
                    _, s_r = fresh(rule, m, n, 1)
                    if o == "soap":  # a valid basis for the power-iteration refresh
                        for key_, size in (("Q_L", m), ("Q_R", n), ("L", m), ("R", n)):
                            s_r[0][key_].copy_(torch.eye(size, device=dev))
                    step = 1 if o == "shampoo" else 1 + freq
                    t_r = clock.median(partial(rule.directions, [torch.randn(m, n, device=dev)], s_r, step), 2, 0.5)
                    entry["refresh_s"] = max(0.0, t_r - entry["single_s"])
                    eigh_samples.append((rf, entry["refresh_s"]))
            batched[o][key] = entry
    # Outlier guard: a shape several times slower per flop than the median was probably timed
    # while something else ran; time it again (on every process, if any flags it), keep the faster.
    retimed = 0
    for o in optimizers:
        per_flop = {key: e["single_s"] / steady_flops(o, *(int(x) for x in key.split("x"))) for key, e in batched[o].items()}
        if not per_flop:
            continue
        typical = statistics.median(per_flop.values())
        for key in list(batched[o]):
            if not sync(per_flop[key] <= 3.0 * typical):
                m, n = (int(x) for x in key.split("x"))
                again = time_shape(o, m, n, 5)
                if again["single_s"] < batched[o][key]["single_s"]:
                    batched[o][key].update(again)
                retimed += 1
    rate = (sum(f for f, _ in eigh_samples) / max(1e-12, sum(s for _, s in eigh_samples))) if eigh_samples else 0.1 * flops_rate
    updates: dict[str, dict[str, float]] = {o: {} for o in optimizers}
    for o in optimizers:
        for key, e in batched[o].items():
            m, n = (int(x) for x in key.split("x"))
            if o != "muon" and "refresh_s" not in e:
                e["refresh_s"] = refresh_flops(o, m, n) / rate
                e["refresh_estimated"] = True
            updates[o][key] = e["single_s"] + e.get("refresh_s", 0.0) / freq
    return {"batched": batched, "updates": updates, "update_overhead_s": overhead, "eigh_flops_per_s": rate,
            "skipped": skipped, "retimed": retimed}


def measure_compute(opts: Options, device: Any, sync: Sync = solo) -> dict[str, Any]:
    """Basics and optimizer updates on ``device`` with ``opts.threads`` threads in this process."""
    import torch

    torch.set_num_threads(opts.threads)
    clock = Clock(device)
    basics = time_basics(opts.quick, clock, sync)
    rates = {"float32": basics["matmul_float32"], "bfloat16": basics["matmul_bfloat16"]}
    upd = time_update_tables(opts.optimizers, calibration_shapes(opts.width_divs), opts.budget_s, opts.quick,
                             opts.precondition_frequency, rates, clock, len(local_sweep_shapes()), sync,
                             ns_dtype=opts.ns_dtype_for(clock.device.type))
    return {"basics": basics, "updates": upd}
