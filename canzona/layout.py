"""Where each global rank sits in the DP × TP grid: the one place that does rank arithmetic (pure).

Megatron lays out its groups with TP ranks contiguous (``initialize_model_parallel`` with no
pipeline or context parallelism): global rank = dp_rank · tp + tp_rank, so a TP group is a run
of ``tp`` consecutive ranks and a DP group takes every ``tp``-th rank. The lowering, the static
checks, the simulator, the dry run and the analysis all number ranks this way, so they must all
use `RankLayout` rather than repeat the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from canzona.errors import ConfigError

# A group of ranks named by its axis and its index along the other axis: ("dp", tp_rank),
# ("tp", dp_rank) or ("world", 0); an MoE model's expert groups ("ep", "edp", "etp": `ExpertLayout`).
GroupId = tuple[str, int]
EXPERT_AXES = ("ep", "edp", "etp")


@dataclass(frozen=True)
class RankLayout:
    """A DP × TP grid of ranks, TP ranks contiguous; with ``experts`` (an MoE model) also
    Megatron's expert grid over the same ranks, whose groups are axes ``ep``, ``edp``, ``etp``."""

    dp: int
    tp: int
    experts: ExpertLayout | None = None

    @property
    def world(self) -> int:
        return self.dp * self.tp

    @property
    def axes(self) -> tuple[str, ...]:
        """The group axes of this grid."""
        return ("dp", "tp", "world") + (EXPERT_AXES if self.experts is not None else ())

    def size(self, axis: str) -> int:
        """How many ranks an ``axis`` group (dp | tp | world; ep | edp | etp with experts) has."""
        if axis == "dp":
            return self.dp
        if axis == "tp":
            return self.tp
        if axis == "world":
            return self.world
        if axis in EXPERT_AXES and self.experts is not None:
            return getattr(self.experts, axis)
        raise ValueError(f"unknown group axis {axis!r}; allowed: {', '.join(self.axes)}")

    def rank_of(self, dp_rank: int, tp_rank: int) -> int:
        """The global rank at (``dp_rank``, ``tp_rank``)."""
        return dp_rank * self.tp + tp_rank

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp_rank, tp_rank) of global ``rank``."""
        return divmod(rank, self.tp)

    def dp_group(self, tp_rank: int) -> list[int]:
        """The ranks of the DP group holding TP rank ``tp_rank`` (one per DP rank, in order)."""
        return [self.rank_of(d, tp_rank) for d in range(self.dp)]

    def tp_group(self, dp_rank: int) -> list[int]:
        """The ranks of DP rank ``dp_rank``'s TP group (one per TP rank, in order)."""
        return [self.rank_of(dp_rank, t) for t in range(self.tp)]

    def group(self, axis: str, rank: int) -> tuple[GroupId, list[int]]:
        """(its id, its members) of the ``axis`` group (`axes`) that ``rank`` is in."""
        d, t = self.coords(rank)
        if axis == "dp":
            return ("dp", t), self.dp_group(t)
        if axis == "tp":
            return ("tp", d), self.tp_group(d)
        if axis == "world":
            return ("world", 0), list(range(self.world))
        if axis not in EXPERT_AXES or self.experts is None:
            raise ValueError(f"unknown group axis {axis!r}; allowed: {', '.join(self.axes)}")
        return self.experts.group(axis, rank)

    def groups(self) -> dict[GroupId, list[int]]:
        """Every group by id: the DP groups, the TP groups, the world, then any expert groups."""
        out: dict[GroupId, list[int]] = {("dp", t): self.dp_group(t) for t in range(self.tp)}
        out.update({("tp", d): self.tp_group(d) for d in range(self.dp)})
        out[("world", 0)] = list(range(self.world))
        if self.experts is not None:
            out.update(self.experts.groups())
        return out


