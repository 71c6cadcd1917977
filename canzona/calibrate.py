"""Calibrate a device profile on this machine: ``python -m canzona.calibrate out=profiles/NAME.yaml``.

Measures, with ``threads`` torch threads per process (default 1, as the local sweep's ranks):

- each matrix optimizer's update (Muon, Shampoo, SOAP via `canzona.optim`) per full matrix
  shape of the Qwen3 family -- the shapes of the local sweep first (read from
  sweeps/configs/qwen3_scaling.yaml), then the family scaled by ``width_divs``, then full-size
  shapes while the time budget lasts -- in the steady
  state (no preconditioner refresh) at batch 1 and, for small shapes, batch 4 (the executor
  batches equal shapes: a call costs overhead + count·slope), plus the refresh step where it is
  affordable (else scaled from the measured eigendecomposition rate);
- elementwise AdamW (per element and per tensor), the apply step, buffer copies, matmul rates;
- every collective the executors use (all_reduce, reduce_scatter, all_gather, all_to_all,
  broadcast, reduce) over gloo between 2 local processes at a few sizes, fitted to
  latency + volume / bandwidth, and how much async communication overlaps compute;
- forward / backward of the Qwen3 model (`canzona.model`) at a few small sizes, fitted to
  fixed + layers·per-layer + flops / rate (skipped with ``quick=true``: estimated from the
  matmul rate instead, marked so in the profile).

Keys: ``out=PATH`` (required), ``name=`` (default: the file stem), ``quick=true`` (~10 s, for
tests), ``budget_s=`` (optimizer timing budget, default 30; quick 3), ``threads=1``,
``width_divs=8,16,32``, ``optimizers=muon,shampoo,soap``, ``collectives=true``, ``model=true``.
Everything is written to one YAML file in the format of `canzona.sim.profile`;
`canzona.cost.load_measured` reads its ``updates`` table for ``canzona.cost=measured``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from canzona.errors import ConfigError
from canzona.inventory import QWEN3, build_inventory, model_config
from canzona.net import free_port
from canzona.sim.profile import COLLECTIVES, refresh_flops, steady_flops, volume

REPO = Path(__file__).resolve().parents[1]
# Fallback when sweeps/configs/qwen3_scaling.yaml cannot be read: its `local` profile's sizes.
LOCAL_SWEEP_MODELS = (("qwen3-0.6b", 8), ("qwen3-8b", 16))
DEFAULTS: dict[str, Any] = {
    "out": None, "name": None, "quick": False, "budget_s": None, "threads": 1, "width_divs": "8,16,32",
    "optimizers": "muon,shampoo,soap", "collectives": True, "model": None, "precondition_frequency": 10,
}


# ---------------------------------------------------------------------------------- arguments
def parse_args(argv: list[str]) -> dict[str, Any]:
    opts = dict(DEFAULTS)
    for a in argv:
        if "=" not in a:
            raise ConfigError(f"bad argument {a!r}; expected key=value (keys: {', '.join(DEFAULTS)})")
        k, v = a.split("=", 1)
        if k not in DEFAULTS:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(DEFAULTS)}")
        opts[k] = yaml.safe_load(v) if v else None
    if not opts["out"]:
        raise ConfigError("out=PATH is required, e.g. out=profiles/local.yaml")
    if opts["model"] is None:
        opts["model"] = not opts["quick"]
    for k in ("quick", "collectives", "model"):
        if not isinstance(opts[k], bool):
            raise ConfigError(f"{k}={opts[k]!r} must be true or false")
    opts["width_divs"] = [int(x) for x in str(opts["width_divs"]).split(",") if str(x).strip()]
    opts["optimizers"] = [x.strip() for x in str(opts["optimizers"]).split(",") if x.strip()]
    for o in opts["optimizers"]:
        if o not in ("muon", "shampoo", "soap"):
            raise ConfigError(f"optimizers: {o!r} is not one of muon, shampoo, soap")
    if opts["budget_s"] is None:
        opts["budget_s"] = 3.0 if opts["quick"] else 30.0
    opts["name"] = opts["name"] or Path(str(opts["out"])).stem
    return opts


# ---------------------------------------------------------------------------------- shapes
def _matrix_shapes(name: str, div: int, split: bool, into: list[tuple[int, int]]) -> None:
    try:
        cfg = model_config(name, div, 1)
    except ConfigError:  # this width_div does not divide the model
        return
    for p in build_inventory(cfg, split_fused=split):
        for _, shape in p.matrices if p.kind == "matrix" else ():
            if shape not in into:
                into.append(shape)


def local_sweep_models() -> list[tuple[str, int]]:
    """(model, width_div) of the local sweep's sizes (sweeps/configs/qwen3_scaling.yaml, profile
    ``local``, axis ``size``), so calibration always times the shapes the local trials use."""
    try:
        raw = yaml.safe_load((REPO / "sweeps" / "configs" / "qwen3_scaling.yaml").read_text())
        sizes = raw["profiles"]["local"]["grid"]["size"]
        out = [(str(v["model.name"]), int(v.get("model.width_div", 1))) for v in sizes.values()]
        return out or list(LOCAL_SWEEP_MODELS)
    except (OSError, KeyError, TypeError, ValueError, AttributeError, yaml.YAMLError):
        return list(LOCAL_SWEEP_MODELS)


def local_sweep_shapes() -> list[tuple[int, int]]:
    """The shapes of the local sweep's models: always timed, whatever the budget."""
    out: list[tuple[int, int]] = []
    for name, div in local_sweep_models():
        _matrix_shapes(name, div, False, out)
    return out


