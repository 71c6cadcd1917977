"""The method registry: DP strategies, TP strategies and the presets that name a pair of them.

A method is one DP strategy and one TP strategy (``method.dp=NAME method.tp=NAME``), or a preset
``method=NAME`` that sets both (an explicit ``method.dp`` / ``method.tp`` beside it wins). Adding
a strategy: write one module in `canzona.plan.strategies`, named as the strategy, with the
interface of its kind (`canzona.plan.types`: ``NAME``, ``RUNG``, and ``ELEMENTWISE_ONLY`` and
``candidates`` for DP, ``MODE`` and ``groups`` for TP), and list it below. Nothing downstream
branches on names: the `Plan` says what runs.

The authors' ablation ladder (Megatron-Canzona's README, ``muon-dp8-{DPasync}_{DPbal}-tp4-
{TPasync}_{TPbal}``) names a pair by its rungs: ``rung("zero1_atomic", "duplicated")`` is
``1_0-0_0``. Strategies that are not on it (``layerwise``, ``zero1``, ``local``) have no rung.
"""

from __future__ import annotations

from typing import NamedTuple

from canzona.errors import ConfigError
from canzona.optim import registry as optimizers
from canzona.peers import PEERS
from canzona.plan.strategies import (
    async_,
    async_balanced,
    balanced,
    ddp,
    duplicated,
    gram_allreduce,
    layerwise,
    layerwise_sharded,
    layerwise_sharded_ns,
    local,
    zero1,
    zero1_atomic,
)
from canzona.plan.types import DpStrategy, TpStrategy

DP_STRATEGIES: dict[str, DpStrategy] = {  # type: ignore[misc]
    m.NAME: m for m in (ddp, zero1_atomic, balanced, layerwise, zero1, layerwise_sharded, layerwise_sharded_ns)
}
TP_STRATEGIES: dict[str, TpStrategy] = {  # type: ignore[misc]
    m.NAME: m for m in (duplicated, async_, async_balanced, gram_allreduce, local)
}


class Preset(NamedTuple):
    dp_strategy: str
    tp_strategy: str
    summary: str


PRESETS: dict[str, Preset] = {
    "canzona": Preset("balanced", "async_balanced", "Canzona: cost-balanced DP shards, balanced TP micro-group pipeline"),
    "sync": Preset("ddp", "duplicated", "fully synchronous: every rank reduces every gradient and computes every update"),
    "layerwise": Preset("layerwise", "duplicated", "megatron-core 0.16.1's layer-wise optimizer: whole params dealt ping-pong by numel"),
    "adamw": Preset("zero1", "local", "the reference: Megatron's ZeRO-1 with AdamW everywhere"),
    "atomic": Preset("zero1_atomic", "duplicated", "the authors' default Muon run: whole-tensor ZeRO-1, TP sync"),
    "layerwise_sharded": Preset("layerwise_sharded", "duplicated",
                                "megatron-core 0.19's layer-wise optimizer: shard-aligned buckets, LPT on numel per bucket"),
    "layerwise_sharded_ns": Preset("layerwise_sharded_ns", "duplicated",
                                   "Megatron-LM main's layer-wise optimizer: shard-aligned buckets, Newton-Schulz-cost deal"),
    "layerwise_sharded_gram": Preset("layerwise_sharded", "gram_allreduce",
                                     "megatron-core 0.19's layer-wise Muon, muon_tp_mode=distributed: each TP rank "
                                     "orthogonalises its shard, Gram products all-reduced over TP"),
}
# Presets in the order tables list them (the reference last).
METHOD_ORDER = ("canzona", "atomic", "sync", "layerwise", "layerwise_sharded", "layerwise_sharded_ns",
                "layerwise_sharded_gram", "adamw")
# The authors' ladder, from the fully synchronous run to Canzona, one feature added per rung:
# (rung, the rung it adds to, the feature). Both orders of the two balances are on it.
LADDER = (
    ("0_0-0_0", None, None),
    ("1_0-0_0", "0_0-0_0", "ZeRO-1 whole-tensor ownership"),
    ("1_0-1_0", "1_0-0_0", "async TP micro-groups"),
    ("1_1-1_0", "1_0-1_0", "DP balance"),
    ("1_0-1_1", "1_0-1_0", "TP balance"),
    ("1_1-1_1", "1_1-1_0", "TP balance, after DP balance"),
)


def label(dp_strategy: str, tp_strategy: str) -> str:
    """The name a method shows: its preset's, else ``<dp>+<tp>``."""
    for name, p in PRESETS.items():
        if (p.dp_strategy, p.tp_strategy) == (dp_strategy, tp_strategy):
            return name
    return f"{dp_strategy}+{tp_strategy}"


def rung(dp_strategy: str, tp_strategy: str) -> str | None:
    """The authors' ladder name of a pair (``1_0-1_0``), None when either is not on the ladder."""
    a, b = DP_STRATEGIES[dp_strategy].RUNG, TP_STRATEGIES[tp_strategy].RUNG
    return f"{a}-{b}" if a and b else None


