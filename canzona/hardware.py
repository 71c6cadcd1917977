"""Hardware descriptions: what compute and communication cost on one kind of machine.

A hardware file is a YAML file (``hardware/NAME.yaml``), written by ``python -m canzona.calibrate``
(``source: calibrated``) or derived from public specs (``source: spec-derived``, with the inputs
listed under ``inputs``). Every key below is optional except ``name``; missing numbers fall back
to flop / byte rates, so a spec-derived file needs no per-shape table::

    name: h100
    source: spec-derived | calibrated
    device: {name, kind: cpu|cuda, host, date, torch, cores, threads}
    topology: {ranks_per_node: 8}          # null: every rank on one node
    compute:
      matmul_flops_per_s: {float32: F, bfloat16: F}
      eigh_flops_per_s: F
      memory_bytes_per_s: B                # elementwise passes (fallback for the tables below)
      call_overhead_s: s                   # per batched optimizer call, per shape (fallback)
      overlap: 1.0                         # fraction of async comm hidden behind host compute
      grad_reduce_overlap: 1.0             # optional: that of the bucketed gradient reductions beside the backward (default: overlap)
      sched_wait_s: s                      # CPU: a collective's wait for its peers to be scheduled when
                                           # ranks x threads > cores (canzona.calibrate.contended); 0: none
      peer_wait: [[work_s, wait_s], ...]   # CPU: a collective's wait for its peers after each member's
                                           # work since its previous one (canzona.calibrate.peer_wait); []: none
      sched_wait_curve: [[work_s, wait_s], ...]  # CPU: sched_wait_s's measurement after each amount of
                                           # work apart (canzona.calibrate.contended); []: sched_wait_s alone
      idle_threads_cpu_per_s: x            # CPU: CPU seconds a second a rank's other threads use idle
                                           # (gloo's transport loops; canzona.calibrate.comm.idle_threads_cpu)
    updates: {muon: {"MxN": s}, ...}       # one update of one matrix, refreshes amortised
                                           # (canzona.cost.load_measured reads this table)
    batched: {muon: {"MxN": {slope_s, overhead_s, refresh_s, stacked_slope_s}}}  # steady-state batched calls
    update_overhead_s: {muon: s}           # per call per shape group when a shape is unmeasured
    ns_dtype: float32                      # the Newton-Schulz dtype the tables were timed in
    adamw_seconds_per_element: s           # direction + apply, flat tensor
    adamw_tensor_overhead_s: s
    apply_seconds_per_element: s           # apply_update (decay + step) of a matrix shard
    apply_call_overhead_s: s
    copy_seconds_per_byte: s               # packing / unpacking collective buffers
    copy_call_overhead_s: s
    grad_add_seconds_per_element: {float32: s, bfloat16: s}  # a gradient landing in the fp32 buffer
                                           # (calibrated; else 1.5 copies of fp32 bytes)
    grad_add_large: {elements: N, seconds_per_element: {float32: s, bfloat16: s}}  # CPU: the same landing
                                           # out of cache, timed at N elements (the embedding's gradient);
                                           # sizes between 2^20 and N interpolated in log2(size)
    cast_seconds_per_element: {float32: s, bfloat16: s}  # fp32 main params cast into the model's
                                           # (calibrated; else a copy of fp32 bytes)
    norm_seconds_per_byte: s               # gradient clipping's norm pass (calibrated; else a copy)
    norm_call_overhead_s: s
    scale_seconds_per_byte: s              # gradient clipping's in-place scaling (likewise)
    scale_call_overhead_s: s
    model:                                 # forward / backward of the Qwen3 model per rank
      dtype: float32 | bfloat16
      forward: {fixed_s, layer_s, flops_per_s}
      backward: {fixed_s, layer_s, flops_per_s}
    collectives:
      intra: {all_reduce: {latency_s, step_latency_s, bandwidth_Bps, one_element_s}, reduce_scatter: ...,
              all_gather: ..., all_to_all: ..., broadcast: ..., reduce: ...}
              # one_element_s (optional, calibrated CPUs): a one-element all-reduce over 2 ranks
              # call_cpu_s, call_cpu_s_per_byte, one_element_call_cpu_s (optional, calibrated CPUs):
              # the CPU a call costs its process after work apart, per call and per byte of volume
              # (canzona.calibrate.comm.time_call_cpu); charged only to oversubscribed ranks
      inter: {...}                         # groups spanning more than one node

Collective model: ``latency_s + (steps(P) - 1)·step_latency_s + volume / bandwidth_Bps`` where
``steps`` is the ring's step count (P-1; all-reduce 2(P-1), or NCCL's tree where shorter, not on
a CPU's gloo; all-to-all 1: all pairs at once); an all-reduce of at most 4 bytes on a link with
``one_element_s`` costs ``one_element_s·steps(P)/steps(2)``
and ``volume`` the bytes each rank moves over its bottleneck link (ring all-reduce
2(P-1)/P·N, reduce-scatter / all-gather (P-1)/P·N of the full N-byte buffer, broadcast /
reduce N, all-to-all: the most any rank sends or receives off-rank). A group spanning more than
one node uses the ``inter`` level throughout (its ring crosses the network; one NIC per GPU).

Evidence (spec-derived files). ``inputs.provenance`` labels every number the file rests on with
where it comes from: ``datasheet`` (a vendor datasheet or product page, quoted under
``inputs.sources``), ``published`` (a published measurement: the entry is a mapping whose
``source`` names it -- paper, benchmark, table or figure) or ``assumption`` (chosen here, nothing
measured it). An entry is the bare label or ``{label, source, note}``. Keys are dotted paths
under ``inputs`` (``peak_bf16_tflops``, ``efficiency.model_mfu``) or, for a number the generator
writes elsewhere without deriving it from an input, from the file's top (``topology.ranks_per_node``,
``model.forward.fixed_s``); every other number is computed from the labelled ones by
`spec_hardware`. ``inputs.fitted_on`` lists the ids of the published points a file's numbers
were fitted on -- a fitted number is labelled ``published`` with its source, and the points are
named here -- and is empty for a file fitted on nothing (every file today). The labels are not part of
`Hardware.fingerprint`: they say where a number comes from, not what it is. A calibrated file
is measured on the machine and carries no labels.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from canzona import CHECKOUT
from canzona.errors import ConfigError
from canzona.optim import registry
from canzona.optim.definitions import muon_gram_share
from canzona.optim.section import OptimizerSection

HARDWARE_DIR = CHECKOUT / "hardware"
LOCAL_FILE = HARDWARE_DIR / "local.yaml"  # this machine's calibration, if one was made (git-ignored)
# The hardware file used unless one is named: by a projection (``python -m canzona.sim.simulate``,
# a ``cluster=simulate`` sweep) and by CUDA plans made where no GPU is visible (``planner.cost_hardware``).
DEFAULT_HARDWARE = "h100"
BEFORE_RENAME_DIR = CHECKOUT / "profiles"  # where hardware files lived before they were called that
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
LEVELS = ("intra", "inter")
# Elementwise passes over the matrix (4-byte reads + writes) besides the matmuls, per update
# (each optimizer module states its own: Muon's momentum and Nesterov lerps, normalisation and
# scale; Shampoo / SOAP's moments, grafting / rotated Adam, bias corrections).
ELEMENTWISE_PASSES = {d.name: d.elementwise_passes for d in registry.REGISTERED if d.matrix}
# AdamW direction + apply: read grad, m, v, param; write m, v, param and temporaries.
ADAMW_BYTES_PER_ELEMENT = 40.0
APPLY_BYTES_PER_ELEMENT = 16.0  # param *= (1 - lr wd); param += -lr U: two read+write passes
# The size the warm landing rate is timed at (`canzona.calibrate.compute.time_basics`: 4 MB of fp32)
GRAD_ADD_WARM_ELEMENTS = 1 << 20
EVIDENCE_LABELS = ("datasheet", "published", "assumption")  # inputs.provenance (module docstring)
EVIDENCE_KEYS = ("provenance", "fitted_on")  # under inputs: where the numbers come from, not numbers


def ring_steps(kind: str, p: int, ring: bool = False) -> int:
    """Latency steps of a collective over p ranks: the ring's (all-reduce 2(P-1), all-to-all 1,
    the rest P-1), except that an all-reduce takes NCCL's tree when that has fewer steps
    (2·⌈log2 P⌉: small all-reduces such as the gradient norm's do not pay 2(P-1) hops at 256
    ranks) unless ``ring`` (gloo on a CPU runs its ring at every size). Only the latency term
    changes; volumes stay the ring's."""
    if p <= 1:
        return 0
    if kind == "all_reduce":
        return 2 * (p - 1) if ring else min(2 * (p - 1), 2 * (p - 1).bit_length())
    if kind == "all_to_all":
        return 1
    return p - 1


