"""Projections held against published GPU measurements (``validation/published_points.yaml``).

Each point is a run someone else measured and published: the hardware file and the trial keys
that describe it here, the measured number, and what of that run the harness does not model.
`project_points` projects every point with the simulator (an ``iteration`` point through
`canzona.sim.simulate.project`; a ``newton_schulz`` point as one matrix's update on the
hardware file) and gives projected ÷ measured; `band` sums the ratios up per hardware file.
A point that cannot be projected stays in the table with its error: nothing is dropped.

No hardware file is fitted on these points (a file that is names them under ``fitted_on``, and
`band` then leaves them out of that file's band: fitting and checking points are kept apart).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from canzona import CHECKOUT
from canzona.errors import ConfigError

POINTS_FILE = CHECKOUT / "validation" / "published_points.yaml"
KINDS = ("iteration", "newton_schulz")


@dataclass(frozen=True)
class PointResult:
    id: str
    hardware: str
    follows: str
    metric: str
    measured: float
    projected: float | None
    not_modelled: tuple[str, ...]
    confidence: str
    source: str
    error: str | None = None
    fitted: bool = False  # the hardware file was fitted on this point: not a check of it
    dominated: bool = False  # what is not modelled is most of the measured time: shown, not counted
    baseline: str | None = None  # the AdamW run measured beside it (`pairs`)

    @property
    def ratio(self) -> float | None:
        return None if self.projected is None else self.projected / self.measured

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "not_modelled": list(self.not_modelled), "ratio": self.ratio}


def load_points(path: str | Path = POINTS_FILE) -> list[dict[str, Any]]:
    """The points of a points file, checked for the keys every point needs (one-line errors)."""
    try:
        points = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"points={path}: cannot read it ({e.strerror})") from None
    if not isinstance(points, list):
        raise ConfigError(f"points={path}: a points file is a list of points")
    for p in points:
        missing = [k for k in ("id", "source", "kind", "hardware", "config", "measured") if k not in p]
        if missing:
            raise ConfigError(f"points={path}: point {p.get('id', '?')!r} lacks {missing[0]!r}")
        if p["kind"] not in KINDS:
            raise ConfigError(f"points={path}: point {p['id']!r} has kind={p['kind']!r}; allowed: {', '.join(KINDS)}")
    return points


def _project_one(point: dict[str, Any], hw: Any) -> float:
    from canzona.config import load_config

    if point["kind"] == "newton_schulz":
        cfg = load_config(point["config"])
        m, n = point["shape"]
        return hw.update_seconds(cfg.optimizer.name, m, n, cfg.optimizer) * 1e3
    from canzona.sim.simulate import project

    cfg = load_config(point["config"])
    return float(project(cfg, hw, events="none")[point["measured"]["metric"]])


def project_points(path: str | Path = POINTS_FILE) -> list[PointResult]:
    """Every point projected beside its measurement (a failed projection: ``projected`` None and
    its ``error``); made once per process for a file of the same content (about 5 s)."""
    p = Path(path)
    return list(_project_points(str(p.resolve()), p.read_bytes() if p.is_file() else b""))


@functools.lru_cache(maxsize=4)
def _project_points(path: str, content: bytes) -> tuple[PointResult, ...]:
    from canzona.hardware import load_hardware

    out = []
    for p in load_points(path):
        projected, error, fitted = None, None, False
        try:
            hw = load_hardware(p["hardware"])
            fitted = p["id"] in (hw.raw.get("inputs", {}).get("fitted_on") or [])
            projected = _project_one(p, hw)
        except Exception as e:  # noqa: BLE001 - one point that cannot be projected must not hide the rest
            error = f"{type(e).__name__}: {e}"
        out.append(PointResult(p["id"], p["hardware"], p.get("follows", ""), p["measured"]["metric"],
                               float(p["measured"]["value"]), projected, tuple(p.get("not_modelled") or ()),
                               str(p.get("confidence", "")), p["source"], error, fitted,
                               bool(p.get("dominated_by_unmodelled")), p.get("baseline")))
    return tuple(out)


def pairs(results: list[PointResult]) -> list[dict[str, Any]]:
    """Each run measured beside a baseline run (same hardware, layout and container): the
    measured ratio run ÷ baseline, the projected one, and projected ÷ measured of the ratio --
    how far a projected *ratio*, what the report's speedups are, is off."""
    by_id = {r.id: r for r in results}
    out = []
    for r in results:
        b = by_id.get(r.baseline or "")
        if b is None or r.projected is None or b.projected is None:
            continue
        measured, projected = r.measured / b.measured, r.projected / b.projected
        out.append({"id": r.id, "baseline": b.id, "measured_ratio": measured, "projected_ratio": projected,
                    "check": projected / measured, "dominated": r.dominated or b.dominated})
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"points": 0}
    return {"points": len(values), "min": min(values), "median": statistics.median(values), "max": max(values)}