def calibration_shapes(width_divs: list[int]) -> list[tuple[int, int]]:
    """Full matrix shapes (as the optimizer sees them) in priority order, no repeats: the local
    sweep's, the other scaled models', their split (q/k/v, gate/up) shapes, then full-size
    shapes from the cheapest up (timed while the budget lasts)."""
    order = local_sweep_shapes()
    for split in (False, True):
        for div in width_divs:
            for name in QWEN3:
                _matrix_shapes(name, div, split, order)
    full: list[tuple[int, int]] = []
    for split in (False, True):
        for name in QWEN3:
            _matrix_shapes(name, 1, split, full)
    return order + sorted((s for s in full if s not in order), key=lambda s: steady_flops("muon", *s))


# ---------------------------------------------------------------------------------- timing helpers
def _solo(go: bool) -> bool:
    return go


def _best(fn, repeats: int, cap_s: float, sync=_solo) -> float:
    """Typical wall time of fn(): the median of up to `repeats` runs (stops early past cap_s in
    total). The median, not the minimum: trials run on a machine that is not quiet either.
    ``sync`` first lines the calibrating processes up, so that they time the work at once."""
    sync(True)
    times: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if sum(times) > cap_s:
            break
    return statistics.median(times)


def time_basics(quick: bool, sync=_solo) -> dict[str, float]:
    """Matmul rates, copies, AdamW and apply per element / per call."""
    import torch

    from canzona.optim.adamw import AdamW
    from canzona.optim.base import apply_update

    out: dict[str, float] = {}
    n = 384 if quick else 768
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    out["matmul_float32"] = 2 * n**3 / _best(lambda: a @ b, 5, 1.0, sync)
    ab, bb = a.bfloat16(), b.bfloat16()
    ab @ bb
    out["matmul_bfloat16"] = 2 * n**3 / _best(lambda: ab @ bb, 3, 1.0, sync)
    elems = (1 << 18) if quick else (1 << 20)
    x, y = torch.randn(elems), torch.randn(elems)
    t = _best(lambda: torch.cat([x, y]), 5, 0.5, sync)
    tiny = [torch.randn(64) for _ in range(32)]
    t_tiny = _best(lambda: [torch.cat([v, v]) for v in tiny], 5, 0.5, sync)
    out["copy_seconds_per_byte"] = t / (2 * elems * 4)
    out["copy_call_overhead_s"] = max(0.0, t_tiny / 32 - 2 * 64 * 4 * out["copy_seconds_per_byte"])
    rule = AdamW((0.9, 0.95), 1e-8)
    # three sets of (param, grad, state) used in turn, so that each call starts with cold caches
    sets = [(torch.randn(elems), torch.randn(elems), rule.init_state((elems,), "cpu", torch.float32)) for _ in range(3)]
    turn = [0]

    def adam_big() -> None:
        p, g, st = sets[turn[0] % 3]
        turn[0] += 1
        (d,) = rule.directions([g], [st], 2)
        apply_update(p, d, 1e-3, 0.01)

    ps = [torch.randn(64) for _ in range(32)]
    sts = [rule.init_state((64,), "cpu", torch.float32) for _ in ps]

    def adam_tiny() -> None:
        for q, d in zip(ps, rule.directions(ps, sts, 2)):
            apply_update(q, d, 1e-3, 0.01)

    out["adamw_seconds_per_element"] = _best(adam_big, 5, 1.0, sync) / elems
    out["adamw_tensor_overhead_s"] = max(0.0, _best(adam_tiny, 5, 0.5, sync) / 32 - 64 * out["adamw_seconds_per_element"])
    p, u = sets[0][0], torch.randn(elems)
    out["apply_seconds_per_element"] = _best(lambda: apply_update(p, u, 1e-3, 0.01), 5, 0.5, sync) / elems
    ut = torch.randn(64)
    t_ap = _best(lambda: [apply_update(q, ut, 1e-3, 0.01) for q in ps], 5, 0.5, sync)
    out["apply_call_overhead_s"] = max(0.0, t_ap / 32 - 64 * out["apply_seconds_per_element"])
    return out


