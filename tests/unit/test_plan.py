"""The pure planner: ownership, cut positions, balance, determinism, CLI errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canzona.calibrate.cache import ENV as CACHE_ENV
from canzona.config import load_config
from canzona.cost import NumelCost
from canzona.errors import ConfigError
from canzona.inventory import QWEN3, ParamSpec, build_inventory, model_config, total_params
from canzona.plan import dp as dpmod
from canzona.plan.buckets import build_layout
from canzona.plan.critical_path import critical_path
from canzona.plan.from_config import make_plan, plan_inputs
from canzona.plan.tp import ROUND_SLACK, MicroGroup, schedule
from canzona.program.count import compute_metrics

METHODS = ["canzona", "sync", "layerwise", "adamw"]


def plan_for(*overrides: str):
    """A plan with a machine-independent cost model (``planner.cost=flops`` unless given): what a
    test checks of a plan must not depend on the CPU that runs it (measured costs do)."""
    given = any(o.startswith("planner.cost=") for o in overrides)
    return make_plan(load_config([*([] if given else ["planner.cost=flops"]), *overrides]))


# ---------------------------------------------------------------- inventory
@pytest.mark.parametrize(
    "name,published",
    [("qwen3-0.6b", 0.6), ("qwen3-1.7b", 1.7), ("qwen3-4b", 4.0), ("qwen3-8b", 8.2), ("qwen3-14b", 14.8), ("qwen3-32b", 32.8)],
)
def test_parameter_counts_round_to_published(name: str, published: float) -> None:
    n = total_params(build_inventory(model_config(name)))
    assert round(n / 1e9, 1) == published


def test_exact_count_from_public_config() -> None:
    c = QWEN3["qwen3-8b"]
    per_layer = (
        (c.heads + 2 * c.kv_heads) * c.head_dim * c.hidden
        + c.hidden * c.heads * c.head_dim
        + 3 * c.ffn * c.hidden
        + 2 * c.hidden
        + 2 * c.head_dim
    )
    expected = 2 * c.vocab * c.hidden + c.num_layers * per_layer + c.hidden
    assert total_params(build_inventory(model_config("qwen3-8b"))) == expected


def test_split_fused_sub_matrices_partition_rows() -> None:
    cfg = model_config("qwen3-8b", width_div=16, num_layers=1)
    for spec in build_inventory(cfg, split_fused=True):
        if not spec.subs:
            continue
        rows = np.concatenate([np.concatenate([np.arange(*b) for b in s.row_blocks]) for s in spec.subs])
        assert sorted(rows.tolist()) == list(range(spec.shape[0]))
        for s in spec.subs:
            assert sum(len(range(*b)) for b in s.row_blocks) == s.shape[0]


def test_width_scaling_keeps_aspect_ratios() -> None:
    full = build_inventory(model_config("qwen3-4b"))
    small = build_inventory(model_config("qwen3-4b", width_div=8, num_layers=2))
    by_name = {p.name: p for p in full}
    for p in small:
        if len(p.shape) == 2:
            f = by_name[p.name].shape
            assert f[0] * p.shape[1] == f[1] * p.shape[0]


@pytest.mark.parametrize("tp,padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_another_tokenizer_is_padded_as_megatron_pads_it(tp: int, padded: int) -> None:
    """GPT-2's 50257 tokens padded to a multiple of 128 x TP (Megatron's
    _vocab_size_with_padding with --make-vocab-size-divisible-by 128)."""
    cfg = load_config(["model=qwen3-8b", "model.vocab=50257", f"parallel.tp={tp}"]).model_cfg()
    assert cfg.vocab == padded and cfg.vocab % tp == 0
    assert cfg.name == "qwen3-8b/v50257"
    emb = build_inventory(cfg)[0]
    assert emb.shape == (padded, 4096) and emb.local_numel(tp) == padded * 4096 // tp


def test_tying_the_output_layer_removes_it_and_shows_in_the_name() -> None:
    untied = load_config(["model=qwen3-8b"]).model_cfg()
    tied = load_config(["model=qwen3-8b", "model.tied_embeddings=true"]).model_cfg()
    assert (untied.name, tied.name) == ("qwen3-8b", "qwen3-8b/tied")
    names = {p.name for p in build_inventory(untied)} - {p.name for p in build_inventory(tied)}
    assert names == {"output_layer.weight"}
    # restating the model's own tying changes nothing, not even the name
    assert load_config(["model=qwen3-0.6b", "model.tied_embeddings=true"]).model_cfg() == model_config("qwen3-0.6b")
    small = load_config(["model=qwen3-4b", "model.tied_embeddings=false", "model.vocab=50257",
                         "model.width_div=8", "model.num_layers=2"]).model_cfg()
    assert small.name == "qwen3-4b/w8l2/v50257/untied" and small.vocab == 50304 // 8


@pytest.mark.parametrize("override,message", [
    ("model.vocab=0", "model.vocab=0 must be a positive integer"),
    ("model.vocab=-5", "model.vocab=-5 must be a positive integer"),
])
def test_bad_vocabulary_is_a_one_line_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(["model=qwen3-8b", override])


def test_sequence_parallel_makes_the_hidden_norms_gradients_partial() -> None:
    """With sequence parallelism a TP rank's norms see only its slice of the sequence: their
    gradients are summed over TP like the q/k norms'; the plan says so, and only with TP."""
    partial = {p.name.split(".")[-2] for p in plan_inputs(load_config(
        ["model=qwen3-0.6b", "model.num_layers=2", "parallel.tp=2", "parallel.sequence_parallel=true"]),
        NumelCost()).params
        if p.tp_grad_allreduce}
    assert partial == {"input_layernorm", "q_layernorm", "k_layernorm", "pre_mlp_layernorm", "final_layernorm"}
    for extra in (["parallel.tp=2"], ["parallel.sequence_parallel=true"]):
        cfg = load_config(["model=qwen3-0.6b", "model.num_layers=2", *extra])
        assert {p.name.split(".")[-2] for p in plan_inputs(cfg, NumelCost()).params if p.tp_grad_allreduce} == {"q_layernorm", "k_layernorm"}
    with pytest.raises(ConfigError, match="parallel.tp=4 must divide train.seq_len=130"):
        load_config(["model=qwen3-0.6b", "parallel.tp=4", "parallel.sequence_parallel=true", "train.seq_len=130"])