ONE_ELEMENT_BYTES = 4  # `Link.one_element_s` prices all-reduces of at most this many bytes


def volume(kind: str, p: int, nbytes: float) -> float:
    """Bytes each rank moves over its bottleneck link (see the module docstring)."""
    if p <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (p - 1) / p * nbytes
    if kind in ("reduce_scatter", "all_gather"):
        return (p - 1) / p * nbytes
    return float(nbytes)  # broadcast, reduce, all_to_all (caller passes the busiest rank's bytes)


@dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float
    step_latency_s: float = 0.0
    # an all-reduce of one fp32 element (the step barrier's, the gradient norm's) over two ranks,
    # where the link was timed so (gloo: far less than a larger message's latency, by a third to
    # a fifth on the project's VMs); 0: not measured. Its steps scale with the ring's as the latency's.
    one_element_s: float = 0.0
    # CPU one call costs its process, all threads (the caller's dispatch and wake-up, gloo's
    # workers and transport loops: `canzona.calibrate.comm.time_call_cpu`) over two ranks, and
    # per byte of volume; 0: not measured (GPU files: NCCL's kernels hold no core)
    call_cpu_s: float = 0.0
    call_cpu_s_per_byte: float = 0.0
    one_element_call_cpu_s: float = 0.0  # the same for the one-element all-reduce, timed apart

    def parts(self, kind: str, p: int, nbytes: float, ring: bool = False) -> tuple[float, float]:
        """(latency seconds, transfer seconds); ``ring``: `ring_steps`'."""
        if p <= 1:
            return 0.0, 0.0
        steps = ring_steps(kind, p, ring)
        if kind == "all_reduce" and self.one_element_s and nbytes <= ONE_ELEMENT_BYTES:
            return self.one_element_s * steps / ring_steps(kind, 2, ring), 0.0
        return self.latency_s + max(0, steps - 1) * self.step_latency_s, volume(kind, p, nbytes) / self.bandwidth_Bps

    def seconds(self, kind: str, p: int, nbytes: float) -> float:
        return sum(self.parts(kind, p, nbytes))

    def call_cpu(self, kind: str, p: int, nbytes: float, ring: bool = False) -> float:
        """CPU seconds one call costs each member's process: the per-call part by the
        ring's steps (as the latency), the per-byte part by the volume; the one-element
        all-reduce once per call, at any size of group (AdamW's step at 4 ranks on 2 cores, its
        only collective that one: 0.7-0.9 ms of the other threads' CPU a rank in all, where its
        three ring steps at the pair's 0.44 ms were priced 1.3 ms plus the idle threads' 0.3)."""
        if p <= 1:
            return 0.0
        if kind == "all_reduce" and self.one_element_s and nbytes <= ONE_ELEMENT_BYTES:
            return self.one_element_call_cpu_s
        steps = ring_steps(kind, p, ring) / ring_steps(kind, 2, ring)
        return self.call_cpu_s * steps + volume(kind, p, nbytes) * self.call_cpu_s_per_byte


@dataclass(frozen=True)
class PassTiming:
    """``fixed_s + layers·layer_s + flops / flops_per_s`` for one forward or backward pass."""

    fixed_s: float
    layer_s: float
    flops_per_s: float

    def seconds(self, flops: float, layers: int) -> float:
        return self.fixed_s + layers * self.layer_s + flops / self.flops_per_s


def _shape_key(m: int, n: int) -> str:
    return f"{m}x{n}"


def _parse(key: str) -> tuple[int, int]:
    m, n = key.split("x")
    return int(m), int(n)


@functools.lru_cache(maxsize=64)
def _settings(ns_steps: int = 5, ns_dtype: str = "float32") -> Any:
    """An optimizer section with these values and every other option at its default."""
    return OptimizerSection(ns_steps=ns_steps, ns_dtype=ns_dtype)


def steady_flops(optimizer: str, m: int, n: int, ns_steps: int = 5, settings: Any = None) -> float:
    """Flops of one update of an m×n matrix without a preconditioner refresh (the median step).
    ``settings`` (an optimizer section) replaces the defaults, ``ns_steps`` included."""
    return registry.get(optimizer).steady_flops((m, n), settings or _settings(ns_steps))


def refresh_flops(optimizer: str, m: int, n: int, settings: Any = None) -> float:
    """Extra flops of a refresh step (eigendecompositions / power-QR), 0 for Muon and AdamW."""
    return registry.get(optimizer).refresh_flops((m, n), settings or _settings())


