"""Qwen3 MoE model with expert parallelism, on gloo ranks.

Megatron's expert groups equal `canzona.layout.ExpertLayout`'s; the model's params are the rank's
inventory (dense params and its EP rank's experts); its init and full views do not depend on
``ep``; each rank's loss and gradients under EP equal the single-process ep=1 model's on that
rank's rows; an EP rank whose experts get no tokens still gets (zero) gradients for them.

Layouts: world 2 (dp=2, ep=2), world 4 (dp=4, ep=2: expert-DP 2), world 4 (dp=2, tp=2, ep=2,
etp=1, sequence parallel: the EP groups are then the TP groups, each TP rank dispatching its half
of the sequence) and world 4 (dp=2, tp=2, ep=2, etp=2, sequence parallel: experts split over TP,
each EP group one TP rank of both DP ranks). The reference is every rank again at tp=1, ep=1 (the whole model on one rank)
on the same rows; an expert sees the tokens of every rank of its EP group, so its gradient is the
sum of the reference gradients of the distinct batches (DP ranks) of that EP group.

Tolerance (relative, fp32): the layouts compute the same fp32 arithmetic in other groupings only
(an expert's matmul over the rows of two ranks instead of one; attention heads, vocabulary and
experts' ffn split over TP; two ranks' gradients summed), so they differ by rounding: each dot
product of length n <= 64 (hidden) to 128 (tokens) is off by at most about n·2⁻²⁴ ≈ 8e-6
relative and typically sqrt(n)·2⁻²⁴ ≈ 7e-7, through two layers and the softmaxes. 1e-5 on the
loss and 2e-5 on each gradient's norm hold that with room (measured: at most 1e-7 and 3e-6),
while a wrong routing, a missing token or a gradient counted twice moves them by 1e-2 or more (the weights are far from the init,
`test_model.rich_weights`). Routing itself is the same on every layout: the router logits only
differ by rounding and no two of a token's top logits are that close here (a flipped choice
would show as a loss difference far above the tolerance).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_model import _assert_close_dicts, _rel, rich_weights

from canzona.inventory import build_inventory, model_config
from canzona.layout import ExpertLayout
from canzona.model.data import synthetic_batch
from canzona.plan.experts import local_experts

pytestmark = pytest.mark.slow

SEED = 4321
CFG = model_config("qwen3-30b-a3b", width_div=32, num_layers=2, num_experts=4, top_k=2)  # hidden 64, ffn 24
SEQ = 8  # even: sequence parallel at tp=2 splits it
MICRO = 2
LOSS_TOL = 1e-5
GRAD_TOL = 2e-5
# (dp, tp, ep, etp) of the EP runs per world size, and of the layouts only Megatron's groups are
# checked at (the dense defaults)
RUNS = {2: {"dp2_ep2": (2, 1, 2, 1)},
        4: {"dp4_ep2": (4, 1, 2, 1), "dp2_tp2_ep2_etp1": (2, 2, 2, 1), "dp2_tp2_ep2_etp2": (2, 2, 2, 2)}}
GROUPS_ONLY = {2: [(2, 1, 1, 1)], 4: [(4, 1, 1, 1), (2, 2, 1, 2)]}


def _groups(ctx) -> dict:
    ranks = dist.get_process_group_ranks
    return dict(coords=(ctx.edp_rank, ctx.ep_rank, ctx.etp_rank), sizes=(ctx.edp, ctx.ep, ctx.etp),
                ep=ranks(ctx.ep_group), edp=ranks(ctx.edp_group), etp=ranks(ctx.etp_group), dp=ranks(ctx.dp_group),
                dp_rank=ctx.dp_rank)


def _ep_run(ctx) -> dict:
    from full_tensors import full_grad_dict, init_full_state_dict, load_full_state_dict

    from canzona.model import build_model, full_state_dict

    model = build_model(CFG, seed=SEED, sequence_parallel=ctx.tp > 1)
    init = init_full_state_dict(CFG, SEED)
    full = full_state_dict(model)
    weights = rich_weights(CFG, SEED)
    load_full_state_dict(model, weights)
    back = full_state_dict(model)
    tok, lab = synthetic_batch(CFG, MICRO, SEQ, SEED, 0, dp_rank=ctx.dp_rank, dp=ctx.dp)
    loss = model(tok, lab)
    loss.backward()
    return dict(
        groups=_groups(ctx), names=[(n, tuple(p.shape)) for n, p in model.named_parameters()],
        init=list(full) == list(init) and all(torch.equal(full[k], init[k]) for k in init),
        roundtrip=list(back) == list(weights) and all(torch.equal(back[k], weights[k]) for k in weights),
        loss=loss.item(), grads=full_grad_dict(model),
        without_grad=[n for n, p in model.named_parameters() if p.grad is None],
    )


def _reference(rank: int, world: int) -> dict:
    """The whole model (tp=1, ep=1) on this rank's rows of a dp=world split."""
    from full_tensors import full_grad_dict, load_full_state_dict

    from canzona.model import build_model

    model = build_model(CFG, seed=SEED)
    load_full_state_dict(model, rich_weights(CFG, SEED))
    tok, lab = synthetic_batch(CFG, MICRO, SEQ, SEED, 0, dp_rank=rank, dp=world)
    loss = model(tok, lab)
    loss.backward()
    return dict(loss=loss.item(), grads=full_grad_dict(model))