# ---------------------------------------------------------------- layout
def test_layout_matches_megatron_rules() -> None:
    params = build_inventory(model_config("qwen3-0.6b", width_div=4, num_layers=4))
    layout = build_layout(params, dp=3, tp=2, bucket_size=200_000)
    seen = []
    for b in layout.buckets:
        assert b.numel % np.lcm(3, 128) == 0
        for s in b.params:
            assert s.start % 64 == 0 and s.numel == params[s.index].local_numel(2)
            seen.append(s.index)
        # a bucket closes at the first param that reaches the size
        assert all(s.end - b.start < 200_000 for s in b.params[:-1])
    assert seen == list(reversed(range(len(params))))


# ---------------------------------------------------------------- plans
def _ownership_counts(plan) -> dict[int, int]:
    """How many (dp, tp) ranks compute each matrix's full update."""
    counts = {}
    for i in range(len(plan.params)):
        if not plan.uses_matrix_rule(i):
            continue
        dps = 1 if plan.dp_owner[i] is not None else plan.dp
        tps = 1 if plan.tp_owner[i] is not None or plan.tp_mode == "local" else plan.tp
        counts[i] = dps * tps
    return counts


@pytest.mark.parametrize("dp,tp", [(1, 1), (4, 1), (2, 2), (8, 4), (3, 2)])
def test_canzona_owns_every_matrix_exactly_once(dp: int, tp: int) -> None:
    plan = plan_for("model=qwen3-1.7b", "model.width_div=4", f"parallel.dp={dp}", f"parallel.tp={tp}")
    counts = _ownership_counts(plan)
    assert counts and all(c == 1 for c in counts.values())
    if tp > 1:
        for i in counts:
            assert plan.tp_owner[i] is not None and 0 <= plan.tp_owner[i] < tp
        grouped = [i for groups in plan.micro_groups for g in groups for i in g.items]
        assert sorted(grouped) == sorted(counts)


def test_sync_and_layerwise_redundancy() -> None:
    sync = plan_for("model=qwen3-1.7b", "model.width_div=4", "parallel.dp=4", "parallel.tp=2", "method=sync")
    assert set(_ownership_counts(sync).values()) == {8}
    lw = plan_for("model=qwen3-1.7b", "model.width_div=4", "parallel.dp=4", "parallel.tp=2", "method=layerwise")
    assert set(_ownership_counts(lw).values()) == {2}  # one DP owner, duplicated over TP
    assert compute_metrics(sync).compute_imbalance == pytest.approx(8.0, rel=0.01)


