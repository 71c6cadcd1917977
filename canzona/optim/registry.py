"""The registered optimizers: the one list every other module reads optimizer names, config
options, flops, refresh costs, state sizes and calibration shapes from.

Adding an optimizer is writing one module that defines ``OPTIMIZER = OptimizerDef(...)`` (see
`canzona.optim.spec`) and adding it to `REGISTERED` below. The built-ins' descriptions are in
`canzona.optim.definitions`, which imports no torch; their rules are imported when first made. Nothing else lists optimizers: the
config section (`canzona.config.OptimizerSection`), its validation, the cost models and the
hardware descriptions all come from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from canzona.errors import ConfigError
from canzona.optim import definitions
from canzona.optim.spec import OptimizerDef, Option, Settings

if TYPE_CHECKING:
    from canzona.optim.rule import UpdateRule

REGISTERED: tuple[OptimizerDef, ...] = definitions.BUILT_IN
# Elementwise parameters (norms, biases, embeddings) always use this one.
ELEMENTWISE = definitions.ADAMW


def _by_name(defs: tuple[OptimizerDef, ...]) -> dict[str, OptimizerDef]:
    out: dict[str, OptimizerDef] = {}
    for d in defs:
        if d.name in out:
            raise ValueError(f"optimizer {d.name!r} is registered twice")
        out[d.name] = d
    return out


def merge_options(common: tuple[Option, ...], defs: tuple[OptimizerDef, ...]) -> tuple[Option, ...]:
    """Every key once, in order of first declaration; a key declared twice must agree on type
    and default (it is one flat config key)."""
    out: dict[str, Option] = {}
    for owner, options in [("common", common)] + [(d.name, d.options) for d in defs]:
        for o in options:
            seen = out.get(o.name)
            if seen is None:
                out[o.name] = o
            elif (seen.type, seen.default) != (o.type, o.default):
                raise ValueError(
                    f"optimizer option {o.name!r} of {owner} ({o.type}, default {o.default!r}) disagrees "
                    f"with an earlier declaration ({seen.type}, default {seen.default!r})"
                )
    return tuple(out.values())


BY_NAME = _by_name(REGISTERED)
NAMES: tuple[str, ...] = tuple(BY_NAME)
MATRIX_NAMES: tuple[str, ...] = tuple(d.name for d in REGISTERED if d.matrix)
# Keys every optimizer section has, whatever the optimizer.
COMMON_OPTIONS = (
    Option("name", str, "muon", "the optimizer of matrix parameters", choices=NAMES),
    Option("lr", float, 0.02, "learning rate of matrix parameters"),
    Option("weight_decay", float, 0.01, "decoupled weight decay (every parameter)"),
    Option("clip_grad", float, 1.0, "gradient-norm clipping inside the step (Megatron's --clip-grad); 0: off",
           minimum=0.0),
    Option("clip_norm_dtype", str, "float32", "the gradient norm's accumulation: float32 as Megatron's multi-tensor "
           "L2 norm, or float64, exact in any summation order (the parity tests' mode)", choices=("float32", "float64")),
)
OPTIONS: tuple[Option, ...] = merge_options(COMMON_OPTIONS, REGISTERED)


def get(name: str) -> OptimizerDef:
    """The definition of optimizer ``name`` (ConfigError naming the registered ones otherwise)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ConfigError(f"optimizer {name!r} is not registered; choose one of: {', '.join(NAMES)}") from None


def section_fields() -> list[tuple[str, Any, Any]]:
    """``(name, type, field)`` of every option, for `dataclasses.make_dataclass`."""
    return [o.dataclass_field() for o in OPTIONS]


def check_settings(settings: Settings) -> None:
    """ConfigError for the first option value that is not allowed (name, choices, bounds)."""
    for o in OPTIONS:
        message = o.problem(getattr(settings, o.name))
        if message:
            raise ConfigError(message)


def make_rule(opt: Settings, kind: str) -> UpdateRule:
    """The rule for parameters of ``kind``: "matrix" follows ``opt.name``, "adamw" is always AdamW."""
    if kind not in ("matrix", "adamw"):
        raise ValueError(f"kind={kind!r}; expected 'matrix' or 'adamw'")
    definition = ELEMENTWISE if kind == "adamw" else get(opt.name)
    return definition.make_rule(opt)


def learning_rate(opt: Settings, kind: str) -> float:
    """The lr the caller passes to `apply_update`: ``opt.lr`` for matrix rules, else ``opt.adamw_lr``."""
    if kind not in ("matrix", "adamw"):
        raise ValueError(f"kind={kind!r}; expected 'matrix' or 'adamw'")
    return opt.lr if kind == "matrix" and get(opt.name).matrix else opt.adamw_lr