class Hardware:
    """A loaded hardware description. Every method returns seconds."""

    def __init__(self, data: dict[str, Any], path: str | None = None):
        if not isinstance(data, dict) or not data.get("name"):
            raise ConfigError(f"hardware {path or ''} must be a mapping with a name")
        self.raw, self.path = data, path
        self.name = str(data["name"])
        check_evidence(data)
        self.source = str(data.get("source", "unknown"))
        self.device = dict(data.get("device") or {})
        topo = data.get("topology") or {}
        self.ranks_per_node: int | None = topo.get("ranks_per_node")
        comp = data.get("compute") or {}
        self.matmul_flops = {k: float(v) for k, v in (comp.get("matmul_flops_per_s") or {}).items()}
        if "float32" not in self.matmul_flops:
            raise ConfigError(f"hardware {self.name}: compute.matmul_flops_per_s.float32 is required")
        self.eigh_flops = float(comp.get("eigh_flops_per_s", self.matmul_flops["float32"] * 0.05))
        self.memory_Bps = float(comp.get("memory_bytes_per_s", 1e10))
        self.call_overhead_s = float(comp.get("call_overhead_s", 0.0))
        self.overlap = float(comp.get("overlap", 1.0))
        # the bucketed gradient reductions' share hidden behind the backward, measured as the
        # runtime issues them (`canzona.calibrate.grad_overlap`; calibrations before format 16 and
        # the spec-derived files: ``overlap``)
        self.grad_reduce_overlap = float(comp.get("grad_reduce_overlap", self.overlap))
        # What a collective waits for its peers to be scheduled when the trial's ranks oversubscribe
        # the CPU (`canzona.calibrate.contended`); added to every collective's latency only by the
        # copy `oversubscribed` returns.
        self.sched_wait_s = float(comp.get("sched_wait_s", 0.0))
        self.contention_s = 0.0
        # What a collective waits for its peers to arrive, by the work its members did since their
        # previous collective (`canzona.calibrate.peer_wait`; the timeline adds it): sorted by work
        self.peer_wait = sorted((float(w), float(t)) for w, t in (comp.get("peer_wait") or []))
        # The contended wait by the work apart (`canzona.calibrate.contended`): what `oversubscribed` waits
        self.sched_wait_curve = sorted((float(w), float(t)) for w, t in (comp.get("sched_wait_curve") or []))
        # CPU seconds a second a rank's other threads use with nothing to do (gloo's transport
        # loops, `canzona.calibrate.comm.idle_threads_cpu`): cores an oversubscribed trial loses
        self.idle_threads_cpu_per_s = float(comp.get("idle_threads_cpu_per_s", 0.0))
        # Whether calls issued as one coalesced group launch together (NCCL's group calls on
        # GPUs); gloo on CPUs has no coalescing and runs them one after another.
        self.coalesces = bool(comp.get("coalesces", self.device.get("kind", "cpu") != "cpu"))
        # How many collectives of one process group run at once: gloo's worker threads (two per
        # group unless its options say otherwise) on a CPU; NCCL's one stream per communicator
        self.comm_lanes = int(comp.get("comm_lanes", 1 if self.device.get("kind", "cpu") != "cpu" else 2))
        # Whether a collective's latency keeps the rank's core busy (`collective_parts`): gloo on a CPU
        self.latency_busy = self.device.get("kind", "cpu") == "cpu"
        self.updates = {o: {k: float(v) for k, v in (t or {}).items()} for o, t in (data.get("updates") or {}).items()}
        self.batched = {o: dict(t or {}) for o, t in (data.get("batched") or {}).items()}
        self.update_overhead = {o: float(v) for o, v in (data.get("update_overhead_s") or {}).items()}
        self.table_ns_dtype = str(data.get("ns_dtype", "float32"))
        self.precondition_frequency = int(data.get("precondition_frequency", 10))
        self.adamw_s_per_elem = float(data.get("adamw_seconds_per_element", ADAMW_BYTES_PER_ELEMENT / self.memory_Bps))
        self.adamw_tensor_overhead_s = float(data.get("adamw_tensor_overhead_s", self.call_overhead_s))
        self.apply_s_per_elem = float(data.get("apply_seconds_per_element", APPLY_BYTES_PER_ELEMENT / self.memory_Bps))
        self.apply_call_overhead_s = float(data.get("apply_call_overhead_s", self.call_overhead_s))
        self.copy_s_per_byte = float(data.get("copy_seconds_per_byte", 2.0 / self.memory_Bps))
        self.copy_call_overhead_s = float(data.get("copy_call_overhead_s", 0.0))
        self.grad_add_s_per_elem = {str(k): float(v) for k, v in (data.get("grad_add_seconds_per_element") or {}).items()}
        large = data.get("grad_add_large") or {}
        self.grad_add_large_elems = float(large.get("elements") or 0.0)
        self.grad_add_large_s_per_elem = {str(k): float(v) for k, v in (large.get("seconds_per_element") or {}).items()}
        self.cast_s_per_elem = {str(k): float(v) for k, v in (data.get("cast_seconds_per_element") or {}).items()}
        # gradient clipping's norm (a read) and in-place scaling: calibrated on a CPU; a file
        # without them prices each as one copy pass (spec-derived GPU files)
        self.pass_rates = {k: (float(data[f"{k}_seconds_per_byte"]), float(data.get(f"{k}_call_overhead_s", 0.0)))
                           for k in ("norm", "scale") if f"{k}_seconds_per_byte" in data}
        model = data.get("model") or {}
        self.model_dtype = str(model.get("dtype", "float32"))
        fallback = PassTiming(0.0, 0.0, self.matmul_flops.get(self.model_dtype, self.matmul_flops["float32"]) * 0.5)
        self.forward = _pass(model.get("forward"), fallback)
        self.backward = _pass(model.get("backward"), fallback)
        self.links: dict[str, dict[str, Link]] = {}
        coll = data.get("collectives") or {}
        for level in LEVELS:
            if level in coll:
                self.links[level] = {k: _link(v) for k, v in coll[level].items()}
        if "intra" not in self.links:
            raise ConfigError(f"hardware {self.name}: collectives.intra is required")
        for level, links in self.links.items():
            missing = [k for k in COLLECTIVES if k not in links]
            if missing:
                raise ConfigError(f"hardware {self.name}: collectives.{level} lacks {', '.join(missing)}")

    # ------------------------------------------------------------------ description
    def describe(self) -> dict[str, Any]:
        """Name, source, path, device, topology and fingerprint; on a calibrated CPU also
        ``cpu_sharing``: what a collective waits for its peers (``sched_wait_ms`` when ranks
        oversubscribe the cores, ``peer_wait_ms``: [[work ms, wait ms], ...] after work apart, and
        ``sched_wait_curve_ms`` the same under oversubscription where the file has it);
        for the median of several calibrations ``calibration_spread``: how many, whether they were
        slices spread over a sweep's runs (``sliced``) or taken in a row, and the range of a few
        headline numbers across them."""
        out = {"name": self.name, "source": self.source, "path": self.path, "device": self.device.get("name"),
               "ranks_per_node": self.ranks_per_node, "fingerprint": self.fingerprint}
        if self.sched_wait_s or self.peer_wait:
            out["cpu_sharing"] = {"sched_wait_ms": self.sched_wait_s * 1e3,
                                  "peer_wait_ms": [[w * 1e3, t * 1e3] for w, t in self.peer_wait],
                                  **({"sched_wait_curve_ms": [[w * 1e3, t * 1e3] for w, t in self.sched_wait_curve]}
                                     if self.sched_wait_curve else {})}
        calib = self.raw.get("calibration") or {}
        if (calib.get("repeats") or 1) > 1 and calib.get("spread"):  # `canzona.calibrate.repeat`
            out["calibration_spread"] = {"repeats": int(calib["repeats"]), "spread": dict(calib["spread"]),
                                         "sliced": bool(calib.get("slices"))}
        return out

    @property
    def fingerprint(self) -> str:
        """A short hash of the file's content: projections made with another content differ. The
        evidence labels (``inputs.provenance``, ``inputs.fitted_on``) are left out: labelling a
        file's numbers changes no projection, so it leaves the fingerprint as it was."""
        raw, inputs = self.raw, self.raw.get("inputs")
        if isinstance(inputs, dict) and any(k in inputs for k in EVIDENCE_KEYS):
            raw = {**raw, "inputs": {k: v for k, v in inputs.items() if k not in EVIDENCE_KEYS}}
        text = json.dumps(raw, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def inputs(self) -> dict[str, Any]:
        """What a projection rests on, for a report: the description, device and topology, the
        stated inputs of a spec-derived description (peaks, efficiencies, sources) or the scalar
        settings of a calibration, and the effective rates the simulator uses."""
        calib = {k: v for k, v in (self.raw.get("calibration") or {}).items()
                 if not isinstance(v, (dict, list)) or k == "width_divs"}
        def r(x: float) -> float:
            return float(f"{x:.6g}")

        rates: dict[str, Any] = {
            "matmul_tflops": {k: r(v / 1e12) for k, v in self.matmul_flops.items()},
            "memory_GBps": r(self.memory_Bps / 1e9),
            "model_tflops": {"forward": r(self.forward.flops_per_s / 1e12), "backward": r(self.backward.flops_per_s / 1e12)},
            "model_dtype": self.model_dtype,
            "comm_compute_overlap": self.overlap,
            **({"grad_reduce_backward_overlap": self.grad_reduce_overlap}
               if self.grad_reduce_overlap != self.overlap else {}),
            **({"oversubscribed_collective_wait_ms": r(self.sched_wait_s * 1e3)} if self.sched_wait_s else {}),
            **({"peer_wait_ms_after_work_ms": [[r(w * 1e3), r(t * 1e3)] for w, t in self.peer_wait]}
               if self.peer_wait else {}),
            **({"oversubscribed_wait_ms_after_work_ms": [[r(w * 1e3), r(t * 1e3)] for w, t in self.sched_wait_curve]}
               if self.sched_wait_curve else {}),
            **({"collectives_at_once_per_group": self.comm_lanes} if self.comm_lanes > 1 else {}),
            **({"idle_threads_cpu_ms_per_s": r(self.idle_threads_cpu_per_s * 1e3)} if self.idle_threads_cpu_per_s else {}),
            "optimizer_table": sorted(o for o, t in self.batched.items() if t) or "none (flops at the matmul rate)",
        }
        for level, links in self.links.items():
            ar = links["all_reduce"]
            rates[f"{level}_all_reduce"] = {"latency_us": r(ar.latency_s * 1e6), "step_latency_us": r(ar.step_latency_s * 1e6),
                                            "bandwidth_GBps": r(ar.bandwidth_Bps / 1e9),
                                            **({"cpu_us_per_call": r(ar.call_cpu_s * 1e6),
                                                "cpu_us_per_MB": r(ar.call_cpu_s_per_byte * 1e12)}
                                               if ar.call_cpu_s or ar.call_cpu_s_per_byte else {})}
        out: dict[str, Any] = {
            "name": self.name, "source": self.source, "path": self.path, "fingerprint": self.fingerprint,
            "description": self.raw.get("description"), "device": dict(self.device),
            "ranks_per_node": self.ranks_per_node,
        }
        if self.raw.get("inputs"):
            out["inputs"] = self.raw["inputs"]
        if calib:
            out["calibration"] = calib
        out["rates"] = rates
        return out

    def model_pass(self, which: str, dtype: str) -> PassTiming:
        """The ``forward`` or ``backward`` pass of a trial training in ``dtype``: the file's fit where
        it was timed in that dtype (``model.dtype``), else its flop rate rescaled by the two
        dtypes' matmul rates (a GPU's bf16 runs about 8 times its fp32 without TF32)."""
        fit = self.forward if which == "forward" else self.backward
        if dtype == self.model_dtype or dtype not in self.matmul_flops:
            return fit
        scale = self.matmul_flops[dtype] / self.matmul_flops.get(self.model_dtype, self.matmul_flops["float32"])
        return PassTiming(fit.fixed_s, fit.layer_s, fit.flops_per_s * scale)

    @property
    def activation_bytes(self) -> int:
        return 2 if self.model_dtype in ("bfloat16", "float16") else 4

    # ------------------------------------------------------------------ communication
    def level(self, ranks: Sequence[int]) -> str:
        if self.ranks_per_node is None or "inter" not in self.links:
            return "intra"
        nodes = {r // self.ranks_per_node for r in ranks}
        return "inter" if len(nodes) > 1 else "intra"

    def collective_parts(self, kind: str, nbytes: float, ranks: Sequence[int],
                         level: str | None = None) -> tuple[float, float]:
        """(waiting, busy) seconds of one collective over `ranks` (global ranks; their nodes
        pick the level, unless ``level`` -- `level` of these ranks, which a caller pricing many
        collectives of one group may keep -- is given). Only the busy part keeps a CPU core
        busy (the simulator stretches it on an oversubscribed CPU and charges it to the host
        where communication does not overlap compute): on a GPU the transfer; on a CPU (gloo)
        the link's latency too -- the calls' dispatch, gloo's thread hand-offs and loopback
        syscalls run on the rank's cores -- except where the ranks oversubscribe the cores
        (`oversubscribed`): there the latency and the scheduling wait are what
        `canzona.calibrate.contended` measured a collective to add between compute chunks under
        that very contention (its wait is the excess over the latency), so neither is stretched
        again. Gloo runs its ring at every size (`ring_steps`)."""
        if kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {kind!r}")
        latency, transfer = self.links[level or self.level(ranks)][kind].parts(kind, len(ranks), nbytes,
                                                                               ring=self.latency_busy)
        if self.latency_busy and not self.contention_s:
            return 0.0, latency + transfer
        return latency + self.contention_s, transfer

    def peer_wait_after(self, work_s: float) -> float:
        """Seconds a collective waits for its peers after ``work_s`` of work since their previous
        one (``compute.peer_wait``): linear between the measured points, the first point's below
        them and the last point's beyond them (the drift is not extrapolated); 0 without points."""
        return _read_curve(self.peer_wait, work_s)

    def lag_after(self, work_s: float) -> float:
        """How much later than its peers the slowest rank finishes ``work_s`` of work done since
        they last met (`canzona.sim.timeline.Timeline.slowest_lag`): the drift curve
        (`peer_wait_after`), except on an oversubscribed CPU whose file has the contended curve,
        where that whole curve is the drift -- every collective there already waits
        ``sched_wait_s``, the end of the step waits for no collective."""
        return _read_curve(self.sched_wait_curve if self.contention_s and self.sched_wait_curve else self.peer_wait, work_s)

    def oversubscribed(self) -> Hardware:
        """This hardware as a trial whose ranks oversubscribe the CPU meets it: every collective
        waits ``sched_wait_s`` more for its peers to be scheduled, and where the file has the
        contended curve (``sched_wait_curve``) the peers' drift is that curve's excess over
        ``sched_wait_s`` by the work apart instead of the drift measured without oversubscription
        (``peer_wait``): what the same measurement read after longer work (the same file otherwise)."""
        out = copy.copy(self)
        out.contention_s = self.sched_wait_s
        if self.sched_wait_curve:
            out.peer_wait = [(w, max(0.0, t - self.sched_wait_s)) for w, t in self.sched_wait_curve]
        return out

    def call_cpu(self, kind: str, nbytes: float, ranks: Sequence[int], level: str | None = None) -> float:
        """CPU seconds one collective over `ranks` costs each member's process (`Link.call_cpu`:
        the caller's dispatch and wake-up, gloo's worker and transport threads) that the
        simulator charges to the member's host: only where the ranks oversubscribe the cores
        (`oversubscribed`). There every core is busy, so a collective's CPU is the ranks' wall
        time, where its latency is priced as waiting (`collective_parts`)."""
        if not (self.contention_s and self.latency_busy):
            return 0.0
        return self.links[level or self.level(ranks)][kind].call_cpu(kind, len(ranks), nbytes, ring=True)

    def collective(self, kind: str, nbytes: float, ranks: Sequence[int]) -> float:
        """Seconds of one collective over `ranks`."""
        return sum(self.collective_parts(kind, nbytes, ranks))

    # ------------------------------------------------------------------ optimizer compute
    def _matmul_rate(self, optimizer: str, ns_dtype: str) -> float:
        dtype = registry.get(optimizer).matmul_dtype(_settings(ns_dtype=ns_dtype))
        return self.matmul_flops.get(dtype, self.matmul_flops["float32"])

    def update_seconds(self, optimizer: str, m: int, n: int, settings: Any = None, *, refresh: bool = False) -> float:
        """One update of one m×n matrix from the rates alone (the roofline):
        ``steady flops / matmul rate (the optimizer's matmul dtype) + elementwise passes × 4 bytes
        × m·n / memory bandwidth``, and with ``refresh`` its preconditioner refresh amortised
        (``refresh flops / eigendecomposition rate / refresh interval``). ``settings``: an
        optimizer section (None: the defaults). What `canzona.roofline` and the simulator both use."""
        d, s = registry.get(optimizer), settings if settings is not None else _settings()
        rate = self.matmul_flops.get(d.matmul_dtype(s), self.matmul_flops["float32"])
        every = d.refresh_every(s) if refresh and d.refresh_every is not None else None
        amortised = d.refresh_flops((m, n), s) / self.eigh_flops / every if every else 0.0
        return d.steady_flops((m, n), s) / rate + amortised + d.elementwise_passes * 4.0 * m * n / self.memory_Bps

    def stacked_measured(self, optimizer: str) -> bool:
        """Whether the file times Muon's stacked Newton–Schulz (``stacked_slope_s``; calibrated
        files from 2026-12-02 on), which ``optimizer.batch_equal_shapes`` runs."""
        return any("stacked_slope_s" in e for e in (self.batched.get(optimizer) or {}).values())

    def matrix_batch(self, optimizer: str, m: int, n: int, ns_dtype: str = "float32", ns_steps: int = 5,
                     stacked: bool = False) -> tuple[float, float]:
        """(overhead_s, slope_s): one batched call over c matrices of shape m×n costs overhead + c·slope;
        ``stacked``: the slope of one stacked Newton–Schulz over them where the file times it
        (``stacked_slope_s``), else the one-at-a-time slope."""
        table = self.batched.get(optimizer) or {}

        def slope_of(e: dict) -> float:
            return float(e["stacked_slope_s"] if stacked and "stacked_slope_s" in e else e["slope_s"])

        key = _shape_key(m, n)
        default_overhead = self.update_overhead.get(optimizer, self.call_overhead_s)
        dtype_scale = 1.0
        if ns_dtype != self.table_ns_dtype and table:  # 1 unless the optimizer's matmuls follow ns_dtype
            dtype_scale = self._matmul_rate(optimizer, self.table_ns_dtype) / self._matmul_rate(optimizer, ns_dtype)
        if key in table:
            e = table[key]
            return float(e.get("overhead_s", default_overhead)), slope_of(e) * dtype_scale
        if table:
            # nearest measured shape by steady flops, scaled by the flops ratio (as MeasuredCost)
            target = steady_flops(optimizer, m, n, ns_steps)
            best = min(table, key=lambda k: abs(steady_flops(optimizer, *_parse(k), ns_steps) - target))
            ref = steady_flops(optimizer, *_parse(best), ns_steps)
            return default_overhead, slope_of(table[best]) * target / ref * dtype_scale
        return default_overhead, self.update_seconds(optimizer, m, n, _settings(ns_steps, ns_dtype))

    def matrix_call(self, optimizer: str, shapes: Iterable[tuple[int, int]], ns_dtype: str = "float32",
                    ns_steps: int = 5, stacked: bool = False) -> float:
        """One `MatrixUpdates.directions` call over these matrices: the rule runs matrix by matrix,
        so per shape a call of c matrices costs the table's ``overhead + c·slope`` (as calibrated);
        with ``stacked`` (Muon's ``optimizer.batch_equal_shapes``) a group of two or more equal
        shapes takes the stacked slope (a group of one runs the one-matrix path)."""
        counts: dict[tuple[int, int], int] = {}
        for s in shapes:
            counts[s] = counts.get(s, 0) + 1
        total = 0.0
        for (m, n), c in counts.items():
            overhead, slope = self.matrix_batch(optimizer, m, n, ns_dtype, ns_steps, stacked and c > 1)
            total += overhead + c * slope
        return total

    def gram_call(self, pieces: Iterable[tuple[tuple[int, int], int]], tp: int, ns_dtype: str = "float32",
                  ns_steps: int = 5) -> float:
        """One TP rank's Newton–Schulz of its shards of these matrices, Megatron's ``distributed``
        way (TP strategy ``gram_allreduce``; each piece: the whole matrix's shape and the dim it
        is cut along over ``tp``), the collectives aside: per shape the table's call overhead once
        (as `matrix_call`), plus per matrix its whole update's slope scaled by the shard's share
        of the flops (`canzona.optim.definitions.muon_gram_flops`: about 1/tp of the products, the
        Gram's polynomial whole)."""
        total = 0.0
        seen: set[tuple[int, int]] = set()
        for shape, dim in pieces:
            overhead, slope = self.matrix_batch("muon", *shape, ns_dtype, ns_steps)
            total += (0.0 if shape in seen else overhead) + slope * muon_gram_share([shape], dim, tp, ns_steps)
            seen.add(shape)
        return total

    # ------------------------------------------------------------------ elementwise work
    def adamw(self, sizes: Iterable[int]) -> float:
        """AdamW direction + apply over tensors of these element counts."""
        sizes = list(sizes)
        return len(sizes) * self.adamw_tensor_overhead_s + sum(sizes) * self.adamw_s_per_elem

    def apply(self, sizes: Iterable[int]) -> float:
        sizes = list(sizes)
        return len(sizes) * self.apply_call_overhead_s + sum(sizes) * self.apply_s_per_elem

    def copy(self, nbytes: float, calls: int = 1) -> float:
        return calls * self.copy_call_overhead_s + nbytes * self.copy_s_per_byte

    def grad_add(self, numel: float, dtype: str, copy_factor: float) -> float:
        """Seconds of one gradient of ``numel`` elements in ``dtype`` landing in the fp32 buffer
        (``grad_view.add_(grad)``): the calibrated rate where the file has it -- up to
        `GRAD_ADD_WARM_ELEMENTS` the warm one, at ``grad_add_large.elements`` and beyond the
        out-of-cache one where the file has it -- else ``copy_factor`` copies of its fp32 bytes."""
        rate = self.grad_add_s_per_elem.get(dtype)
        if rate is None:
            return self.copy(copy_factor * 4 * numel)
        large = self.grad_add_large_s_per_elem.get(dtype)
        if large is not None and numel > GRAD_ADD_WARM_ELEMENTS and self.grad_add_large_elems > GRAD_ADD_WARM_ELEMENTS:
            # out of cache: a gradient the size of the embedding's lands at the large rate
            # (`canzona.calibrate.compute.time_basics`), sizes between interpolated in log2(size)
            frac = min(1.0, math.log2(numel / GRAD_ADD_WARM_ELEMENTS)
                       / math.log2(self.grad_add_large_elems / GRAD_ADD_WARM_ELEMENTS))
            rate += frac * (large - rate)
        return self.copy_call_overhead_s + numel * rate

    def cast(self, numel: float, dtype: str, calls: int = 1) -> float:
        """Seconds of the fp32 main parameters cast into the model's ``dtype`` (``CopyToModel``)
        in ``calls`` ranges: the calibrated rate where the file has it, else a copy of fp32 bytes
        (a bf16 destination writes half of that: on a GPU the copy prices it about 1.6x high)."""
        rate = self.cast_s_per_elem.get(dtype)
        if rate is None:
            return self.copy(4 * numel, calls)
        return calls * self.copy_call_overhead_s + numel * rate

    def grad_pass(self, kind: str, nbytes: float, calls: int = 1) -> float:
        """Seconds of gradient clipping's ``norm`` or ``scale`` pass over ``nbytes`` of fp32
        gradient in ``calls`` ranges (a copy pass where the file has no rate for it)."""
        rate = self.pass_rates.get(kind)
        if rate is None:
            return self.copy(nbytes, calls)
        per_byte, per_call = rate
        return calls * per_call + nbytes * per_byte


def evidence(entry: Any) -> tuple[Any, str | None]:
    """(label, source) of one ``inputs.provenance`` entry: a bare label or ``{label, source, note}``."""
    if isinstance(entry, dict):
        return entry.get("label"), entry.get("source") or None
    return entry, None


def _number_at(data: dict[str, Any], key: str) -> Any:
    """The value a provenance key names: under ``inputs`` first, else from the file's top."""
    for node in (data.get("inputs") or {}, data):
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def input_numbers(data: dict[str, Any]) -> list[str]:
    """Dotted paths of the numbers under ``inputs`` (the evidence keys and sources aside)."""
    out: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            out.append(path)

    walk({k: v for k, v in (data.get("inputs") or {}).items() if k not in (*EVIDENCE_KEYS, "sources")}, "")
    return out


def unlabelled(data: dict[str, Any]) -> list[str]:
    """What a file's evidence lacks: input numbers without a provenance label, and labels that
    name no number. Empty for a complete file (the spec-derived files are; a test holds them to it)."""
    prov = (data.get("inputs") or {}).get("provenance") or {}
    missing = [f"{k}: no provenance label" for k in input_numbers(data) if k not in prov]
    stray = [f"{k}: labelled, but no such number" for k in prov
             if not isinstance(_number_at(data, k), (int, float)) or isinstance(_number_at(data, k), bool)]
    return missing + stray


def check_evidence(data: dict[str, Any]) -> None:
    """A ConfigError for malformed evidence: a label outside `EVIDENCE_LABELS`, a ``published``
    number without its source, ``fitted_on`` not a list, or fitted points without a published number."""
    name, inputs = data.get("name"), data.get("inputs")
    if not isinstance(inputs, dict):
        return
    prov, fitted = inputs.get("provenance"), inputs.get("fitted_on", [])
    if prov is not None and not isinstance(prov, dict):
        raise ConfigError(f"hardware {name}: inputs.provenance must map each input to its label")
    labels = []
    for key, entry in (prov or {}).items():
        label, source = evidence(entry)
        if label not in EVIDENCE_LABELS:
            raise ConfigError(f"hardware {name}: inputs.provenance.{key} is labelled {label!r}; "
                              f"allowed: {', '.join(EVIDENCE_LABELS)}")
        if label == "published" and not source:
            raise ConfigError(f"hardware {name}: inputs.provenance.{key} is published but names no source "
                              "(give {label: published, source: ...})")
        labels.append(label)
    if not isinstance(fitted, list):
        raise ConfigError(f"hardware {name}: inputs.fitted_on must be a list of published point ids")
    if fitted and "published" not in labels:
        raise ConfigError(f"hardware {name}: inputs.fitted_on names published points but no number is "
                          "labelled published")


def _pass(d: dict[str, Any] | None, fallback: PassTiming) -> PassTiming:
    if not d:
        return fallback
    return PassTiming(float(d.get("fixed_s", 0.0)), float(d.get("layer_s", 0.0)), float(d["flops_per_s"]))


def _link(d: dict[str, Any]) -> Link:
    return Link(float(d["latency_s"]), float(d["bandwidth_Bps"]), float(d.get("step_latency_s", 0.0)),
                float(d.get("one_element_s", 0.0)), float(d.get("call_cpu_s", 0.0)),
                float(d.get("call_cpu_s_per_byte", 0.0)), float(d.get("one_element_call_cpu_s", 0.0)))


def load_hardware(hardware: str | Path | dict[str, Any] | Hardware) -> Hardware:
    """A Hardware from an instance, a dict, a YAML path, or a name under ``hardware/``."""
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, dict):
        return Hardware(hardware)
    path = Path(hardware)
    if not path.exists() and not path.suffix:
        path = HARDWARE_DIR / f"{hardware}.yaml"
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))) or "none"
        raise ConfigError(f"hardware {str(hardware)!r} not found (a YAML path, or one of: {have})"
                          + _moved_hint(Path(str(hardware))))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"hardware {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    return Hardware(data, str(path))