@pytest.mark.parametrize("method", ["canzona", "adamw"])
@pytest.mark.parametrize("dp", [2, 5, 16])
def test_shards_cover_each_bucket_exactly_and_cut_only_at_param_starts(method: str, dp: int) -> None:
    plan = plan_for("model=qwen3-0.6b", "model.width_div=8", f"parallel.dp={dp}", f"method={method}")
    for bucket, ranges in zip(plan.layout.buckets, plan.shard_ranges):
        covered = sorted((a, b) for a, b in ranges if b > a)
        assert covered[0][0] == bucket.start and covered[-1][1] == bucket.end
        assert all(x[1] == y[0] for x, y in zip(covered, covered[1:]))
        if method == "canzona":
            allowed = set(dpmod.boundaries(bucket))
            assert all(a in allowed and b in allowed for a, b in covered)
    if method == "canzona":
        dpmod.owners_from_ranges(plan.layout, plan.shard_ranges)  # asserts no param is cut


def test_plan_is_deterministic_across_processes() -> None:
    code = (
        "import json,sys;from canzona.config import load_config;from canzona.plan.from_config import make_plan;"
        "p=make_plan(load_config(sys.argv[1:]));"
        "print(json.dumps([p.shard_ranges,p.dp_owner,p.tp_owner,[[g.items for g in gs] for gs in p.micro_groups]]))"
    )
    args = ["model=qwen3-8b", "parallel.dp=16", "parallel.tp=4"]
    outs = {
        subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": str(seed), "PATH": "", CACHE_ENV: os.environ[CACHE_ENV]}).stdout
        for seed in (0, 1, 2)
    }
    assert len(outs) == 1


def test_canzona_never_worse_than_atomic() -> None:
    for model in ("qwen3-0.6b", "qwen3-8b", "qwen3-32b"):
        for dp in (4, 16, 64):
            plan = plan_for(f"model={model}", f"parallel.dp={dp}")
            atomic = dpmod.ranges_from_cuts(dpmod.atomic_cuts(plan.layout))
            loads = np.zeros(dp)
            for i, r in dpmod.owners_from_ranges(plan.layout, atomic).items():
                loads[r] += plan.cost[i]
            atomic_imb = loads.max() / loads.mean()
            assert compute_metrics(plan).compute_imbalance <= atomic_imb + 1e-9


def _plain_lpt_imbalance(plan) -> float:
    """LPT over the same work on dp*tp bins with no layout constraint."""
    tp = plan.tp
    items = []
    for i, spec in enumerate(plan.params):
        if plan.uses_matrix_rule(i):
            items.append(plan.cost[i])
        elif spec.tp_dim is not None:
            items += [plan.cost[i] / tp] * tp
        else:
            items += [plan.cost[i]] * tp  # replicated over TP: every TP rank computes it
    owner = dpmod.lpt(items, plan.dp * tp)
    loads = np.zeros(plan.dp * tp)
    for w, o in zip(items, owner):
        loads[o] += w
    return loads.max() / (sum(plan.cost.values()) / (plan.dp * tp))


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-14b", "qwen3-32b"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("dp", [8, 16, 32, 64])
def test_canzona_close_to_unconstrained_lpt_and_not_above_layerwise(model: str, tp: int, dp: int) -> None:
    """Issue #2's acceptance: bucket geometry and DP-then-TP composition cost almost nothing."""
    args = (f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}", "planner.cost=flops")
    canzona = plan_for(*args)
    ours = compute_metrics(canzona).compute_imbalance
    assert ours <= _plain_lpt_imbalance(canzona) * (1.03 if tp == 1 else 1.10)
    assert ours <= compute_metrics(plan_for(*args, "method=layerwise")).compute_imbalance


def test_plan_32b_on_256_ranks_is_fast() -> None:
    # planning time is reported, not asserted as a wall-clock threshold here; see benchmarks/plan_bench.py
    plan = plan_for("model=qwen3-32b", "parallel.dp=256")
    assert plan.plan_seconds > 0 and len(plan.shard_ranges) == len(plan.layout.buckets)


# ---------------------------------------------------------------- alpha and minmax
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=7),
    p=st.integers(1, 4),
)
def test_minmax_split_is_optimal(sizes: list[int], p: int) -> None:
    import itertools

    w = np.array(sizes, dtype=float)
    offsets = np.zeros(p)
    got = dpmod.minmax_split(w, offsets)
    best = min(
        max(w[a:b].sum() for a, b in zip((0, *c), (*c, len(w))))
        for c in itertools.combinations_with_replacement(range(len(w) + 1), p - 1)
    )
    value = max(w[got[r] : got[r + 1]].sum() for r in range(p))
    assert got[0] == 0 and got[-1] == len(w) and list(got) == sorted(got)
    assert value == pytest.approx(best, rel=1e-6)