def time_updates(optimizers: list[str], shapes: list[tuple[int, int]], budget_s: float, quick: bool,
                 freq: int, flops_rate: float, required: int = 0, sync=_solo) -> dict[str, Any]:
    """Per optimizer and shape: steady slope / overhead (batch 1 and 4) and refresh seconds; the
    first `required` shapes are timed even past the budget. ``sync(go) -> go`` agrees on every
    go / skip decision across the calibrating processes (and lines them up), so they time the
    same shapes at the same moments, as a trial's ranks run their steps."""
    from functools import partial

    import torch

    from canzona.optim.base import make_rule
    from canzona.optim.section import OptimizerSection

    per_shape_cap = 0.05 if quick else 0.5  # skip shapes whose one update would take longer
    small = 0.02  # below this, also time a batch of 4 to split per-call overhead from slope
    refresh_cap = 0.05 if quick else 0.6
    batched: dict[str, dict[str, dict[str, float]]] = {o: {} for o in optimizers}
    rules = {o: make_rule(OptimizerSection(name=o, precondition_frequency=freq), "matrix") for o in optimizers}
    overhead: dict[str, float] = {}
    eigh_samples: list[tuple[float, float]] = []  # (refresh flops, seconds)
    deadline = time.perf_counter() + budget_s

    def call(rule, grads, states, step, reps: int = 3) -> float:
        return _best(lambda: rule.directions(grads, states, step), reps, 0.3 * reps)

    def time_shape(o: str, m: int, n: int, reps: int) -> dict[str, float]:
        rule = rules[o]
        g1 = [torch.randn(m, n)]
        s1 = [rule.init_state((m, n), "cpu", torch.float32)]
        rule.directions(g1, s1, 2)  # warm up
        t1 = call(rule, g1, s1, 2, reps)
        if t1 < small:
            g4 = [torch.randn(m, n) for _ in range(4)]
            s4 = [rule.init_state((m, n), "cpu", torch.float32) for _ in range(4)]
            rule.directions(g4, s4, 2)
            t4 = call(rule, g4, s4, 2, reps)
            slope = max((t4 - t1) / 3, 0.25 * t1)
            ovh = min(max(t1 - slope, 0.0), t1)
        else:
            ovh = min(overhead[o], 0.5 * t1)
            slope = t1 - ovh
        return {"slope_s": slope, "overhead_s": ovh, "single_s": t1}

    for o, rule in rules.items():  # per-call overhead from a tiny matrix
        g = [torch.randn(8, 16)]
        st = [rule.init_state((8, 16), "cpu", torch.float32)]
        rule.directions(g, st, 2)
        overhead[o] = call(rule, g, st, 2)
    skipped = 0
    for k, (m, n) in enumerate(shapes):
        for o, rule in rules.items():
            est = steady_flops(o, m, n) / flops_rate
            go = k < required or (est <= per_shape_cap and time.perf_counter() <= deadline)
            if not sync(go):
                skipped += 1
                continue
            key = f"{m}x{n}"
            entry = time_shape(o, m, n, 5 if k < required else 3)
            if o != "muon":
                rf = refresh_flops(o, m, n)
                if sync(rf / (0.1 * flops_rate) <= refresh_cap and time.perf_counter() < deadline):
                    s_r = [rule.init_state((m, n), "cpu", torch.float32)]
                    if o == "soap":  # a valid basis for the power-iteration refresh
                        s_r[0]["Q_L"].copy_(torch.eye(m))
                        s_r[0]["Q_R"].copy_(torch.eye(n))
                        s_r[0]["L"].copy_(torch.eye(m))
                        s_r[0]["R"].copy_(torch.eye(n))
                    step = 1 if o == "shampoo" else 1 + freq
                    t_r = _best(partial(rule.directions, [torch.randn(m, n)], s_r, step), 2, 0.5)
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