def pair_of(method: str) -> tuple[str, str] | None:
    """The (DP strategy, TP strategy) pair a method label names (a preset or ``<dp>+<tp>``),
    None if none."""
    if method in PRESETS:
        return PRESETS[method].dp_strategy, PRESETS[method].tp_strategy
    dp_strategy, plus, tp_strategy = str(method).partition("+")
    return ((dp_strategy, tp_strategy) if plus and dp_strategy in DP_STRATEGIES and tp_strategy in TP_STRATEGIES
            else None)


def method_rank(method: str) -> tuple[int, int, str]:
    """Sort key of a method label: canzona first, then the ladder from the fully synchronous
    rung up, the other pairs, layerwise, the peers (`canzona.peers`, after the mirrors; a TP
    mode in brackets, ``megatron_layerwise[duplicated]``, keeps its peer's place), the
    reference (adamw) last."""
    if method == "canzona":
        return (0, 0, method)
    if method == "adamw":
        return (4, 0, method)
    peer = method.split("[", 1)[0]
    if peer in PEERS:
        return (3, len(_LAYERWISE) + list(PEERS).index(peer), method)
    pair = pair_of(method)
    r = rung(*pair) if pair else None
    rungs = [name for name, _, _ in LADDER]
    if r in rungs:
        return (1, rungs.index(r), method)
    if method in _LAYERWISE:
        return (3, _LAYERWISE.index(method), method)
    return (2, 0, method)


# Megatron's layer-wise optimizers, oldest first (0.16, 0.19, main): ranked after the other pairs.
_LAYERWISE = ("layerwise", "layerwise_sharded", "layerwise_sharded_ns", "layerwise_sharded_gram")


def elementwise_only(dp_strategy: str) -> bool:
    """The DP strategy updates every param elementwise, whatever the optimizer (``zero1``)."""
    return bool(DP_STRATEGIES[dp_strategy].ELEMENTWISE_ONLY)


def resolve(name: str | None, dp_strategy: str | None, tp_strategy: str | None) -> tuple[str | None, str, str]:
    """(preset, DP strategy, TP strategy) from what was given: the preset fills in what
    ``method.dp`` / ``method.tp`` leave out; the result's preset is the one whose pair it is (None
    for other pairs)."""
    if name is not None and name not in PRESETS:
        raise ConfigError(f"method={name!r} is not a preset; choose one of: {', '.join(PRESETS)} "
                          f"(or give method.dp and method.tp)")
    preset = PRESETS[name] if name is not None else None
    dp_strategy = dp_strategy if dp_strategy is not None else (preset.dp_strategy if preset else None)
    tp_strategy = tp_strategy if tp_strategy is not None else (preset.tp_strategy if preset else None)
    for key, value, allowed in (("method.dp", dp_strategy, DP_STRATEGIES), ("method.tp", tp_strategy, TP_STRATEGIES)):
        if value is None:
            raise ConfigError(f"{key} is not set: give {key}=NAME ({', '.join(allowed)}) or a preset method=NAME")
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    assert dp_strategy is not None and tp_strategy is not None
    found = label(dp_strategy, tp_strategy)
    return (found if found in PRESETS else None), dp_strategy, tp_strategy


def check(dp_strategy: str, tp_strategy: str, matrix_optimizer: bool, tp_size: int, optimizer: str | None = None) -> None:
    """Refuse, in one line, the pairs that cannot run: an elementwise-only DP strategy with a TP
    strategy that gathers matrices, shard-local TP under a matrix optimizer at TP > 1, and
    Newton–Schulz on TP shards (``gram``) under a matrix ``optimizer`` that needs whole matrices
    (`canzona.optim.spec.OptimizerDef.tp_sharded`; not checked when ``optimizer`` is None)."""
    if elementwise_only(dp_strategy) and tp_strategy != "local":
        raise ConfigError(f"method.dp={dp_strategy} updates equal shards elementwise, so TP has no matrices to gather: "
                          f"method.tp={tp_strategy} is not allowed with it; use method.tp=local")
    if tp_strategy == "local" and matrix_optimizer and not elementwise_only(dp_strategy) and tp_size > 1:
        raise ConfigError(f"method.tp=local updates each TP shard on its own, which a matrix optimizer cannot do at "
                          f"parallel.tp={tp_size}; choose method.tp=duplicated, async or async_balanced "
                          f"(or optimizer.name=adamw)")
    if (TP_STRATEGIES[tp_strategy].MODE == "gram" and matrix_optimizer and optimizer is not None
            and not optimizers.get(optimizer).tp_sharded):
        raise ConfigError(f"method.tp={tp_strategy} runs Newton-Schulz on each TP shard through all-reduced Gram products, which "
                          f"only Muon's update is built from; optimizer.name={optimizer} needs whole matrices: choose "
                          f"method.tp=duplicated, async or async_balanced")