def band(results: list[PointResult]) -> dict[str, Any]:
    """Projected ÷ measured over the points that check (neither fitted on nor dominated by what
    is not modelled), overall and per hardware file, and the same for the ratios of `pairs`:
    ``{"points", "min", "median", "max", "by_hardware": {name: {...}}, "left_out": [ids],
    "ratios": {...}}``."""
    def counted(rs: list[PointResult]) -> list[float]:
        return [r.ratio for r in rs if r.ratio is not None and not r.fitted and not r.dominated]

    by_hw: dict[str, list[PointResult]] = {}
    for r in results:
        by_hw.setdefault(r.hardware, []).append(r)
    return {**_spread(counted(results)), "by_hardware": {k: _spread(counted(v)) for k, v in sorted(by_hw.items())},
            "left_out": [r.id for r in results if r.dominated or r.fitted],
            "ratios": _spread([p["check"] for p in pairs(results) if not p["dominated"]])}


def band_line(b: dict[str, Any]) -> str:
    """The band in one sentence, as reports state it."""
    if not b.get("points"):
        return "No published run could be projected."
    files = ", ".join(sorted(b["by_hardware"]))
    line = (f"{b['points']} published runs: projected within {b['min']:.2f}–{b['max']:.2f}× of measured "
            f"(median {b['median']:.2f}×), on the hardware files {files}")
    if b["left_out"]:
        line += f" ({len(b['left_out'])} more shown but not counted: what is not modelled dominates them)"
    r = b["ratios"]
    if r.get("points"):
        line += (f"; ratios of {r['points']} runs to the AdamW run measured beside them: projected within "
                 f"{r['min']:.2f}–{r['max']:.2f}× of measured")
    return line + "."


def print_table(results: list[PointResult]) -> None:
    print(f"{'point':52s} {'hardware':8s} {'metric':16s} {'measured':>9s} {'projected':>9s} {'ratio':>6s}")
    for r in results:
        proj = f"{r.projected:9.1f}" if r.projected is not None else f"{'-':>9s}"
        ratio = f"{r.ratio:6.2f}" if r.ratio is not None else f"{'-':>6s}"
        print(f"{r.id[:52]:52s} {r.hardware:8s} {r.metric:16s} {r.measured:9.1f} {proj} {ratio}")
        if r.error:
            print(f"    could not project: {r.error}")
        for n in r.not_modelled:
            print(f"    not modelled: {n}")
    ps = pairs(results)
    if ps:
        print(f"\n{'ratio to the AdamW run beside it':52s} {'measured':>9s} {'projected':>9s} {'check':>6s}")
        for p in ps:
            flag = "  (not counted: dominated by what is not modelled)" if p["dominated"] else ""
            print(f"{p['id'][:52]:52s} {p['measured_ratio']:9.3f} {p['projected_ratio']:9.3f} {p['check']:6.2f}{flag}")
    print(band_line(band(results)))