def _moved_hint(given: Path) -> str:
    """For a name (``local``) whose file is still in ``profiles/``, where hardware files were
    before the rename: where to move it."""
    old = BEFORE_RENAME_DIR / f"{given}.yaml"
    if given.suffix or not old.is_file():
        return ""
    return f"; {old} is from before profiles/ was renamed hardware/: move it to {HARDWARE_DIR / old.name}"


def local_file() -> Path | None:
    """``hardware/local.yaml`` (this machine's calibration) if it exists, else None; a ConfigError
    when only the ``profiles/local.yaml`` of before the rename exists (it would be ignored)."""
    if LOCAL_FILE.is_file():
        return LOCAL_FILE
    old = BEFORE_RENAME_DIR / LOCAL_FILE.name
    if old.is_file():
        raise ConfigError(f"{old} is from before profiles/ was renamed hardware/: move it to {LOCAL_FILE}")
    return None


# ---------------------------------------------------------------------------------- spec-derived
@dataclass(frozen=True)
class DeviceSpec:
    """Public datasheet numbers for one GPU and its node/cluster fabric."""

    name: str
    device: str
    bf16_tflops: float  # dense tensor-core peak
    fp32_tflops: float  # non-tensor FP32 peak (torch fp32 matmul without TF32)
    hbm_TBps: float
    nvlink_GBps: float  # per GPU, per direction
    network_GBps: float  # per GPU (one NIC per GPU), per direction
    sources: tuple[str, ...]
    ranks_per_node: int = 8
    nvlink_latency_s: float = 3e-6  # per NCCL ring step within a node
    network_latency_s: float = 8e-6  # per NCCL ring step across nodes
    launch_s: float = 1e-5  # per collective / kernel launch
    # what a node is, in the file's description
    node: str = "nodes of {n} GPUs (NVLink inside a node, InfiniBand across)"
    # this spec's provenance entries, over `SPEC_PROVENANCE` (inputs.provenance of its file)
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)