def measure_compute(opts: dict[str, Any], sync=_solo) -> dict[str, Any]:
    """Basics and optimizer updates with ``threads`` threads in this process."""
    import torch

    torch.set_num_threads(int(opts["threads"]))
    basics = time_basics(bool(opts["quick"]), sync)
    upd = time_updates(opts["optimizers"], calibration_shapes(opts["width_divs"]), float(opts["budget_s"]),
                       bool(opts["quick"]), int(opts["precondition_frequency"]), basics["matmul_float32"],
                       len(local_sweep_shapes()), sync)
    return {"basics": basics, "updates": upd}


# ---------------------------------------------------------------------------------- collectives


MODEL_POINTS = (  # (model, width_div, layers, micro_batch, seq_len): around the local sweep's sizes
    ("qwen3-0.6b", 8, 1, 1, 32), ("qwen3-0.6b", 8, 2, 1, 32), ("qwen3-0.6b", 8, 4, 1, 32),
    ("qwen3-8b", 16, 2, 1, 32), ("qwen3-8b", 16, 4, 1, 32), ("qwen3-0.6b", 16, 2, 2, 64),
)


def _worker(rank: int, world: int, port: int, opts: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(opts["threads"]))
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world)})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # both ranks time the same compute at once: two busy ranks share caches and memory
        # bandwidth as a trial's ranks do
        def agree(go: bool) -> bool:
            flag = torch.tensor([1 if go else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            return bool(flag.item())

        result: dict[str, Any] = {"compute": measure_compute(opts, agree)}
        dist.barrier()
        if opts["collectives"]:
            result["collectives"] = _time_collectives(rank, world, bool(opts["quick"]))
            result["overlap"] = _time_overlap(bool(opts["quick"]))
        if opts["model"]:
            result["model"] = _time_model(rank)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _collective_ops(n: int, world: int) -> dict[str, tuple[Any, float]]:
    """kind -> (call, N bytes as `canzona.sim.profile.volume` expects) for an n-element buffer."""
    from functools import partial

    import torch
    import torch.distributed as dist

    x, shard, full = torch.randn(n), torch.empty(n // world), torch.empty(n)
    return {
        "all_reduce": (partial(dist.all_reduce, x), n * 4),
        "reduce_scatter": (partial(dist.reduce_scatter_single, shard, x), n * 4),
        "all_gather": (partial(dist.all_gather_single, full, shard), n * 4),
        "all_to_all": (partial(dist.all_to_all_single, full, x), n * 4 * (world - 1) / world),
        "broadcast": (partial(dist.broadcast, x, src=0), n * 4),
        "reduce": (partial(dist.reduce, x, dst=0), n * 4),
    }


def _time_collectives(rank: int, world: int, quick: bool) -> dict[str, list[list[float]]]:
    """kind -> [[N bytes, seconds], ...]: the mean over repeats (each after a barrier) on the
    slowest rank, after a warm-up round of every kind (gloo sets pairs up lazily). The mean, not
    the median: a step issues many collectives, so their expected time is what adds up, and
    small messages on a shared machine have a long tail."""
    import torch
    import torch.distributed as dist

    sizes = [256, 1 << 16, 1 << 20] if quick else [256, 1 << 14, 1 << 17, 1 << 20, 1 << 22]
    reps = 8 if quick else 12
    for fn, _ in _collective_ops(1 << 12, world).values():
        for _ in range(3):
            fn()
    samples: dict[str, list[list[float]]] = {k: [] for k in COLLECTIVES}
    for n in sizes:
        n -= n % world
        for kind, (fn, nbytes) in _collective_ops(n, world).items():
            fn()
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            t = torch.tensor([statistics.fmean(times)])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            samples[kind].append([float(nbytes), float(t)])
    return samples


def _time_overlap(quick: bool) -> dict[str, float]:
    """Compute alone, an all-reduce alone, and both (async comm issued first)."""
    import torch
    import torch.distributed as dist

    a = torch.randn(256, 256)
    reps = 20 if quick else 60
    buf = torch.randn(1 << 20)

    def compute() -> None:
        for _ in range(reps):
            a @ a

    def comm() -> None:
        dist.all_reduce(buf)

    def both() -> None:
        w = dist.all_reduce(buf, async_op=True)
        compute()
        w.wait()

    res = {}
    for name, fn in (("compute", compute), ("comm", comm), ("both", both)):
        fn()
        ts = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        t = torch.tensor([min(ts)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        res[name] = float(t)
    hidden = res["compute"] + res["comm"] - res["both"]
    res["overlap"] = float(min(1.0, max(0.0, hidden / max(1e-12, min(res["compute"], res["comm"])))))
    return res


def _time_model(rank: int) -> list[dict[str, Any]]:
    """Forward / backward seconds of the Qwen3 model (tp=1) at `MODEL_POINTS`, both ranks at once."""
    from canzona.model.data import synthetic_batch
    from canzona.model.parallel import init_parallel
    from canzona.model.qwen3 import build_model
    from canzona.sim.model import forward_flops

    init_parallel(1, "gloo")
    points = []
    for k, (name, div, layers, mb, seq) in enumerate(((*MODEL_POINTS[0],),) + MODEL_POINTS):
        mcfg = model_config(name, div, layers)
        model = build_model(mcfg, seed=0)
        fwd, bwd = [], []
        for step in range(7):
            tokens, labels = synthetic_batch(mcfg, mb, seq, 0, step, rank, 2)
            t0 = time.perf_counter()
            loss = model(tokens, labels)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            if step >= 2:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        if k == 0:
            continue  # the first model warms up the allocator and kernels
        points.append({"model": name, "width_div": div, "layers": layers, "micro_batch": mb, "seq_len": seq,
                       "flops": forward_flops(mcfg, 1, mb, seq), "forward_s": statistics.median(fwd),
                       "backward_s": statistics.median(bwd)})
    return points


def run_workers(opts: dict[str, Any]) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from canzona import calibrate as mod  # the importable module, also when run as __main__

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        mp.start_processes(mod._worker, args=(2, free_port(), opts, out), nprocs=2, join=True, start_method="spawn")
        return json.loads(Path(out).read_text())


# ---------------------------------------------------------------------------------- fits
def fit_link(kind: str, samples: list[list[float]], p: int = 2) -> dict[str, float]:
    """Relative least squares of seconds on (1, volume) -- each sample weighted by 1/seconds so the
    small sizes fix the latency and the large ones the bandwidth; both clamped positive."""
    vol = np.array([volume(kind, p, n) for n, _ in samples])
    t = np.array([s for _, s in samples])
    w = 1.0 / t
    A = np.stack([np.ones_like(vol), vol], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    if b <= 0:  # no bandwidth term visible: all latency
        b = 1e-12
    if a <= 0:
        a = float(t.min()) * 0.5
        b = max(1e-12, float(np.median((t - a) / np.maximum(vol, 1.0))))
    # the step latency of larger rings cannot be seen with 2 processes: assume one latency per step
    return {"latency_s": float(a), "step_latency_s": float(a), "bandwidth_Bps": float(1.0 / b)}


def fit_pass(points: list[dict[str, Any]], key: str, fallback_rate: float) -> dict[str, float]:
    """Fit ``seconds = fixed + layers·layer + flops/rate`` (non-negative coefficients)."""
    L = np.array([p["layers"] for p in points], dtype=float)
    F = np.array([p["flops"] for p in points], dtype=float)
    t = np.array([p[key] for p in points], dtype=float)
    if key == "backward_s":
        F = 2 * F
    cols = {"fixed": np.ones_like(L), "layer": L, "flops": F}
    active = list(cols)
    coef: dict[str, float] = {}
    while active:
        A = np.stack([cols[c] for c in active], axis=1)
        sol, *_ = np.linalg.lstsq(A, t, rcond=None)
        coef = dict(zip(active, sol))
        neg = [c for c in active if coef[c] < 0]
        if not neg:
            break
        active.remove(min(neg, key=lambda c: coef[c]))
    rate = 1.0 / coef["flops"] if coef.get("flops", 0) > 0 else fallback_rate
    return {"fixed_s": float(coef.get("fixed", 0.0)), "layer_s": float(coef.get("layer", 0.0)), "flops_per_s": float(rate)}


# ---------------------------------------------------------------------------------- the profile
def calibrate(opts: dict[str, Any], log=print) -> dict[str, Any]:
    import torch

    started = time.perf_counter()

    def stamp(what: str) -> None:
        log(f"  [{time.perf_counter() - started:5.1f} s] {what}")

    log(f"calibrating with {opts['threads']} thread(s){' (quick)' if opts['quick'] else ''} ...")
    workers: dict[str, Any] = {}
    if opts["collectives"] or opts["model"]:
        workers = run_workers(opts)
        compute = workers["compute"]
        stamp("compute (2 processes at once)" + (", collectives" if opts["collectives"] else "")
              + (", model" if opts["model"] else ""))
    else:
        compute = measure_compute(opts)
        stamp("compute (this process)")
    basics, upd = compute["basics"], compute["updates"]
    log(f"  matmul {basics['matmul_float32'] / 1e9:.1f} GFLOP/s fp32, AdamW {basics['adamw_seconds_per_element'] * 1e9:.2f} "
        f"ns/element; optimizer updates: {', '.join(f'{o} {len(t)} shapes' for o, t in upd['updates'].items())}")
    links = {}
    for kind in COLLECTIVES:
        s = (workers.get("collectives") or {}).get(kind)
        links[kind] = fit_link(kind, s) if s else {"latency_s": 1e-4, "step_latency_s": 1e-4, "bandwidth_Bps": 1e9}
    if workers.get("collectives"):
        log(f"  collectives (gloo, 2 processes): all_reduce {links['all_reduce']['latency_s'] * 1e6:.0f} us + "
            f"{links['all_reduce']['bandwidth_Bps'] / 1e9:.2f} GB/s")
    overlap = (workers.get("overlap") or {}).get("overlap", 0.0)
    mm = basics["matmul_float32"]
    model: dict[str, Any] = {"dtype": "float32"}
    if workers.get("model"):
        pts = workers["model"]
        model.update(source="measured", forward=fit_pass(pts, "forward_s", 0.5 * mm),
                     backward=fit_pass(pts, "backward_s", 0.5 * mm), points=pts)
        log(f"  model: forward {model['forward']['flops_per_s'] / 1e9:.1f} GFLOP/s + {model['forward']['layer_s'] * 1e3:.2f} ms/layer")
    else:
        model.update(source="estimated from the matmul rate (model=false or quick=true)",
                     forward={"fixed_s": 2e-3, "layer_s": 1.5e-3, "flops_per_s": 0.5 * mm},
                     backward={"fixed_s": 3e-3, "layer_s": 3e-3, "flops_per_s": 0.5 * mm})
    device = {
        "name": platform.processor() or platform.machine(), "kind": "cpu", "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": str(torch.__version__), "cores": os.cpu_count(),
        "threads": int(opts["threads"]), "python": platform.python_version(),
    }
    profile = {
        "name": opts["name"],
        "source": "calibrated",
        "description": f"calibrated on {device['host']} ({device['name']}, {device['cores']} cores) with "
                       f"{opts['threads']} thread(s) per process; collectives over gloo between 2 local processes",
        "device": device,
        "topology": {"ranks_per_node": None},
        "compute": {
            "matmul_flops_per_s": {"float32": mm, "bfloat16": basics["matmul_bfloat16"]},
            "eigh_flops_per_s": upd["eigh_flops_per_s"],
            "memory_bytes_per_s": 1.0 / basics["copy_seconds_per_byte"],
            "call_overhead_s": float(np.median(list(upd["update_overhead_s"].values()))) if upd["update_overhead_s"] else 0.0,
            "overlap": overlap,
        },
        "ns_dtype": "float32",
        "precondition_frequency": int(opts["precondition_frequency"]),
        "updates": upd["updates"],
        "batched": upd["batched"],
        "update_overhead_s": upd["update_overhead_s"],
        **{k: basics[k] for k in ("adamw_seconds_per_element", "adamw_tensor_overhead_s", "apply_seconds_per_element",
                                  "apply_call_overhead_s", "copy_seconds_per_byte", "copy_call_overhead_s")},
        "model": model,
        "collectives": {"intra": links},
        "calibration": {
            "quick": bool(opts["quick"]), "budget_s": float(opts["budget_s"]), "width_divs": opts["width_divs"],
            "compute_processes": 2 if workers else 1,
            "shapes_skipped": upd["skipped"], "shapes_retimed": upd.get("retimed", 0), "overlap_measurement": workers.get("overlap"),
            "collective_samples": workers.get("collectives"), "seconds": None,
        },
    }
    profile["calibration"]["seconds"] = round(time.perf_counter() - started, 1)
    return profile


def write_profile(profile: dict[str, Any], out: str | Path) -> Path:
    from canzona.records import atomic_write_text

    out = Path(out)
    header = (f"# Calibrated device profile, written by `python -m canzona.calibrate` on {profile['device']['host']} "
              f"at {profile['device']['date']}.\n# Format: canzona/sim/profile.py. `updates` is the table "
              "canzona.cost=measured reads (seconds per update of one matrix).\n")
    atomic_write_text(out, header + yaml.safe_dump(profile, sort_keys=False, width=110))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    try:
        opts = parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    profile = calibrate(opts)
    path = write_profile(profile, opts["out"])
    print(f"wrote {path} in {profile['calibration']['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
