"""The layer-wise mirrors' owners equal Megatron's (`canzona.plan.strategies.layerwise_sharded`).

Fast, always run: the rule on hand-derived cases (read off megatron-core 0.19.2's
``LayerWiseDistributedOptimizer._compute_per_buffer_param_layout`` and Megatron-LM main's, the
derivations in the comments), the bucket size recovered from the shared buffer, and the
strategies' plans holding those owners.

Slow, ``peers``: megatron-core 0.19.2's own code, run in the peers' Python 3.12 environment
(`canzona.peers.megatron_env.peer_python`), lays out every dense Qwen3 size at DP 8 and 32, TP 1
and 8, with Megatron's default and 4e8-element buckets; its owners (its ``_shard_params_from_layout``
on that layout, process-group rank stubbed), offsets and buckets must equal the mirror's. Its
functions are pure (shapes on the meta device, no CUDA, no process group).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from canzona.config import load_config
from canzona.cost import NumelCost
from canzona.inventory import QWEN3, build_inventory
from canzona.plan.buckets import build_layout
from canzona.plan.from_config import make_plan, plan_inputs
from canzona.plan.strategies.layerwise_sharded import (
    assign,
    bucket_size_of,
    carries_own_buffer,
    managed,
    own_buffer_layout,
    shard_aligned_buckets,
    shard_divisor,
)

DENSE = list(QWEN3)


def _owners(buckets, n: int) -> list[int | None]:
    out: list[int | None] = [None] * n
    for b in buckets:
        for k, _, _, s in b.members:
            out[k] = s
    return out


# ---------------------------------------------------------------- the rule, by hand
def test_019_rule_by_hand() -> None:
    # numels in registration order; backprop order walks k4 (200), k3, k2, k1, k0. DP 2: shards
    # are multiples of lcm(64, lcm(2, 128) / 2) = 64.
    # chunk 1: 200 (threshold max(4000, int(2*200*0.9))), +3000 (5400 > 3200), +3000: 6200 >= 5400,
    #   closed. LPT on numel, stable: k3 -> s0, k2 -> s1, k4 -> s0 at pad64(3000) = 3008. Widest
    #   3208 -> 3264; bucket [0, 6528).
    # chunk 2: 5000 (threshold 9000), +1000: 6000, the end. k1 -> s0, k0 -> s1; width 5056.
    got = shard_aligned_buckets([1000, 5000, 3000, 3000, 200], 4000, 2)
    assert [(b.start, b.end, b.shard) for b in got] == [(0, 6528, 3264), (6528, 16640, 5056)]
    assert [m[:3] for m in got[0].members] == [(3, 0, 3000), (4, 3008, 3208), (2, 3264, 6264)]
    assert [m[:3] for m in got[1].members] == [(1, 6528, 11528), (0, 11584, 12584)]
    assert _owners(got, 5) == [1, 0, 1, 0, 0]


def test_main_rule_deals_by_newton_schulz_cost_by_hand() -> None:
    # One bucket, DP 2; registration order A (64x4096), B (512x512), C, D (256x256); backprop
    # D, C, B, A. NS cost max*min^2: B 512^3; D, C, A all 2^24 (ties stay in backprop order).
    # Cap: (2*262144 + 2*65536) / 2 * 1.3 = 425984 elements per shard.
    # B -> s0 (both empty); D -> s1 (less cost); C -> s1 (2^24 < 2^27); A: s0 would hold 524288 >
    # cap, so s1 (393216). 0.19 deals by numel instead: B, A, D, C -> s0, s1, s0, s1.
    shapes = [(64, 4096), (512, 512), (256, 256), (256, 256)]
    numels = [m * n for m, n in shapes]
    main = shard_aligned_buckets(numels, None, 2, rule="main", shapes=shapes)
    assert _owners(main, 4) == [1, 0, 1, 1]
    assert [m[:3] for m in main[0].members] == [(1, 0, 262144), (3, 393216, 458752), (2, 458752, 524288),
                                               (0, 524288, 786432)]
    assert _owners(shard_aligned_buckets(numels, None, 2), 4) == [1, 0, 1, 0]


def test_padding_floor_keeps_a_dominant_param_with_company() -> None:
    # Backprop order starts with the 10^6-element param: with a 10-element bucket size the chunk
    # still closes only at int(0.9 x 4 x 10^6) elements, which the eight small ones never reach.
    got = shard_aligned_buckets([1000] * 8 + [1_000_000], 10, 4)
    assert len(got) == 1 and len(got[0].members) == 9
    # equal params: the floor int(0.9 x 4 x 1000) = 3600 beats a 2000-element bucket size, so a
    # chunk closes at its fourth param; at DP 1 (floor 900) at its second
    assert [len(b.members) for b in shard_aligned_buckets([1000] * 8, 2000, 4)] == [4, 4]
    assert [len(b.members) for b in shard_aligned_buckets([1000] * 8, 2000, 1)] == [2, 2, 2, 2]


def test_shard_divisor() -> None:
    assert shard_divisor(2) == 64 and shard_divisor(8) == 64 and shard_divisor(256) == 64
    assert shard_divisor(3) == 128  # lcm(3, 128) / 3 = 128
    assert shard_divisor(8, pad_for_high_nccl_busbw=True) == 8192  # 2^16 / 8


# ---------------------------------------------------------------- the harness's plans
@pytest.mark.parametrize("model", DENSE)
@pytest.mark.parametrize("dp", [8, 32])
@pytest.mark.parametrize("size", [None, 400_000_000])
def test_bucket_size_recovered_from_the_shared_buffer(model: str, dp: int, size: int | None) -> None:
    params = build_inventory(QWEN3[model])
    want = size if size is not None else max(40_000_000, 1_000_000 * dp)
    layout = build_layout(params, dp=dp, tp=1, bucket_size=want)
    got = bucket_size_of(layout, params)
    assert build_layout(params, dp=dp, tp=1, bucket_size=got) == layout
    if len(layout.buckets) > 1:  # a one-bucket layout needs no exact size (bucket_size_of)
        assert got == want
    idx = [i for i, p in enumerate(params) if managed(p)]
    numels = [params[i].local_numel(1) for i in idx]
    assert shard_aligned_buckets(numels, got, dp) == shard_aligned_buckets(numels, want, dp)


@pytest.mark.parametrize("method,rule", [("layerwise_sharded", "0.19"), ("layerwise_sharded_ns", "main")])
@pytest.mark.parametrize("dp,tp", [(8, 1), (4, 2)])
def test_plan_holds_megatrons_owners(method: str, rule: str, dp: int, tp: int) -> None:
    over = ["model=qwen3-8b", "model.width_div=16", "model.num_layers=4", f"parallel.dp={dp}", f"parallel.tp={tp}",
            "planner.cost=flops", "bucket.size=3000000"]
    cfg = load_config([*over, f"method={method}"])
    plan = make_plan(cfg)
    inputs = plan_inputs(cfg, NumelCost())  # the owners read no cost
    got = assign(inputs, rule)  # the bucket size recovered from the shared buffer
    assert got.owners == assign(inputs, rule, 3_000_000).owners
    # the AdamW params' owners depend on the buffer (module docstring), the matrices' do not
    assert plan.dp_owner == (own_buffer_layout(inputs, rule)[2] if carries_own_buffer() else got.owners)
    mine = [i for i, p in enumerate(inputs.params) if managed(p)]
    assert [inputs.params[i].kind for i in mine] == ["matrix"] * len(mine)
    numels = [inputs.params[i].local_numel(tp) for i in mine]
    shapes = [inputs.params[i].local_shape(tp) for i in mine]
    want = _owners(shard_aligned_buckets(numels, 3_000_000, dp, rule=rule, shapes=shapes), len(mine))
    assert [plan.dp_owner[i] for i in mine] == want
    assert all(o is not None and 0 <= o < dp for o in plan.dp_owner)
    if carries_own_buffer():  # Megatron's buffer: even collectives on its layer-wise buckets
        assert (plan.grad_reduce, plan.param_sync) == ("reduce_scatter", "shards")
        assert plan.layout == own_buffer_layout(inputs, rule)[0] != inputs.layout
    else:  # the shared buffer: all-reduce, padded gather of the owned params
        assert (plan.grad_reduce, plan.param_sync) == ("all_reduce", "owned_params")
        assert plan.layout == inputs.layout
    assert plan.tp_mode == ("duplicated" if tp > 1 else "local")
    assert len(set(want)) == dp  # every rank owns some matrix


@pytest.mark.parametrize("rule", ["0.19", "main"])
@pytest.mark.parametrize("model,dp,tp", [("qwen3-0.6b", 8, 1), ("qwen3-8b", 32, 8), ("qwen3-8b", 4, 2)])
def test_own_buffer_is_megatrons_two_buffers_in_one(rule: str, model: str, dp: int, tp: int) -> None:
    cfg = load_config([f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}", "method=layerwise_sharded"])
    inputs = plan_inputs(cfg, NumelCost())
    layout, ranges, owners = own_buffer_layout(inputs, rule)
    got = assign(inputs, rule)
    slots = [s for b in layout.buckets for s in b.params]
    assert sorted(s.index for s in slots) == list(range(len(inputs.params)))  # every param once
    assert all(s.numel == inputs.params[s.index].local_numel(tp) for s in slots)
    assert [b.start for b in layout.buckets] == [0] + [b.end for b in layout.buckets[:-1]]
    assert layout.numel == layout.buckets[-1].end
    managed_set = set(got.managed)
    aligned = 0
    for b, rr in zip(layout.buckets, ranges):
        cover = sorted(r for r in rr if r[1] > r[0])  # disjoint, covering the bucket
        assert cover[0][0] == b.start and cover[-1][1] == b.end
        assert all(x[1] == y[0] for x, y in zip(cover, cover[1:]))
        for s in b.params:  # each param whole inside its owner's shard
            a, e = rr[owners[s.index]]
            assert a <= s.start and s.end <= e
        if {s.index for s in b.params} <= managed_set:  # Megatron's layer-wise bucket: equal shards
            aligned += 1
            width = rr[0][1] - rr[0][0]
            assert all(rr[r] == (b.start + r * width, b.start + (r + 1) * width) for r in range(dp))
        else:
            assert not {s.index for s in b.params} & managed_set  # the buffers never mix
    assert aligned == len(got.buckets)
    assert [owners[i] for i in got.managed] == [got.owners[i] for i in got.managed]
    # buckets in the order their last gradient arrives: the first param (registration order) of
    # each is later than the next one's
    firsts = [min(s.index for s in b.params) for b in layout.buckets]
    assert firsts == sorted(firsts, reverse=True)


# ---------------------------------------------------------------- megatron-core 0.19.2's own code
PEER_SCRIPT = r"""
import json, sys, types, warnings
warnings.filterwarnings("ignore")
import torch
import megatron.core.optimizer.layer_wise_optimizer as lwo
from megatron.core.distributed import DistributedDataParallelConfig