# Efficiency factors applied to the peaks (stated in every spec-derived file's ``inputs``).
EFFICIENCY = {
    "optimizer_matmul": 0.60,  # batched Newton-Schulz / preconditioner GEMMs of these sizes
    "eigh_of_fp32_peak": 0.10,  # cuSOLVER syevd reaches a small fraction of peak
    "model_mfu": 0.40,  # Megatron dense bf16 training, model flops utilisation
    "memory": 0.75,  # achieved / peak HBM bandwidth for elementwise kernels
    "nvlink_busbw": 0.80,  # NCCL bus bandwidth / NVLink peak
    "network_busbw": 0.85,  # NCCL bus bandwidth / NIC line rate
}

# Where each number a spec-derived file rests on comes from (its inputs.provenance; labels and
# key paths: the module docstring), unless its DeviceSpec's ``provenance`` says otherwise. No
# efficiency or latency is fitted to a published measurement yet: all are assumptions.
SPEC_PROVENANCE: dict[str, Any] = {
    "peak_bf16_tflops": "datasheet",
    "peak_fp32_tflops": "datasheet",
    "hbm_TBps": "datasheet",
    "nvlink_GBps_per_direction": {"label": "datasheet", "note": "the datasheet's bidirectional NVLink bandwidth per GPU, halved"},
    "network_GBps_per_gpu": "datasheet",
    "nvlink_step_latency_s": "assumption",
    "network_step_latency_s": "assumption",
    "launch_s": "assumption",
    **{f"efficiency.{k}": "assumption" for k in EFFICIENCY},
    "topology.ranks_per_node": {"label": "datasheet", "note": "8 GPUs on one HGX / DGX baseboard's NVSwitch"},
    "compute.call_overhead_s": {"label": "assumption", "note": "5 x launch_s per batched optimizer call per shape"},
    "compute.overlap": {"label": "assumption", "note": "asynchronous communication wholly hidden behind host compute"},
    "model.forward.fixed_s": "assumption",
    "model.forward.layer_s": "assumption",
    "model.backward.fixed_s": "assumption",
    "model.backward.layer_s": "assumption",
}
NVL72 = "NVLink domains of {n} GPUs (one NVL72 rack; the network across racks)"
NVL72_NETWORK = ("the NVL72 datasheet gives no scale-out bandwidth per GPU: one {gbit} Gb/s NIC per GPU ({nic}) "
                 "is assumed")

