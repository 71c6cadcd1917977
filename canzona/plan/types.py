"""The plan every method's planner returns and every executor consumes (plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from canzona.inventory import ParamSpec
from canzona.layout import ExpertLayout, RankLayout
from canzona.plan.buckets import BufferLayout
from canzona.plan.tp import MicroGroup

# How gradients are reduced over DP: reduce-scatter into the plan's shards, or all-reduce.
GradReduce = Literal["reduce_scatter", "all_reduce"]
# How updated params reach every DP rank: all-gather of the shards, a padded all-gather of
# whole owned params (layer-wise), or nothing (every rank computed everything).
ParamSync = Literal["shards", "owned_params", "none"]
# How TP-sharded matrices are updated: the micro-group pipeline (one owner per matrix),
# all-gather + redundant compute on every TP rank, each TP rank on its shard with Newton–Schulz's
# Gram products all-reduced over TP (Megatron's `distributed` Muon), or shard-local (elementwise rules).
TpMode = Literal["pipeline", "duplicated", "gram", "local"]


@dataclass(frozen=True)
class Execution:
    """The trial settings that shape how a plan runs (read by `canzona.program.lower` only), so
    that a plan alone says everything needed to lower it to per-rank programs. No defaults: each
    value comes from the trial's config (`canzona.plan.from_config.execution`), whose schema holds
    the defaults."""

    dp_collective: str  # uneven-shard DP collective: auto | padded | reduce_loop | coalesced | all_to_all
    overlap_grad_reduce: bool  # bucket reductions issued from backward hooks
    pipeline_depth: int  # micro-groups of gathers in flight ahead of the one computing
    dtype: str  # model parameters and activations: float32 or bfloat16 (fp32 main params)
    dtype_reason: str
    overlap_param_gather: bool  # parameter all-gather waited for in the next forward
    clip_grad: float  # gradient-norm clipping threshold; 0: off
    device: str  # the device kind the plan runs on (cpu | cuda)
    grad_accum: int  # micro-batches (forward + backward) per iteration
    clip_norm_dtype: str  # the norm's accumulation: float32 (Megatron) or float64 (exact)
    ns_dtype: str  # Muon's Newton–Schulz dtype: that of the Gram all-reduces of TP mode ``gram``
    ns_steps: int  # Muon's Newton–Schulz steps: one Gram all-reduce each under TP mode ``gram``
    step_barrier: bool  # every rank waits at a barrier before its step's timer starts (Megatron's timers)


class _Sized:
    """DP and TP sizes (and the rank grid) of anything holding a buffer ``layout``."""

    layout: BufferLayout

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def rank_layout(self) -> RankLayout:
        """Where each global rank sits (`canzona.layout`)."""
        return RankLayout(self.layout.dp, self.layout.tp)


@dataclass(frozen=True)
class PlanSettings:
    """The strategies' own knobs (from ``planner.*`` and ``dist.sync_variant``), nothing else; no
    defaults: `canzona.plan.from_config.plan_settings` takes them from the config's schema."""

    alpha: float  # balanced: 1 balances the optimizer's cost, 0 the shards' elements
    dp_variant: str  # balanced: exact per-bucket min-max split, or the paper's snap
    grouping: str  # async_balanced: how TP micro-groups are formed (`canzona.plan.tp`)
    capacity: float  # async_balanced: a group's most per TP rank, fraction of the ideal
    sync_variant: str  # ddp: all-reduce, or reduce-scatter + all-gather of gradients


@dataclass(frozen=True)
class PlanInputs(_Sized):
    """Everything a planner reads: shapes, the buffer layout, one cost per param and the
    strategies' settings. Built from a trial's config by `canzona.plan.from_config.plan_inputs`; the
    planners never see the config, a cost model or a clock."""

    params: tuple[ParamSpec, ...]
    layout: BufferLayout
    cost: dict[int, float]  # inventory index -> full-tensor update cost
    cost_model: str  # the cost model's name (measured, roofline, flops, numel)
    matrix_optimizer: bool  # the optimizer has a matrix rule (muon, shampoo, soap; not adamw)
    settings: PlanSettings


@dataclass(frozen=True)
class DpLayout:
    """What a DP strategy decides (one candidate of it)."""

    grad_reduce: GradReduce
    param_sync: ParamSync
    # per bucket, each DP rank's (start, end) range of the buffer; None: no shards (all-reduce)
    shard_ranges: tuple[tuple[tuple[int, int], ...], ...] | None
    # inventory index -> DP rank computing its update; None: every DP rank (ddp) or split
    # elementwise over the shards (zero1)
    dp_owner: tuple[int | None, ...]
    # TP owners a joint DP x TP balance chose, for a TP strategy that takes them
    tp_hint: dict[int, int] | None = None
    # a buffer of the strategy's own (its buckets, params' order and padding); None: the shared
    # one every method reduces (`PlanInputs.layout`). ``shard_ranges`` then index into it.
    layout: BufferLayout | None = None


class DpStrategy(Protocol):
    """What a DP strategy module provides (`canzona.plan.registry.DP_STRATEGIES`)."""

    NAME: str
    RUNG: str | None  # its name on the authors' ladder ("1_0"), None if it is not on it
    ELEMENTWISE_ONLY: bool  # every param gets the elementwise rule, whatever the optimizer

    def candidates(self, inputs: PlanInputs, tp_split: frozenset[int]) -> list[DpLayout]:
        """Candidate layouts; ``tp_split``: the matrices the TP strategy gives one TP owner each."""
        ...

    # with several candidates also: score(plan: Plan, inputs: PlanInputs) -> float, lower is better