lwo.get_pg_rank = lambda group: 0  # _shard_params_from_layout asks its own rank: any will do
out = []
for case in json.load(sys.stdin):
    dp = case["dp"]
    params = []
    for shape, emb in case["params"]:
        p = torch.nn.Parameter(torch.empty(shape, device="meta", dtype=torch.bfloat16))
        if emb:
            p.is_embedding_or_output_parameter = True
        params.append(p)
    lwo.tag_params_for_buffer_routing([types.SimpleNamespace(parameters=lambda: iter(params))])
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
    full = lwo.LayerWiseDistributedOptimizer.compute_full_param_layout(params, case["bucket_size"], dp, cfg)
    me = object.__new__(lwo.LayerWiseDistributedOptimizer)
    me.dp_cp = me.expt_dp = None  # the groups are only asked their rank (stubbed above)
    opt = types.SimpleNamespace(param_groups=[{"params": [p for p in params if p.is_managed_by_layer_wise_optimizer]}])
    me._shard_params_from_layout([opt], [full], dp, 1)
    owner = {id(p): s for s, ps in enumerate(me.dp_cp_params_list) for p in ps}
    (key,) = [k for k in full.layouts if k.is_managed_by_layer_wise_optimizer]
    lay = full.layouts[key]
    out.append({"owners": [owner.get(id(p)) for p in params],
                "index": [list(lay.param_index_map[p]) if id(p) in owner else None for p in params],
                "buckets": [list(b) for b in lay.bucket_indices]})