# Insertion order matters to `canzona.calibrate`'s spec=auto (the first key found in the device's
# name): gb200 / gb300 come before b200, which "NVIDIA GB200" also contains.
SPECS = {
    "h100": DeviceSpec(
        "h100", "NVIDIA H100 SXM5 80GB", 989.4, 66.9, 3.35, 450.0, 50.0,
        ("NVIDIA H100 Tensor Core GPU datasheet: BF16 989.4 TFLOPS dense, FP32 66.9 TFLOPS, "
         "HBM3 3.35 TB/s, NVLink 900 GB/s bidirectional",
         "NVIDIA DGX H100 user guide: 8x ConnectX-7 400 Gb/s InfiniBand NDR for the compute fabric"),
        provenance={"network_GBps_per_gpu": {"label": "datasheet", "note": "DGX H100: one 400 Gb/s ConnectX-7 per GPU"}},
    ),
    "h200": DeviceSpec(
        "h200", "NVIDIA H200 SXM 141GB", 989.4, 66.9, 4.8, 450.0, 50.0,
        ("NVIDIA H200 Tensor Core GPU datasheet: BF16 989 TFLOPS dense, FP32 67 TFLOPS, "
         "HBM3e 4.8 TB/s, NVLink 900 GB/s bidirectional",
         "NVIDIA DGX H200: 8x ConnectX-7 400 Gb/s InfiniBand NDR for the compute fabric"),
        provenance={"network_GBps_per_gpu": {"label": "datasheet", "note": "DGX H200: one 400 Gb/s ConnectX-7 per GPU"}},
    ),
    "a100": DeviceSpec(
        "a100", "NVIDIA A100 SXM4 80GB", 312.0, 19.5, 2.039, 300.0, 25.0,
        ("NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense, FP32 19.5 TFLOPS, "
         "HBM2e 2,039 GB/s, NVLink 600 GB/s bidirectional",
         "NVIDIA DGX A100 user guide: 8x ConnectX-6 200 Gb/s InfiniBand HDR for the compute fabric"),
        network_latency_s=1e-5,
        provenance={"network_GBps_per_gpu": {"label": "datasheet", "note": "DGX A100: one 200 Gb/s ConnectX-6 per GPU"}},
    ),
    "gb200": DeviceSpec(
        "gb200", "NVIDIA GB200 NVL72 (Blackwell GPU)", 2500.0, 80.0, 8.0, 900.0, 50.0,
        ("NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/gb200-nvl72; 36 Grace CPUs : "
         "72 Blackwell GPUs): FP16/BF16 Tensor Core 360 PFLOPS, a sparse figure (dense is one half), FP32 "
         "5,760 TFLOPS, GPU memory 13.4 TB HBM3e | 576 TB/s, NVLink bandwidth 130 TB/s; per GB200 superchip "
         "(1 Grace : 2 GPUs) 10 PFLOPS FP16/BF16 sparse, 160 TFLOPS FP32, 372 GB HBM3e | 16 TB/s, NVLink "
         "3.6 TB/s",
         "NVIDIA NVLink (nvidia.com/en-us/data-center/nvlink), fifth generation: 1.8 TB/s bidirectional per GPU "
         "(18 links)"),
        ranks_per_node=72, node=NVL72,
        provenance={
            "peak_bf16_tflops": {"label": "datasheet", "note": "360 PFLOPS sparse / 2 / 72 GPUs"},
            "peak_fp32_tflops": {"label": "datasheet", "note": "5,760 TFLOPS / 72 GPUs"},
            "hbm_TBps": {"label": "datasheet", "note": "576 TB/s / 72 GPUs"},
            "nvlink_GBps_per_direction": {"label": "datasheet", "note": "1.8 TB/s bidirectional per GPU, halved"},
            "network_GBps_per_gpu": {"label": "assumption", "note": NVL72_NETWORK.format(gbit=400, nic="ConnectX-7 class")},
            "topology.ranks_per_node": {"label": "datasheet", "note": "72 GPUs in one NVLink domain (NVL72)"},
        },
    ),
    "gb300": DeviceSpec(
        "gb300", "NVIDIA GB300 NVL72 (Blackwell Ultra GPU)", 2500.0, 80.0, 8.0, 900.0, 100.0,
        ("NVIDIA GB300 NVL72 specifications (nvidia.com/en-us/data-center/gb300-nvl72; 36 Grace CPUs : "
         "72 Blackwell Ultra GPUs): FP16/BF16 Tensor Core 360 PFLOPS, a sparse figure (dense is one half), "
         "FP32 6 PFLOPS, GPU memory up to 576 TB/s, NVLink bandwidth 130 TB/s",
         "NVIDIA Blackwell Ultra datasheet, GB300 NVL72 column (per GPU): FP16/BF16 5 PFLOPS sparse, FP32 "
         "80 TFLOPS, 279 GB HBM3E | 8 TB/s, NVLink 5 1.8 TB/s bidirectional"),
        ranks_per_node=72, node=NVL72,
        provenance={
            "peak_bf16_tflops": {"label": "datasheet", "note": "5 PFLOPS sparse per GPU / 2 (rack: 360 PFLOPS / 2 / 72)"},
            "peak_fp32_tflops": {"label": "datasheet", "note": "Blackwell Ultra datasheet, per GPU (the rack's 6 PFLOPS is rounded)"},
            "hbm_TBps": {"label": "datasheet", "note": "8 TB/s per GPU (rack: 576 TB/s / 72)"},
            "nvlink_GBps_per_direction": {"label": "datasheet", "note": "1.8 TB/s bidirectional per GPU, halved"},
            "network_GBps_per_gpu": {"label": "assumption",
                                     "note": NVL72_NETWORK.format(gbit=800, nic="ConnectX-8 SuperNIC class")},
            "topology.ranks_per_node": {"label": "datasheet", "note": "72 GPUs in one NVLink domain (NVL72)"},
        },
    ),
    "b200": DeviceSpec(
        "b200", "NVIDIA B200 SXM (HGX B200)", 2250.0, 75.0, 7.7, 900.0, 50.0,
        ("NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx; 8 GPUs): FP16/BF16 Tensor Core "
         "36 PFLOPS, a sparse figure (dense is one half), FP32 600 TFLOPS, NVSwitch GPU-to-GPU bandwidth "
         "1.8 TB/s (NVLink 5), networking bandwidth 0.8 TB/s",
         "NVIDIA Blackwell datasheet, HGX B200 column (per GPU): HBM3e 7.7 TB/s (the DGX B200 states "
         "64 TB/s for 8 GPUs, 8 TB/s each)",
         "NVIDIA DGX B200 datasheet: 8x single-port ConnectX-7 VPI, up to 400 Gb/s InfiniBand/Ethernet, for the "
         "compute fabric"),
        provenance={
            "peak_bf16_tflops": {"label": "datasheet", "note": "36 PFLOPS sparse / 2 / 8 GPUs"},
            "peak_fp32_tflops": {"label": "datasheet", "note": "600 TFLOPS / 8 GPUs"},
            "hbm_TBps": {"label": "datasheet", "note": "the per-GPU figure, not DGX B200's 8 TB/s"},
            "nvlink_GBps_per_direction": {"label": "datasheet", "note": "1.8 TB/s bidirectional per GPU, halved"},
            "network_GBps_per_gpu": {"label": "datasheet", "note": "DGX B200: one 400 Gb/s ConnectX-7 per GPU"},
        },
    ),
}