def _empty_experts(ctx) -> dict[str, float]:
    """One MoE layer over the EP group routing every token to experts 0 and 1 (EP rank 0's):
    name -> max |grad| (-1 for no grad) on this rank."""
    from canzona.model.moe import MoELayer

    layer = MoELayer(CFG, torch.float32, ep=ctx.ep, ep_rank=ctx.ep_rank, ep_group=ctx.ep_group)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
        layer.router.weight.zero_()  # logits (2a, a, -a, -a), a = x[:, 0] > 0
        layer.router.weight[:, 0] = torch.tensor([2.0, 1.0, -1.0, -1.0])
    x = torch.randn(6, CFG.hidden, generator=torch.Generator().manual_seed(ctx.rank))
    x[:, 0] = x[:, 0].abs() + 0.1
    layer(x).square().sum().backward()
    return {n: -1.0 if p.grad is None else p.grad.abs().max().item() for n, p in layer.named_parameters()}


def _worker(rank: int, world: int) -> dict:
    from canzona.model import destroy_parallel, init_parallel

    out: dict = {"groups": []}
    for _dp, tp, ep, etp in GROUPS_ONLY[world]:
        out["groups"].append(_groups(init_parallel(tp, "cpu", 60.0, ep=ep, etp=etp)))
        destroy_parallel(process_group=False)
    for key, (_dp, tp, ep, etp) in RUNS[world].items():
        ctx = init_parallel(tp, "cpu", 60.0, ep=ep, etp=etp)
        out[key] = _ep_run(ctx)
        if key == "dp2_ep2":
            out["empty"] = _empty_experts(ctx)
        destroy_parallel(process_group=False)
    init_parallel(1, "cpu", 60.0)
    out["ref"] = _reference(rank, world)
    destroy_parallel()
    return out


@pytest.fixture(scope="module")
def results():
    from util import run_ranks  # the run_ranks fixture's function, once for the module

    return {world: run_ranks(_worker, world, timeout_s=150) for world in RUNS}


def _layouts():
    return [(world, key, sizes) for world, runs in RUNS.items() for key, sizes in runs.items()]