json.dump(out, sys.stdout)
"""


@pytest.mark.slow
@pytest.mark.peers
def test_owners_equal_megatron_019() -> None:
    from canzona.peers.megatron_env import peer_python

    cases, mine = [], []
    for model in DENSE:
        params = build_inventory(QWEN3[model])
        for dp in (8, 32):
            for tp in (1, 8):
                for size in (max(40_000_000, 1_000_000 * dp), 400_000_000):
                    cases.append({"dp": dp, "bucket_size": size, "params": [
                        [list(p.local_shape(tp)), p.name.startswith(("embedding.", "output_layer."))] for p in params]})
                    # the size the strategy recovers from the shared buffer, as a plan would
                    recovered = bucket_size_of(build_layout(params, dp=dp, tp=tp, bucket_size=size), params)
                    idx = [i for i, p in enumerate(params) if managed(p)]
                    got = shard_aligned_buckets([params[i].local_numel(tp) for i in idx], recovered, dp)
                    owners: list[int | None] = [None] * len(params)
                    index: list[list[int] | None] = [None] * len(params)
                    for b, bucket in enumerate(got):
                        for k, start, end, s in bucket.members:
                            owners[idx[k]], index[idx[k]] = s, [start, end, b]
                    mine.append(((model, dp, tp, size), owners, index, [[b.start, b.end] for b in got]))
    run = subprocess.run([str(peer_python()), "-c", PEER_SCRIPT], input=json.dumps(cases), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    theirs = json.loads(run.stdout)
    assert len(theirs) == len(mine) == 48
    for (case, owners, index, buckets), t in zip(mine, theirs):
        assert owners == t["owners"], case
        assert index == t["index"], case
        assert buckets == t["buckets"], case