class TpStrategy(Protocol):
    """What a TP strategy module provides (`canzona.plan.registry.TP_STRATEGIES`)."""

    NAME: str
    RUNG: str | None
    MODE: TpMode  # pipeline: micro-groups with one owner per matrix; duplicated; gram; local

    def groups(self, items: list[int], inputs: PlanInputs, hint: dict[int, int] | None) -> list[MicroGroup]:
        """One DP rank's micro-groups of ``items`` (its TP-sharded matrices, inventory order);
        ``hint``: TP owners a joint DP x TP balance chose, which a strategy may keep."""
        ...


@dataclass(frozen=True)
class Plan(_Sized):
    method: str  # the method's label: a preset's name (canzona, atomic, ...) or "<dp>+<tp>"
    params: tuple[ParamSpec, ...]
    layout: BufferLayout
    cost: dict[int, float]  # inventory index -> full-tensor update cost
    cost_model: str
    matrix_rule: bool  # False when every param gets the elementwise AdamW rule
    grad_reduce: GradReduce
    param_sync: ParamSync
    tp_mode: TpMode
    # Per bucket, each DP rank's (start, end) absolute range of the buffer (start == end: it
    # owns nothing there), when the DP update works on bucket shards (adamw, canzona; also
    # sync's zero1_gather variant). Ranges are disjoint and cover the bucket; canzona's may
    # come in any rank order, Megatron's equal shards come in rank order.
    shard_ranges: tuple[tuple[tuple[int, int], ...], ...] | None
    # inventory index -> DP rank computing its update; None: every DP rank computes it
    # (sync) or it is split elementwise over the shards (adamw).
    dp_owner: tuple[int | None, ...]
    # inventory index -> TP rank computing the full update; None: every TP rank (duplicated,
    # gram, replicated params, or shard-local elementwise updates).
    tp_owner: tuple[int | None, ...]
    # Per DP rank, the micro-groups its TP group runs (empty unless tp_mode == "pipeline").
    micro_groups: tuple[tuple[MicroGroup, ...], ...]
    plan_seconds: float = 0.0
    # how it runs: None on a plan straight from the planner (`canzona.plan.compose`), which does
    # not decide it; `canzona.plan.from_config.make_plan` adds the trial's (lowering needs it)
    execution: Execution | None = None
    # Where the costs came from (`planner.cost`): "measured: <calibration cache> (host, device,
    # torch, date)", "roofline: hardware/h100.yaml", ...
    cost_source: str = ""
    dp_strategy: str = ""  # `canzona.plan.registry.DP_STRATEGIES` name
    tp_strategy: str = ""  # `canzona.plan.registry.TP_STRATEGIES` name
    # An MoE model's expert matrices, planned on their own buffer over the expert-DP groups
    # (`ExpertPlan`); ``params`` above then holds the dense (non-expert) params only.
    experts: ExpertPlan | None = None

    @property
    def rank_layout(self) -> RankLayout:
        """Where each global rank sits (`canzona.layout`), with the expert grid of an MoE plan."""
        return RankLayout(self.layout.dp, self.layout.tp, self.experts.layout if self.experts is not None else None)

    @property
    def every_rank_updates_all(self) -> bool:
        """Every DP rank computes every update itself (sync): nothing to sync afterwards."""
        return self.param_sync == "none"

    @property
    def regathers_grads(self) -> bool:
        """Gradients are reduce-scattered, then all-gathered back in full (sync's zero1_gather)."""
        return self.every_rank_updates_all and self.grad_reduce == "reduce_scatter"

    @property
    def elementwise_on_shards(self) -> bool:
        """Elementwise updates run on each rank's flat shard of a bucket (ZeRO-1 AdamW), not on
        whole params: shards exist and no param has a DP owner."""
        return self.shard_ranges is not None and not self.every_rank_updates_all and all(
            o is None for o in self.dp_owner
        )

    def uses_matrix_rule(self, index: int) -> bool:
        return self.matrix_rule and self.params[index].kind == "matrix"


@dataclass(frozen=True)
class ExpertPlan:
    """The expert buffer's plan (`canzona.plan.experts`): per EP rank, a `Plan` of the experts it
    holds over its expert-data-parallel group (its ``dp`` is the expert-DP size, its ``tp`` the
    expert-TP size, its ``params`` that EP rank's expert matrices in inventory order), made by the
    same DP and TP strategies as the dense plan. Megatron keeps expert params in a buffer of
    their own, reduced over the expert-DP group with their own buckets (``bucket.expert_size``).
    Every expert-DP group of one EP rank (one per expert-TP rank) runs that EP rank's plan."""

    layout: ExpertLayout
    index: tuple[tuple[int, ...], ...]  # per EP rank: the inventory index of each of its plan's params
    plans: tuple[Plan, ...]  # per EP rank
    bucket_size: int
    plan_seconds: float = 0.0

    def computing_ranks(self, ep_rank: int, dp_owner: int | None, tp_owner: int | None) -> list[int]:
        """The global ranks that compute (a part of) an update of EP rank ``ep_rank``'s plan owned by
        expert-DP rank ``dp_owner`` and expert-TP rank ``tp_owner`` (None: every rank of that axis)."""
        lay = self.layout
        return [lay.rank_of(d, ep_rank, t)
                for d in (range(lay.edp) if dp_owner is None else (dp_owner,))
                for t in (range(lay.etp) if tp_owner is None else (tp_owner,))]
