"""Which matrix shapes the calibration times, in priority order."""

from __future__ import annotations

from collections.abc import Iterable

import yaml

from canzona import CHECKOUT
from canzona.errors import ConfigError
from canzona.hardware import steady_flops
from canzona.inventory import QWEN3, build_inventory, model_config

SWEEP_FILE = CHECKOUT / "sweeps" / "configs" / "qwen3_scaling.yaml"
# Fallback when the sweep file cannot be read: its `local` profile's sizes.
LOCAL_SWEEP_MODELS = (("qwen3-0.6b", 8), ("qwen3-8b", 16))


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
        raw = yaml.safe_load(SWEEP_FILE.read_text())
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


def calibration_shapes(width_divs: Iterable[int]) -> list[tuple[int, int]]:
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