def test_alpha_zero_gives_most_even_shards_boundaries_allow() -> None:
    plan = plan_for("model=qwen3-0.6b", "model.width_div=4", "parallel.dp=4", "planner.alpha=0", "bucket.size=300000")
    for bucket, ranges in zip(plan.layout.buckets, plan.shard_ranges):
        elems = np.diff(dpmod.boundaries(bucket)).astype(float)
        idx = dpmod.minmax_split(elems, np.zeros(4))
        bounds = dpmod.boundaries(bucket)
        optimal = max(bounds[idx[r + 1]] - bounds[idx[r]] if idx[r + 1] < len(bounds) else 0 for r in range(4))
        optimal = max(optimal, max(elems))
        assert max(b - a for a, b in ranges) <= optimal


def test_joint_lpt_gives_single_matrix_bucket_to_least_loaded_rank() -> None:
    # three one-matrix buckets of costs 5, 4, 3 on 2 ranks: LPT puts 5 | 4+3
    params = [ParamSpec(f"m{i}", (8, 8), None, "matrix") for i in range(3)]
    layout = build_layout(params, dp=2, tp=1, bucket_size=1)
    cost = {0: 3.0, 1: 4.0, 2: 5.0}
    owners, _ = dpmod.joint_lpt_owners(layout, cost, 1, {i: True for i in range(3)})
    assert owners[2] != owners[1] and owners[1] == owners[0]


# ---------------------------------------------------------------- micro-groups
GROUPINGS = ["rounds", "global", "slot", "single", "none"]


@pytest.mark.parametrize("mode", GROUPINGS)
def test_micro_groups_cover_items_once(mode: str) -> None:
    cost = {i: float(1 + (i * 7) % 11) for i in range(40)}
    groups = schedule(list(range(40)), cost, 4, mode, 0.25)
    flat = [i for g in groups for i in g.items]
    assert sorted(flat) == list(range(40))
    assert all(0 <= o < 4 for g in groups for o in g.owners)


def test_greedy_rollback_respects_capacity() -> None:
    cost = {i: float(1 + (i * 7) % 11) for i in range(40)}
    tp, capacity = 4, 0.25
    cap = capacity * sum(cost.values()) / tp
    for g in schedule(list(range(40)), cost, tp, "global", capacity):
        loads = g.loads(cost, tp)
        assert max(loads) <= cap or len(g.items) == 1


def _path(groups: list[MicroGroup], cost: dict[int, float], tp: int) -> float:
    return sum(max(g.loads(cost, tp)) for g in groups)


@settings(max_examples=80, deadline=None)
@given(
    costs=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=60),
    tp=st.sampled_from([1, 2, 3, 4, 8]),
    capacity=st.sampled_from([0.05, 0.125, 0.5, 1.0]),
    hinted=st.booleans(),
)
def test_rounds_keep_every_tp_rank_busy_and_stay_balanced(
    costs: list[float], tp: int, capacity: float, hinted: bool
) -> None:
    """Balanced rounds: every matrix once; a group of at least T matrices gives every TP rank
    work; the critical path is within the slack of the best single round's (the largest TP
    total); rounds run in non-increasing size; a hint's owners are kept."""
    cost = dict(enumerate(costs))
    items = list(cost)
    hint = dict(enumerate(dpmod.lpt(costs, tp))) if hinted else None
    groups = schedule(items, cost, tp, "rounds", capacity, hint)
    assert sorted(i for g in groups for i in g.items) == items
    assert len(groups) <= max(1, round(1 / capacity))
    for g in groups:
        if len(g.items) >= tp:
            assert set(g.owners) == set(range(tp))
    totals = np.zeros(tp)
    for g in groups:
        totals += g.loads(cost, tp)
    assert _path(groups, cost, tp) <= (1 + ROUND_SLACK) * totals.max() * (1 + 1e-12)
    slowest = [max(g.loads(cost, tp)) for g in groups]
    assert slowest == sorted(slowest, reverse=True)
    if hint is not None:
        assert all(hint[i] == o for g in groups for i, o in zip(g.items, g.owners))


