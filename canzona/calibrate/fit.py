"""Fitting the timings to the hardware file's models: links (latency + volume / bandwidth) and model
passes (fixed + layers·per-layer + flops / rate)."""

from __future__ import annotations

import numpy as np

from canzona.hardware import ring_steps, volume


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
    # the intercept is the whole latency of the p-process collective (an all-reduce's two ring
    # steps at p = 2); larger rings cannot be seen with p processes: assume each of their steps
    # takes as long as one of these
    step = float(a) / max(1, ring_steps(kind, p, ring=True))
    return {"latency_s": step, "step_latency_s": step, "bandwidth_Bps": float(1.0 / b)}


def fit_call_cpu(kind: str, samples: list[list[float]], p: int = 2) -> dict[str, float]:
    """``{"call_cpu_s", "call_cpu_s_per_byte"}``: relative least squares (as `fit_link`: the
    small sizes fix the constant, the large ones the slope) of the CPU seconds
    per call (`canzona.calibrate.comm.time_call_cpu`) on (1, volume), both non-negative (a
    negative slope is noise about a constant: the mean alone)."""
    vol = np.array([volume(kind, p, n) for n, _ in samples])
    cpu = np.array([max(0.0, c) for _, c in samples])
    w = 1.0 / np.maximum(cpu, 1e-9)
    A = np.stack([np.ones_like(vol), vol], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, cpu * w, rcond=None)
    if b < 0 or a < 0:
        a, b = (float(cpu.mean()), 0.0) if b < 0 else (0.0, float(cpu @ vol / max(vol @ vol, 1e-30)))
    return {"call_cpu_s": float(a), "call_cpu_s_per_byte": float(b)}


def fit_pass(points: list[dict], key: str, fallback_rate: float) -> dict[str, float]:
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