def check_expert_sizes(ep: int, etp: int) -> None:
    """``parallel.ep`` and ``parallel.etp`` are positive integers, or a one-line ConfigError."""
    for key, value in (("parallel.ep", ep), ("parallel.etp", etp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a positive integer")


def check_expert_tp(tp: int, etp: int) -> None:
    """A one-line ConfigError unless expert TP is 1 or TP: the two grids the harness lays out
    (`ExpertLayout`) and builds (`canzona.model.qwen3.check_moe`)."""
    if etp not in (1, tp):
        raise ConfigError(f"parallel.etp={etp}: expert TP is 1 or parallel.tp={tp} (null: parallel.tp); other "
                          f"expert-TP sizes are not supported")


@dataclass(frozen=True)
class ExpertLayout:
    """Where each global rank sits in Megatron's expert grid, beside the dense DP × TP one.

    megatron-core's ``initialize_model_parallel`` (0.16, order ``tp-cp-ep-dp-pp``, no pipeline or
    context parallelism) builds a second rank generator for expert layers with TP = expert-TP
    (``expert_tensor_parallel_size``, default: TP), EP = ``expert_model_parallel_size`` and DP =
    the expert-data-parallel size ``world / (etp · ep)``; so

        global rank = etp_rank + etp · (ep_rank + ep · edp_rank)

    An EP group (the experts of a layer split over it, tokens dispatched all-to-all inside it)
    is ``ep`` ranks ``etp`` apart; an expert-DP group (the ranks holding the same experts, which
    reduce their gradients and share their optimizer work) is ``edp`` ranks ``etp · ep`` apart;
    an expert-TP group is ``etp`` consecutive ranks. With etp = tp an expert-TP group is a dense
    TP group and an EP group is ``ep`` consecutive DP ranks of one TP rank; with etp = 1 an EP
    group is ``ep`` consecutive global ranks, across TP groups. Only etp = 1 and etp = tp are
    taken (`check`).
    """

    dp: int
    tp: int
    ep: int
    etp: int

    @classmethod
    def check(cls, dp: int, tp: int, ep: int, etp: int) -> ExpertLayout:
        """The layout, or a one-line ConfigError naming the values that do not fit."""
        check_expert_sizes(ep, etp)
        check_expert_tp(tp, etp)
        if (dp * tp // etp) % ep:
            raise ConfigError(f"parallel.ep={ep} does not divide dp*tp/etp={dp}*{tp}/{etp}={dp * tp // etp} "
                              f"(Megatron's expert grid is etp x ep x expert-dp)")
        return cls(dp, tp, ep, etp)

    @property
    def world(self) -> int:
        return self.dp * self.tp

    @property
    def edp(self) -> int:
        """The expert-data-parallel size: world / (etp · ep)."""
        return self.world // (self.etp * self.ep)

    def rank_of(self, edp_rank: int, ep_rank: int, etp_rank: int) -> int:
        """The global rank at (``edp_rank``, ``ep_rank``, ``etp_rank``)."""
        return etp_rank + self.etp * (ep_rank + self.ep * edp_rank)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(edp_rank, ep_rank, etp_rank) of global ``rank``."""
        rest, etp_rank = divmod(rank, self.etp)
        edp_rank, ep_rank = divmod(rest, self.ep)
        return edp_rank, ep_rank, etp_rank

    def ep_group(self, edp_rank: int, etp_rank: int) -> list[int]:
        """The EP group at (``edp_rank``, ``etp_rank``): one rank per EP rank, in order."""
        return [self.rank_of(edp_rank, e, etp_rank) for e in range(self.ep)]

    def edp_group(self, ep_rank: int, etp_rank: int) -> list[int]:
        """The expert-DP group holding EP rank ``ep_rank``'s experts at expert-TP rank ``etp_rank``."""
        return [self.rank_of(d, ep_rank, etp_rank) for d in range(self.edp)]

    def etp_group(self, edp_rank: int, ep_rank: int) -> list[int]:
        """The expert-TP group at (``edp_rank``, ``ep_rank``)."""
        return [self.rank_of(edp_rank, ep_rank, t) for t in range(self.etp)]

    def group(self, axis: str, rank: int) -> tuple[GroupId, list[int]]:
        """(its id, its members) of the expert ``axis`` group (ep | edp | etp) ``rank`` is in,
        numbered as `groups` numbers them."""
        d, e, t = self.coords(rank)
        if axis == "ep":
            return ("ep", d * self.etp + t), self.ep_group(d, t)
        if axis == "edp":
            return ("edp", e * self.etp + t), self.edp_group(e, t)
        if axis == "etp":
            return ("etp", d * self.ep + e), self.etp_group(d, e)
        raise ValueError(f"unknown expert group axis {axis!r}; allowed: {', '.join(EXPERT_AXES)}")

    def groups(self) -> dict[GroupId, list[int]]:
        """Every expert group by id: ``("ep", edp_rank·etp + etp_rank)``, ``("edp", ep_rank·etp +
        etp_rank)`` and ``("etp", edp_rank·ep + ep_rank)``."""
        out: dict[GroupId, list[int]] = {}
        for d in range(self.edp):
            for t in range(self.etp):
                out[("ep", d * self.etp + t)] = self.ep_group(d, t)
        for e in range(self.ep):
            for t in range(self.etp):
                out[("edp", e * self.etp + t)] = self.edp_group(e, t)
        for d in range(self.edp):
            for e in range(self.ep):
                out[("etp", d * self.ep + e)] = self.etp_group(d, e)
        return out