def test_rounds_give_identical_matrices_one_per_tp_rank_per_round() -> None:
    # 4 kinds x 8 TP ranks: every round holds one kind on every rank (no rank waits on another)
    cost = {i: float(10 ** (i // 8)) for i in range(32)}
    groups = schedule(list(range(32)), cost, 8, "rounds", 0.125)
    assert len(groups) == 4
    for g in groups:
        assert sorted(g.owners) == list(range(8)) and len({cost[i] for i in g.items}) == 1
    assert _path(groups, cost, 8) == pytest.approx(sum(cost.values()) / 8)


def test_one_large_matrix_does_not_make_one_matrix_groups() -> None:
    # the greedy rollback at this capacity puts every matrix in its own group; rounds don't
    cost = {i: 100.0 if i < 4 else 1.0 for i in range(40)}
    assert all(len(g.items) == 1 for g in schedule(list(range(40)), cost, 4, "global", 0.125)[:4])
    rounds = schedule(list(range(40)), cost, 4, "rounds", 0.125)
    assert all(set(g.owners) == set(range(4)) for g in rounds)
    assert _path(rounds, cost, 4) == pytest.approx(109.0)  # one 100 + nine 1s per rank


# ---------------------------------------------------------------- metrics
def test_adamw_and_layerwise_padding() -> None:
    plan = plan_for("model=qwen3-0.6b", "model.width_div=8", "parallel.dp=4", "method=adamw")
    for ranges in plan.shard_ranges:
        assert len({b - a for a, b in ranges}) == 1  # equal ZeRO-1 shards
    assert compute_metrics(plan).memory_imbalance == pytest.approx(1.0, rel=1e-3)


def test_critical_path_counts_each_group_at_its_slowest_tp_rank() -> None:
    plan = plan_for("model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1", "parallel.tp=2")
    mats = [i for i in range(len(plan.params)) if plan.uses_matrix_rule(i)]
    a, b, c, d = mats[:4]
    cost = {i: 0.0 for i in plan.cost} | {a: 4.0, b: 3.0, c: 2.0, d: 1.0}
    groups = ((MicroGroup((a, b), (0, 1)), MicroGroup((c, d), (0, 0))),)
    from dataclasses import replace

    hand = replace(plan, cost=cost, micro_groups=groups)
    outside = np.array([[1.5, 0.5]])  # e.g. elementwise work the TP ranks do outside groups
    rank_compute = np.array([[4.0 + 2.0 + 1.0, 3.0]]) + outside
    path = critical_path(hand, rank_compute)
    ideal = sum(cost.values()) / 2
    assert path.per_dp.tolist() == [4.0 + 3.0 + 1.5]
    assert path.imbalance == pytest.approx(8.5 / ideal)
    assert path.lower_bound == pytest.approx(max(1.0, 4.0 / ideal))


@pytest.mark.parametrize(
    "tp,dp,expect_global,expect_single",
    [(2, 8, 1.51, 1.00), (2, 32, 1.78, 1.00), (4, 8, 3.33, 1.00), (4, 32, 4.00, 1.27), (8, 8, 6.44, 1.00),
     (8, 32, 8.00, 2.04)],
)
def test_critical_path_reproduces_issue_10_figures(tp: int, dp: int, expect_global: float, expect_single: float) -> None:
    """The figures issue 10 quotes for Qwen3-32B (default buckets, Muon flops cost): the paper's
    greedy rollback puts one matrix per group when a matrix exceeds the capacity, so the TP ranks
    take turns; chunks of T sorted matrices do not."""
    args = ("model=qwen3-32b", f"parallel.dp={dp}", f"parallel.tp={tp}", "planner.cost=flops")
    for grouping, expect in (("global", expect_global), ("single", expect_single)):
        plan = plan_for(*args, f"planner.grouping={grouping}")
        assert critical_path(plan, compute_metrics(plan).compute).imbalance == pytest.approx(
            expect, abs=0.006
        )


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-14b", "qwen3-32b"])
@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("dp", [8, 16, 32, 64])
def test_default_plan_meets_issue_10_critical_path_bound(model: str, tp: int, dp: int) -> None:
    """Issue 10's acceptance: critical path <= max(1.10, 1.02 x lower bound); groups of at least
    T matrices keep every TP rank busy; every matrix owned once, owners consistent with groups.
    Planned for the GPU cluster these layouts are for (the default cost there: the h100 roofline),
    so the check does not depend on the CPU the tests run on."""
    plan = plan_for(f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}", "dist.device=cuda")
    metrics = compute_metrics(plan)
    path = critical_path(plan, metrics.compute)
    assert path.imbalance <= max(1.10, 1.02 * path.lower_bound)
    assert path.imbalance >= metrics.compute_imbalance - 1e-9 and path.lower_bound == pytest.approx(metrics.lower_bound)
    assert all(c == 1 for c in _ownership_counts(plan).values())
    for d, groups in enumerate(plan.micro_groups):
        for g in groups:
            assert all(plan.dp_owner[i] == d and plan.tp_owner[i] == o for i, o in zip(g.items, g.owners))
            if len(g.items) >= tp:
                assert set(g.owners) == set(range(tp))


def test_lower_bound_is_a_bound() -> None:
    for m in METHODS:
        met = compute_metrics(plan_for("model=qwen3-8b", "parallel.dp=64", "parallel.tp=8", f"method={m}"))
        assert met.compute_imbalance >= met.lower_bound - 1e-9


# ---------------------------------------------------------------- CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "canzona.plan", *args], capture_output=True, text=True)


def test_cli_json() -> None:
    r = _cli("model=qwen3-0.6b", "model.width_div=8", "model.split_fused=true", "parallel.dp=2", "parallel.tp=2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    names = [p["name"] for p in doc["params"]]
    assert len(names) == len(set(names))
    assert any(n.endswith("linear_qkv.weight.k") for n in names) and not any(n.endswith("linear_qkv.weight") for n in names)
    assert {"compute", "memory", "lower_bound", "critical_path", "critical_path_lower_bound"} <= set(doc["imbalance"])
    assert doc["imbalance"]["critical_path"] >= doc["imbalance"]["compute"] - 1e-9
    # micro-groups per DP rank, as [name, TP owner]; names and owners as in `params`
    owner = {p["name"]: (p["dp_owner"], p["tp_owner"]) for p in doc["params"]}
    listed = [(name, d, o) for d, groups in enumerate(doc["micro_groups"]) for g in groups for name, o in g]
    assert len(doc["micro_groups"]) == 2 and all(owner[n] == (d, o) for n, d, o in listed)
    assert sorted(n for n, _, _ in listed) == sorted(p["name"] for p in doc["params"] if p["kind"] == "matrix")
    assert len(doc["ranks"]) == 4 and doc["plan_seconds"] > 0
    for p in doc["params"]:
        if p["kind"] == "matrix":
            assert p["dp_owner"] is not None and p["tp_owner"] is not None


@pytest.mark.parametrize(
    "args,needle",
    [
        (["parallel.tp=3"], "parallel.tp=3"),
        (["planner.alpha=1.5"], "planner.alpha"),
        (["model=qwen3-70b"], "qwen3-0.6b"),
        (["method=zero3"], "canzona, sync, layerwise, adamw"),
        (["optimizer=lion"], "muon"),
        (["parallel.dpp=2"], "allowed under parallel: dp, ep, etp, sequence_parallel, tp"),
        (["model=qwen3-8b", "parallel.tp=16"], "kv_heads"),
        (["--yaml"], "--json"),
    ],
)
def test_cli_errors_are_one_line_exit_2(args: list[str], needle: str) -> None:
    r = _cli(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["qwen3-0.6b", "qwen3-4b", "qwen3-8b"]),
    dp=st.integers(1, 12),
    tp=st.sampled_from([1, 2, 4, 8]),
    alpha=st.sampled_from([0.0, 0.3, 1.0]),
    bucket=st.sampled_from([50_000, 400_000, None]),
    grouping=st.sampled_from(GROUPINGS),
)
def test_canzona_plan_properties(model: str, dp: int, tp: int, alpha: float, bucket, grouping: str) -> None:
    """Any layout: every matrix owned once, shards tile each bucket at param starts, rank-independent."""
    args = [f"model={model}", "model.width_div=16", "model.num_layers=3", f"parallel.dp={dp}", f"parallel.tp={tp}",
            f"planner.alpha={alpha}", f"planner.grouping={grouping}"] + ([f"bucket.size={bucket}"] if bucket else [])
    plan = plan_for(*args)
    assert all(c == 1 for c in _ownership_counts(plan).values())
    for b, ranges in zip(plan.layout.buckets, plan.shard_ranges):
        assert sum(e - a for a, e in ranges) == b.numel
        allowed = set(dpmod.boundaries(b))
        assert all(a in allowed and e in allowed for a, e in ranges if e > a)
    dpmod.owners_from_ranges(plan.layout, plan.shard_ranges)
    again = plan_for(*args)
    assert (again.shard_ranges, again.dp_owner, again.tp_owner) == (plan.shard_ranges, plan.dp_owner, plan.tp_owner)
