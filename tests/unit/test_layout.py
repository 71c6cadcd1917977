"""`canzona.layout.RankLayout`: Megatron's rank order (TP ranks contiguous), pure."""

from __future__ import annotations

import pytest

from canzona.layout import RankLayout


def test_ranks_are_tp_contiguous() -> None:
    grid = RankLayout(dp=3, tp=2)
    assert grid.world == 6
    assert [grid.coords(r) for r in range(grid.world)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(grid.rank_of(*grid.coords(r)) == r for r in range(grid.world))
    assert grid.tp_group(2) == [4, 5] and grid.dp_group(1) == [1, 3, 5]


def test_groups_and_the_group_of_a_rank() -> None:
    grid = RankLayout(dp=2, tp=3)
    assert grid.groups() == {("dp", 0): [0, 3], ("dp", 1): [1, 4], ("dp", 2): [2, 5],
                             ("tp", 0): [0, 1, 2], ("tp", 1): [3, 4, 5], ("world", 0): [0, 1, 2, 3, 4, 5]}
    assert grid.group("dp", 4) == (("dp", 1), [1, 4])
    assert grid.group("tp", 4) == (("tp", 1), [3, 4, 5])
    assert grid.group("world", 4) == (("world", 0), list(range(6)))


def test_group_sizes_by_axis() -> None:
    grid = RankLayout(dp=4, tp=2)
    assert [grid.size(a) for a in ("dp", "tp", "world")] == [4, 2, 8]
    assert all(grid.size(axis) == len(grid.group(axis, 5)[1]) for axis in ("dp", "tp", "world"))
    with pytest.raises(ValueError, match="unknown group axis 'pp'"):
        grid.size("pp")


@pytest.mark.parametrize("dp,tp", [(1, 1), (4, 1), (1, 4), (8, 2)])
def test_every_rank_is_in_one_group_per_axis(dp: int, tp: int) -> None:
    grid = RankLayout(dp, tp)
    for axis in ("dp", "tp"):
        members = sorted(r for (a, _), g in grid.groups().items() if a == axis for r in g)
        assert members == list(range(dp * tp))
    assert all(r in grid.group(axis, r)[1] for r in range(dp * tp) for axis in ("dp", "tp", "world"))


def test_a_plan_knows_its_rank_layout() -> None:
    from canzona.config import load_config
    from canzona.plan.buckets import BufferLayout
    from canzona.plan.from_config import plan_settings
    from canzona.plan.types import PlanInputs

    inputs = PlanInputs(params=(), layout=BufferLayout((), 0, 4, 2), cost={}, cost_model="numel", matrix_optimizer=True,
                        settings=plan_settings(load_config([])))
    assert inputs.rank_layout == RankLayout(4, 2) and inputs.rank_layout.world == 8
