"""Where each global rank sits in the DP × TP grid: the one place that does rank arithmetic (pure).

Megatron lays out its groups with TP ranks contiguous (``initialize_model_parallel`` with no
pipeline or context parallelism): global rank = dp_rank · tp + tp_rank, so a TP group is a run
of ``tp`` consecutive ranks and a DP group takes every ``tp``-th rank. The lowering, the static
checks, the simulator, the dry run and the analysis all number ranks this way, so they must all
use `RankLayout` rather than repeat the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

# A group of ranks named by its axis and its index along the other axis: ("dp", tp_rank),
# ("tp", dp_rank) or ("world", 0).
GroupId = tuple[str, int]


@dataclass(frozen=True)
class RankLayout:
    """A DP × TP grid of ranks, TP ranks contiguous."""

    dp: int
    tp: int

    @property
    def world(self) -> int:
        return self.dp * self.tp

    def size(self, axis: str) -> int:
        """How many ranks an ``axis`` group (dp | tp | world) has."""
        if axis == "dp":
            return self.dp
        if axis == "tp":
            return self.tp
        if axis == "world":
            return self.world
        raise ValueError(f"unknown group axis {axis!r}; allowed: dp, tp, world")

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
        """(its id, its members) of the ``axis`` group (dp | tp | world) that ``rank`` is in."""
        d, t = self.coords(rank)
        if axis == "dp":
            return ("dp", t), self.dp_group(t)
        if axis == "tp":
            return ("tp", d), self.tp_group(d)
        return ("world", 0), list(range(self.world))

    def groups(self) -> dict[GroupId, list[int]]:
        """Every group by id: the DP groups, the TP groups, then the world."""
        out: dict[GroupId, list[int]] = {("dp", t): self.dp_group(t) for t in range(self.tp)}
        out.update({("tp", d): self.tp_group(d) for d in range(self.dp)})
        out[("world", 0)] = list(range(self.world))
        return out