def spec_provenance(key: str) -> dict[str, Any]:
    """The ``inputs.provenance`` of `SPECS`' ``key``: `SPEC_PROVENANCE` with the spec's own entries."""
    return {**SPEC_PROVENANCE, **SPECS[key].provenance}


def spec_hardware(key: str) -> dict[str, Any]:
    """The spec-derived hardware dict for one of `SPECS` (what ``hardware/<key>.yaml`` holds)."""
    s = SPECS[key]
    e = EFFICIENCY
    mem = s.hbm_TBps * 1e12 * e["memory"]

    def level(bw_GBps: float, eff: float, step_s: float) -> dict[str, dict[str, float]]:
        link = {"latency_s": s.launch_s + step_s, "step_latency_s": step_s, "bandwidth_Bps": bw_GBps * 1e9 * eff}
        return {k: dict(link) for k in COLLECTIVES}

    return {
        "name": key,
        "source": "spec-derived",
        "description": f"{s.device}, {s.node.format(n=s.ranks_per_node)}, "
                       "derived from public specs times the stated efficiency factors; replace with "
                       "`python -m canzona.calibrate` on the machine when you have one",
        "device": {"name": s.device, "kind": "cuda", "host": None, "date": None, "torch": None, "cores": None},
        "inputs": {
            "peak_bf16_tflops": s.bf16_tflops, "peak_fp32_tflops": s.fp32_tflops, "hbm_TBps": s.hbm_TBps,
            "nvlink_GBps_per_direction": s.nvlink_GBps, "network_GBps_per_gpu": s.network_GBps,
            "nvlink_step_latency_s": s.nvlink_latency_s, "network_step_latency_s": s.network_latency_s,
            "launch_s": s.launch_s, "efficiency": dict(e), "sources": list(s.sources),
            "provenance": spec_provenance(key), "fitted_on": [],
        },
        "topology": {"ranks_per_node": s.ranks_per_node},
        "compute": {
            "matmul_flops_per_s": {"float32": s.fp32_tflops * 1e12 * e["optimizer_matmul"],
                                   "bfloat16": s.bf16_tflops * 1e12 * e["optimizer_matmul"]},
            "eigh_flops_per_s": s.fp32_tflops * 1e12 * e["eigh_of_fp32_peak"],
            "memory_bytes_per_s": mem,
            "call_overhead_s": 5 * s.launch_s,
            "overlap": 1.0,
        },
        "adamw_seconds_per_element": ADAMW_BYTES_PER_ELEMENT / mem,
        "adamw_tensor_overhead_s": s.launch_s,
        "apply_seconds_per_element": APPLY_BYTES_PER_ELEMENT / mem,
        "apply_call_overhead_s": s.launch_s,
        "copy_seconds_per_byte": 2.0 / mem,
        "copy_call_overhead_s": s.launch_s,
        "model": {
            "dtype": "bfloat16",
            "forward": {"fixed_s": 1e-3, "layer_s": 2e-4, "flops_per_s": s.bf16_tflops * 1e12 * e["model_mfu"]},
            "backward": {"fixed_s": 1e-3, "layer_s": 4e-4, "flops_per_s": s.bf16_tflops * 1e12 * e["model_mfu"]},
        },
        "collectives": {
            "intra": level(s.nvlink_GBps, e["nvlink_busbw"], s.nvlink_latency_s),
            "inter": level(s.network_GBps, e["network_busbw"], s.network_latency_s),
        },
    }


