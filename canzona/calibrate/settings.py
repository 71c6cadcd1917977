"""The calibration's command line: ``key=value`` settings, parsed by `canzona.overrides`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from canzona.errors import ConfigError
from canzona.hardware import SPECS
from canzona.optim import registry
from canzona.overrides import build, split_argv
from canzona.schema_doc import setting

OPTIMIZERS = registry.MATRIX_NAMES  # every registered matrix optimizer
DEVICES = ("auto", "cpu", "cuda")
SPEC_CHOICES = ("auto", "none", *SPECS)
NS_DTYPE_CHOICES = ("auto", "float32", "bfloat16")


@dataclass
class Settings:
    """What may be given on the command line (see the package docstring for each key)."""

    out: str | None = setting(None, "the hardware file to write (required), e.g. hardware/NAME.yaml")
    name: str | None = setting(None, "the hardware's name; null: the file stem")
    quick: bool = setting(False, "a quick calibration (under a minute on a 2-core CPU, a minute on a GPU): smaller budget, "
                                 "the model pass estimated from the matmul rate")
    budget_s: float | None = setting(None, "optimizer timing budget, seconds; null: 30 (quick: 3)")
    threads: int = setting(1, "torch threads per process (the local sweep's ranks use 1)")
    width_divs: str = setting("8,16,32", "the Qwen3 family scaled by these width divisors, timed after the "
                                         "local sweep's shapes")
    optimizers: str = setting("muon,shampoo,soap", "matrix optimizers to time, comma-separated")
    collectives: bool = setting(True, "time the collectives between 2 local processes")
    model: bool | None = setting(None, "time the model's forward / backward; null: unless quick")
    precondition_frequency: int = setting(10, "Shampoo / SOAP refresh interval the amortised costs assume")
    device: str = setting("auto", "the device timed: auto (the GPU when visible), cpu, cuda", choices=DEVICES)
    spec: str = setting("auto", "collectives to keep when there is nothing to measure between (one GPU): auto "
                                "(the device's name), none, or a spec", choices=SPEC_CHOICES)
    ns_dtype: str = setting("auto", "Newton-Schulz dtype Muon's updates are timed in: auto (bfloat16 on a GPU, as the "
                                    "GPU profiles and Megatron run it; float32 on a CPU, the option's default), "
                                    "float32, bfloat16", choices=NS_DTYPE_CHOICES)
    repeats: int = setting(1, "calibrate this many times in a row and keep, number by number, the median "
                              "(canzona.calibrate.repeat: a shared machine's rates move between minutes); "
                              "a measured sweep's own calibration of this machine takes 3")


@dataclass(frozen=True)
class Options:
    """The settings resolved: defaults that depend on ``quick`` filled in, lists split."""

    out: str
    name: str
    quick: bool
    budget_s: float
    threads: int
    width_divs: tuple[int, ...]
    optimizers: tuple[str, ...]
    collectives: bool
    model: bool
    precondition_frequency: int
    device: str  # auto | cpu | cuda (auto is resolved where torch is imported)
    spec: str
    ns_dtype: str = "auto"  # auto | float32 | bfloat16 (auto is resolved with the device: `ns_dtype_for`)
    repeats: int = 1

    def ns_dtype_for(self, device_kind: str) -> str:
        """The Newton-Schulz dtype Muon is timed in on a ``device_kind`` device."""
        if self.ns_dtype != "auto":
            return self.ns_dtype
        return "bfloat16" if device_kind == "cuda" else "float32"


def parse_args(argv: Sequence[str]) -> Options:
    """The command line as `Options`; every mistake is one `ConfigError` line."""
    s = build(Settings, split_argv(argv, usage="e.g. out=hardware/local.yaml quick=true").overrides,
              what="calibrate")
    if not s.out:
        raise ConfigError("out=PATH is required, e.g. out=hardware/local.yaml")
    width_divs = tuple(_ints("width_divs", s.width_divs))
    optimizers = tuple(x.strip() for x in s.optimizers.split(",") if x.strip())
    for o in optimizers:
        if o not in OPTIMIZERS:
            raise ConfigError(f"optimizers: {o!r} is not one of {', '.join(OPTIMIZERS)}")
    if s.device not in DEVICES:
        raise ConfigError(f"device={s.device!r}; allowed: {', '.join(DEVICES)}")
    if s.ns_dtype not in NS_DTYPE_CHOICES:
        raise ConfigError(f"ns_dtype={s.ns_dtype!r}; allowed: {', '.join(NS_DTYPE_CHOICES)}")
    if s.spec not in SPEC_CHOICES:
        raise ConfigError(f"spec={s.spec!r}; allowed: {', '.join(SPEC_CHOICES)}")
    if s.threads < 1 or s.precondition_frequency < 1:
        raise ConfigError(f"threads={s.threads} and precondition_frequency={s.precondition_frequency} must be >= 1")
    if s.repeats < 1:
        raise ConfigError(f"repeats={s.repeats} must be >= 1")
    budget = s.budget_s if s.budget_s is not None else (3.0 if s.quick else 30.0)
    if budget <= 0:
        raise ConfigError(f"budget_s={budget} must be positive")
    return Options(
        out=s.out, name=s.name or Path(s.out).stem, quick=s.quick, budget_s=float(budget), threads=s.threads,
        width_divs=width_divs, optimizers=optimizers, collectives=s.collectives,
        model=(not s.quick) if s.model is None else s.model, precondition_frequency=s.precondition_frequency,
        device=s.device, spec=s.spec, ns_dtype=s.ns_dtype, repeats=s.repeats,
    )


def _ints(key: str, text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{key}={text!r} must be comma-separated integers, e.g. 8,16,32") from None
    if any(v < 1 for v in out):
        raise ConfigError(f"{key}={text!r} must be positive integers")
    return out
