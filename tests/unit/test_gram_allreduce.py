"""TP strategy ``gram_allreduce`` (preset ``layerwise_sharded_gram``), megatron-core 0.19.2's
``muon_tp_mode=distributed``: the sharded Newton–Schulz maths, its refusal for optimizers that
need whole matrices, its program (the per-step all-reduces as Megatron makes them), the counting
pass and the simulator's price. Parity on process groups: tests/dist/test_gram_parity.py; against
Megatron's own code: tests/peers/test_gram_mirror.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from canzona.config import load_config
from canzona.cost import NumelCost
from canzona.errors import ConfigError
from canzona.optim.definitions import muon_flops, muon_gram_flops, muon_gram_share
from canzona.optim.newton_schulz import newton_schulz, newton_schulz_sharded
from canzona.plan.from_config import make_plan
from canzona.program.actions import GramCompute
from canzona.program.check import check_matching
from canzona.program.count import count_programs
from canzona.program.lower import lower
from canzona.sim.simulate import project

TINY = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1"]


def lockstep(shards: list[torch.Tensor], fn) -> list[torch.Tensor]:
    """``fn(shard, reduce)`` on every shard at once, one thread per shard, ``reduce`` summing over
    the threads in shard order (what an all-reduce over the shards' holders gives)."""
    n = len(shards)
    barrier, slots, out = threading.Barrier(n), [None] * n, [None] * n

    def run(r: int) -> None:
        def reduce(t: torch.Tensor) -> torch.Tensor:
            slots[r] = t.clone()
            barrier.wait()
            total = slots[0].clone()
            for s in slots[1:]:
                total += s
            barrier.wait()
            return t.copy_(total)

        out[r] = fn(shards[r], reduce)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("shape", [(96, 64), (64, 96)], ids=["tall", "wide"])
@pytest.mark.parametrize("dim", [0, 1], ids=["rows", "cols"])
@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_newton_schulz_is_newton_schulz_of_the_whole(shape, dim: int, tp: int) -> None:
    """In float64 the shards' iteration is the whole matrix's (Gram over the unsharded side; on a
    wide row-sharded or tall column-sharded matrix that is the long side, equal in exact
    arithmetic as (X Xᵀ) X = X (Xᵀ X)). Bound: entries of the normalised iterate are <= 1, so each
    Gram entry of either evaluation is within γ_k = k·2^-53/(1-k·2^-53) (k <= 96) of the exact
    one, about 1e-14; five quintic steps (Fréchet derivative <= 45 each at σ <= 1.2,
    canzona/optim/newton_schulz.py) cannot lift that past 45^5·1e-14 ≈ 2e-6, and in practice it
    stays near 1e-14: 1e-10 catches any missing, doubled or misplaced sum (an O(1) change)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    want = newton_schulz(x, dtype=torch.float64)
    got = lockstep(list(x.chunk(tp, dim=dim)),
                   lambda s, reduce: newton_schulz_sharded(s, dim, reduce, dtype=torch.float64))
    assert torch.allclose(torch.cat(got, dim=dim), want, rtol=0, atol=1e-10)
    alone = newton_schulz_sharded(x.chunk(tp, dim=dim)[0], dim, lambda t: t, dtype=torch.float64)
    assert not torch.allclose(alone, got[0], atol=1e-3), "a shard alone (Megatron's blockwise) is another update"


@pytest.mark.parametrize("optimizer", ["shampoo", "soap"])
def test_optimizers_that_need_whole_matrices_are_refused_in_one_line(optimizer: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config([*TINY, "parallel.tp=2", "method=layerwise_sharded_gram", f"optimizer={optimizer}"])
    assert "\n" not in str(e.value) and "method.tp=gram_allreduce" in str(e.value)
    load_config([*TINY, "parallel.tp=2", "method=layerwise_sharded_gram", "optimizer=adamw"])  # elementwise: local


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split_fused"])
def test_each_matrix_makes_megatrons_all_reduces(split: bool) -> None:
    """Per TP-sharded matrix a DP rank owns, one `GramCompute` whose calls are Megatron's: per
    (sub-)matrix one float32 all-reduce of one element (the norm), then one per step of the Gram
    product over the unsharded side (fc1, qkv: column-parallel, hidden²; proj, fc2: row-parallel,
    hidden²), in the Newton–Schulz dtype; the groups' calls match."""
    cfg = load_config([*TINY, "parallel.dp=2", "parallel.tp=2", "method=layerwise_sharded_gram",
                       "optimizer.ns_dtype=bfloat16", f"model.split_fused={str(split).lower()}"])
    plan = make_plan(cfg, device="cpu", cost_model=NumelCost())
    programs = lower(plan)
    assert not check_matching(programs)
    hidden = cfg.model_cfg().hidden
    seen = set()
    for prog in programs:
        grams = [a for a in prog.actions if isinstance(a, GramCompute)]
        for a in grams:
            (i,) = a.items
            seen.add(i)
            spec = plan.params[i]
            assert plan.dp_owner[i] == prog.dp_rank
            pieces = len(spec.subs) if spec.subs else 1
            assert a.grams == ((hidden,) * pieces,)
            want = [("all_reduce", "tp", 1, "float32")] + [("all_reduce", "tp", hidden**2, "bfloat16")] * 5
            assert [(c.op, c.axis, c.in_elems, c.dtype) for c in a.calls()] == want * pieces
        assert not any(type(a).__name__ in ("TpAllGather", "Compute") for a in prog.actions)
    assert seen == {i for i in range(len(plan.params)) if plan.uses_matrix_rule(i)}


def test_counting_pass_charges_the_shard_share_and_the_shard_state() -> None:
    """Each TP rank computes its shard's share of each matrix's cost (`muon_gram_share`: about
    1/TP, the u³ polynomial whole) and keeps its shard's momentum, where duplicated computes and
    keeps whole matrices; the elementwise params count the same under both."""
    base = [*TINY, "parallel.tp=2"]
    metrics, plans = {}, {}
    for method in ("layerwise_sharded", "layerwise_sharded_gram"):
        plans[method] = plan = make_plan(load_config([*base, f"method={method}"]), device="cpu",
                                         cost_model=NumelCost())
        metrics[method] = count_programs(plan, lower(plan))
    dup, gram = metrics["layerwise_sharded"], metrics["layerwise_sharded_gram"]
    plan = plans["layerwise_sharded_gram"]
    matrices = [i for i in range(len(plan.params)) if plan.uses_matrix_rule(i)]
    saved = sum(plan.cost[i] * (1 - muon_gram_share([s for _, s in plan.params[i].matrices], plan.params[i].tp_dim, 2))
                for i in matrices)
    assert 0 < saved < sum(plan.cost[i] for i in matrices) / 2
    assert dup.compute - gram.compute == pytest.approx(np.full((1, 2), saved))
    assert (dup.numel - gram.numel == sum(plan.params[i].numel for i in matrices) // 2).all()
    assert muon_gram_flops((4096, 1024), 0, 2) < muon_flops(4096, 1024)


def test_simulator_prices_the_shards_compute_and_every_all_reduce() -> None:
    """Toy hardware: a whole matrix's update costs 1 ms, a collective 0.1 ms of latency and
    nothing per byte. At TP 2 each of the layer's four matrices costs its shard's share of 1 ms
    (`muon_gram_share`) plus six blocking all-reduces; the gradient norm's all-reduce over TP
    adds one more latency."""
    from test_sim import MS, toy_hardware

    cfg = load_config([*TINY, "parallel.tp=2", "method=layerwise_sharded_gram"])
    res = project(cfg, toy_hardware(slope_s=MS, latency_s=0.1 * MS, bw=1e30))
    plan = make_plan(cfg, device="cpu", cost_model=NumelCost())
    shares = [muon_gram_share([s], p.tp_dim, 2) for p in plan.params if p.kind == "matrix" for _, s in p.matrices]
    assert len(shares) == 4
    assert res["optimizer_step_ms"] == pytest.approx(sum(shares) + 4 * 6 * 0.1 + 0.1, rel=1e-6)


def test_the_dp_side_is_layerwise_shardeds() -> None:
    """Megatron's TP mode does not change its layer-wise layout: the preset's buckets, shards and
    owners are `layerwise_sharded`'s (whose owners tests/unit/test_mirror_owners.py checks against
    megatron-core 0.19.2's code); only the TP mode differs."""
    over = ["model=qwen3-8b", "model.width_div=16", "model.num_layers=4", "parallel.dp=4", "parallel.tp=2",
            "bucket.size=3000000"]
    dup, gram = (make_plan(load_config([*over, f"method={m}"]), device="cpu", cost_model=NumelCost())
                 for m in ("layerwise_sharded", "layerwise_sharded_gram"))
    assert (gram.layout, gram.shard_ranges, gram.dp_owner) == (dup.layout, dup.shard_ranges, dup.dp_owner)
    assert (dup.tp_mode, gram.tp_mode) == ("duplicated", "gram")
    assert all(o is None for o in gram.tp_owner) and not any(gram.micro_groups)