SPEC_FILE_WIDTH = 110  # yaml.safe_dump's line width in the committed files


def spec_file_text(key: str) -> str:
    """``hardware/<key>.yaml`` as committed: a header saying what the file is and how to regenerate
    it, then `spec_hardware` as YAML."""
    header = (
        f"# Spec-derived hardware file ({key}): public datasheet peaks x the efficiency factors under\n"
        "# inputs.efficiency (canzona/hardware.py: SPECS, EFFICIENCY, SPEC_PROVENANCE, spec_hardware).\n"
        "# Not measured: replace with `python -m canzona.calibrate out=hardware/<name>.yaml` on the real\n"
        "# machine. inputs.provenance labels each number it rests on: datasheet (quoted under\n"
        "# inputs.sources), published (a measurement, named beside the number) or assumption;\n"
        "# inputs.fitted_on lists the published points its numbers were fitted on (empty: not fitted).\n"
        "# Rules: the docstring of canzona/hardware.py.\n"
        f"# Regenerate: python -c \"from canzona.hardware import write_spec_file; write_spec_file('{key}')\"\n"
    )
    return header + yaml.safe_dump(spec_hardware(key), sort_keys=False, width=SPEC_FILE_WIDTH)


def write_spec_file(key: str, directory: Path | None = None) -> Path:
    """Write ``<directory or hardware/>/<key>.yaml`` from `spec_file_text`; returns its path."""
    path = (directory or HARDWARE_DIR) / f"{key}.yaml"
    path.write_text(spec_file_text(key))
    return path


def _read_curve(pts: list[tuple[float, float]], work_s: float) -> float:
    """A [(work, wait), ...] curve at ``work_s``: linear between its points, flat outside them; 0 if empty."""
    if not pts:
        return 0.0
    if work_s <= pts[0][0]:
        return pts[0][1]
    for (w0, t0), (w1, t1) in zip(pts, pts[1:]):
        if work_s <= w1:
            return t0 + (t1 - t0) * (work_s - w0) / (w1 - w0) if w1 > w0 else t1
    return pts[-1][1]
