"""One hardware file from several calibrations of the same machine: number by number, the median.

A shared VM's rates move by tens of percent from one minute to the next, and one calibration is
one moment: on this project's 2-core VM six calibrations of the README's sweep, each right after
its trials, read AdamW at 0.67-1.05 ns per element, a 2-process all-reduce's intercept at
0.64-1.35 ms and the 4-ranks-on-2-cores scheduling wait at 0.43-1.66 ms; priced with the odd one
out, the same records missed by 30-38 % where the others' missed by 3-15 % (docs/results.md).
The median of three keeps a single odd reading out.

Each number of the result is one of the measured values (the lower median), never an average.
A fitted block -- a model pass's ``fixed_s`` / ``layer_s`` / ``flops_per_s``, a link's latency
and bandwidth -- is kept whole, from the calibration whose block prices a reference case at the
median (its coefficients trade off against each other between fits: mixing them would price
what no calibration measured). A link holds two fits and single readings: its latency and
bandwidth (with the per-step latency derived from them), its per-call CPU intercept and slope
(`LINK_FITS`), each picked whole by its own reference case, and readings such as the
one-element all-reduce's time, each its own median. Taking those readings along with the
latency's pick had priced a 2026-12-07 run's every gradient-norm all-reduce at one calibration's
1.6 ms where the other two read 0.56 and 0.64. Strings, flags and lists of another length are
the first calibration's.
"""

from __future__ import annotations

from typing import Any

from canzona.calibrate.model_pass import CPU_POINTS

PASS_KEYS = frozenset({"fixed_s", "layer_s", "flops_per_s"})
LINK_KEYS = frozenset({"latency_s", "bandwidth_Bps"})
# a link block's fits: (the keys picked together, the reference cost that picks them)
LINK_FITS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("latency_s", "bandwidth_Bps", "step_latency_s"), lambda b: b["latency_s"] + REFERENCE_BYTES / b["bandwidth_Bps"]),
    (("call_cpu_s", "call_cpu_s_per_byte"), lambda b: b["call_cpu_s"] + REFERENCE_BYTES * b["call_cpu_s_per_byte"]),
)
REFERENCE_LAYERS, REFERENCE_FLOPS, REFERENCE_BYTES = 4, 2e8, 1e6  # about the local sweep's model pass and bucket


def _lower_median(values: list[Any]) -> Any:
    return sorted(values)[(len(values) - 1) // 2]


def _block_cost(block: dict[str, Any]) -> float | None:
    """The reference case a model pass's fitted block prices (seconds), or None if it is not one
    (a link's fits are `LINK_FITS`, picked by `_link_median`)."""
    if PASS_KEYS <= block.keys():
        return block["fixed_s"] + REFERENCE_LAYERS * block["layer_s"] + REFERENCE_FLOPS / block["flops_per_s"]
    return None


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def median_of(items: list[Any]) -> Any:
    """The median hardware description of ``items`` (same structure), as the module says."""
    first = items[0]
    if isinstance(first, dict):
        if all(isinstance(x, dict) for x in items):
            if all(LINK_KEYS <= x.keys() for x in items):
                return _link_median(items)
            costs = [_block_cost(x) for x in items]
            if all(c is not None for c in costs):
                pick = _lower_median(list(zip(costs, range(len(items)))))[1]
                return items[pick]
            return {k: median_of([x[k] for x in items]) if all(k in x for x in items) else v
                    for k, v in first.items()}
        return first
    if isinstance(first, list):
        if all(isinstance(x, list) and len(x) == len(first) for x in items):
            return [median_of([x[i] for x in items]) for i in range(len(first))]
        return first
    if _is_number(first) and all(_is_number(x) for x in items):
        return _lower_median(list(items))
    return first


def _link_median(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A link block: each of `LINK_FITS` whole from the calibration whose fit prices its
    reference case at the median, every other number its own median."""
    out = {k: median_of([x[k] for x in items]) if all(k in x for x in items) else v for k, v in items[0].items()}
    for keys, cost in LINK_FITS:
        if all(all(k in x for k in keys) for x in items):
            pick = _lower_median([(cost(x), i) for i, x in enumerate(items)])[1]
            out.update({k: items[pick][k] for k in keys})
    return out


SWEEP_POINT = CPU_POINTS[2]  # the local sweep's 0.6B size, as `model_pass.backward_work` takes it

SPREAD = {  # what `spread` reports: a label and the path to the number
    "adamw_ns_per_element": ("adamw_seconds_per_element",),
    "all_reduce_latency_us": ("collectives", "intra", "all_reduce", "latency_s"),
    "sched_wait_ms": ("compute", "sched_wait_s"),
    "matmul_gflops": ("compute", "matmul_flops_per_s", "float32"),
    "forward_layer_ms": ("model", "forward", "layer_s"),
    "overlap": ("compute", "overlap"),
    "grad_reduce_overlap": ("compute", "grad_reduce_overlap"),
    # the README sweep's 0.6B model (width/8, 4 layers, 1 x 32 tokens) as timed, not fitted:
    # what its trials' passes are priced from (the point `backward_work` overlaps, too)
    "sweep_model_forward_ms": ("model", "points", SWEEP_POINT, "forward_s"),
    "sweep_model_backward_ms": ("model", "points", SWEEP_POINT, "backward_s"),
}
_SCALE = {"adamw_ns_per_element": 1e9, "all_reduce_latency_us": 1e6, "sched_wait_ms": 1e3, "matmul_gflops": 1e-9,
          "forward_layer_ms": 1e3, "overlap": 1.0, "grad_reduce_overlap": 1.0, "sweep_model_forward_ms": 1e3, "sweep_model_backward_ms": 1e3}
_POINT_KEYS = ("model", "width_div", "layers", "micro_batch", "seq_len")


def _step(x: Any, key: Any) -> Any:
    """One step of a `SPREAD` path: a dict's key, or (a tuple) the model point of that size."""
    if not isinstance(key, tuple):
        return x.get(key) if isinstance(x, dict) else None
    points = x if isinstance(x, list) else []
    return next((p for p in points if isinstance(p, dict) and tuple(p.get(k) for k in _POINT_KEYS) == key), None)


def spread(items: list[dict[str, Any]]) -> dict[str, list[float]]:
    """[min, max] over the calibrations of a few headline numbers (how much this machine moved)."""
    out = {}
    for label, path in SPREAD.items():
        vals = []
        for x in items:
            for key in path:
                x = _step(x, key)
            if _is_number(x):
                vals.append(float(x) * _SCALE[label])
        if vals:
            out[label] = [round(min(vals), 4), round(max(vals), 4)]
    return out