def test_expert_groups_equal_expert_layout(results):
    for world, runs in RUNS.items():
        checked = [*GROUPS_ONLY[world], *runs.values()]
        by_layout = [r["groups"] + [r[k]["groups"] for k in runs] for r in results[world]]
        for i, (dp, tp, ep, etp) in enumerate(checked):
            lay = ExpertLayout.check(dp, tp, ep, etp)
            for rank, got in enumerate(r[i] for r in by_layout):
                d, e, t = lay.coords(rank)
                assert got["coords"] == (d, e, t) and got["sizes"] == (lay.edp, ep, etp), (world, i, rank)
                assert got["ep"] == lay.ep_group(d, t), (world, i, rank)
                assert got["edp"] == lay.edp_group(e, t), (world, i, rank)
                assert got["etp"] == lay.etp_group(d, e), (world, i, rank)
                if ep == 1 and etp == tp:  # a dense run: EP groups of one, expert-DP groups the DP groups
                    assert got["ep"] == [rank] and got["edp"] == got["dp"], (world, i, rank)


@pytest.mark.parametrize(("world", "key", "sizes"), _layouts())
def test_params_are_the_rank_local_inventory(results, world, key, sizes):
    dp, tp, ep, etp = sizes
    inv = build_inventory(CFG, sequence_parallel=tp > 1)
    mine = local_experts(inv, ep)
    for r in results[world]:
        ep_rank = r[key]["groups"]["coords"][1]
        want = [(s.name, s.local_shape(tp if s.expert is None else etp))
                for i, s in enumerate(inv) if s.expert is None or i in mine[ep_rank]]
        assert r[key]["names"] == want
        assert r[key]["without_grad"] == []
        assert r[key]["init"] and r[key]["roundtrip"]  # full views: every expert, EP-independent values


@pytest.mark.parametrize(("world", "key", "sizes"), _layouts())
def test_loss_and_grads_equal_ep1(results, world, key, sizes):
    ranks = results[world]
    refs = [r["ref"] for r in ranks]
    for r in ranks:
        got, groups = r[key], r[key]["groups"]
        ref = refs[groups["dp_rank"]]
        assert abs(got["loss"] - ref["loss"]) <= LOSS_TOL * abs(ref["loss"]), (key, got["loss"], ref["loss"])
        batches = sorted({ranks[m][key]["groups"]["dp_rank"] for m in groups["ep"]})
        want = {}
        for s in build_inventory(CFG):
            if s.expert is None:
                want[s.name] = ref["grads"][s.name]
            else:  # an expert sees the tokens of its whole EP group
                want[s.name] = sum(refs[d]["grads"][s.name] for d in batches)
        _assert_close_dicts(got["grads"], want, GRAD_TOL, f"{key}: grads vs ep=1")
        expert = next(n for n in want if "experts" in n)
        if len(batches) > 1:  # the other rank's tokens really reach the expert
            assert _rel(got["grads"][expert], ref["grads"][expert]) > 1e-2


def test_moe_model_refusals():
    from canzona.errors import ConfigError
    from canzona.model.qwen3 import check_moe

    check_moe(CFG, 2, 2, 1, True)
    check_moe(model_config("qwen3-0.6b"), 2, 1, 2, False)  # dense: the expert grid's defaults are fine
    check_moe(CFG, 2, 2, 2, True)
    for args, match in [((2, 2, 1, False), "sequence_parallel"), ((4, 2, 2, True), r"parallel\.etp=2"),
                        ((1, 3, 1, False), r"parallel\.ep=3"), ((1, 1, 5, False), r"parallel\.etp=5")]:
        with pytest.raises(ConfigError, match=match):
            check_moe(CFG, *args)


def test_experts_without_tokens_get_zero_grads(results):
    r0, r1 = (r["empty"] for r in results[2])
    assert list(r0) == ["router.weight", "experts.linear_fc1.weight0", "experts.linear_fc1.weight1",
                        "experts.linear_fc2.weight0", "experts.linear_fc2.weight1"]
    assert list(r1) == [n.replace("weight0", "weight2").replace("weight1", "weight3") for n in r0]
    assert all(v > 0 for v in r0.values()), r0
    assert r1["router.weight"] > 0 and all(v == 0.0 for n, v in r1.items() if "experts" in n), r1
