"""Megatron's expert grid (`canzona.layout.ExpertLayout`): the EP, expert-DP and expert-TP groups
match megatron-core's own rank generator, and layouts it cannot take are one-line errors."""

from __future__ import annotations

import pytest

from canzona.errors import ConfigError
from canzona.layout import ExpertLayout, RankLayout

# (dp, tp, ep, etp): etp = tp and etp = 1, EP within DP and EP across TP groups
LAYOUTS = [(4, 1, 2, 1), (4, 2, 2, 2), (2, 2, 4, 1), (8, 2, 4, 2), (4, 4, 8, 1), (32, 1, 8, 1), (2, 1, 1, 1)]


@pytest.mark.parametrize(("dp", "tp", "ep", "etp"), LAYOUTS)
def test_groups_match_megatron_rank_generator(dp: int, tp: int, ep: int, etp: int) -> None:
    from megatron.core.parallel_state import RankGenerator

    lay = ExpertLayout.check(dp, tp, ep, etp)
    # initialize_model_parallel's expert generator: tp=etp, ep, dp=world/(etp*ep), default order
    gen = RankGenerator(tp=etp, ep=ep, dp=lay.edp, pp=1, cp=1, order="tp-cp-ep-dp-pp")
    groups = lay.groups()
    for axis, token in (("ep", "ep"), ("edp", "dp"), ("etp", "tp")):
        ours = sorted(members for (a, _), members in groups.items() if a == axis)
        assert ours == sorted(gen.get_ranks(token)), axis
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=1, cp=1, order="tp-cp-ep-dp-pp")
    assert sorted(RankLayout(dp, tp).dp_group(t) for t in range(tp)) == sorted(dense.get_ranks("dp"))


@pytest.mark.parametrize(("dp", "tp", "ep", "etp"), LAYOUTS)
def test_coords_and_rank_of_are_inverse(dp: int, tp: int, ep: int, etp: int) -> None:
    lay = ExpertLayout.check(dp, tp, ep, etp)
    assert lay.edp * lay.ep * lay.etp == lay.world == dp * tp
    assert [lay.rank_of(*lay.coords(r)) for r in range(lay.world)] == list(range(lay.world))
    for r in range(lay.world):
        d, e, t = lay.coords(r)
        assert r in lay.ep_group(d, t) and r in lay.edp_group(e, t) and r in lay.etp_group(d, e)


def test_expert_tp_equal_to_tp_keeps_tp_groups_and_splits_dp() -> None:
    lay, dense = ExpertLayout.check(8, 2, 4, 2), RankLayout(8, 2)
    assert lay.etp_group(0, 1) == dense.tp_group(1)
    # an EP group is ep consecutive DP ranks of one TP rank; expert-DP takes every ep-th DP rank
    assert lay.ep_group(1, 0) == [dense.rank_of(d, 0) for d in range(4, 8)]
    assert lay.edp_group(3, 1) == [dense.rank_of(d, 1) for d in (3, 7)]


@pytest.mark.parametrize(("args", "message"), [
    ((2, 1, 4, 1), "parallel.ep=4 does not divide dp*tp/etp=2*1/1=2"),
    ((4, 2, 8, 2), "parallel.ep=8 does not divide dp*tp/etp=4*2/2=4"),
    ((4, 4, 2, 2), "parallel.etp=2: expert TP is 1 or parallel.tp=4"),
    ((4, 1, 0, 1), "parallel.ep=0 must be a positive integer"),
])
def test_bad_layouts_are_one_line_errors(args: tuple[int, int, int, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")) as e:
        ExpertLayout.check(*args)
    assert "\n" not in str(e.value)
