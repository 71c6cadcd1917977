"""Methods as DP x TP strategy pairs (`canzona.plan.registry`): every pair plans or is refused in
one line, the presets keep their meaning, ``zero1_atomic`` owns what Megatron's whole-tensor
rule says, and the planner's modules import no cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from import_walk import imports, module_files

from canzona.config import load_config
from canzona.cost import NumelCost
from canzona.errors import ConfigError
from canzona.plan.from_config import make_plan
from canzona.plan.registry import DP_STRATEGIES, PRESETS, TP_STRATEGIES, label, rung
from canzona.program.count import compute_metrics

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model=qwen3-8b", "model.width_div=16", "model.num_layers=4", "bucket.size=200000"]


def _plan(*items: str):
    return make_plan(load_config([*SMALL, *items]), device="cpu", cost_model=NumelCost())


def _runs(d: str, t: str) -> bool:
    return (d == "zero1") == (t == "local")  # with Muon at TP > 1: zero1 only with local, local only with zero1


@pytest.mark.parametrize("d", list(DP_STRATEGIES))
@pytest.mark.parametrize("t", list(TP_STRATEGIES))
def test_every_pair_plans_or_is_refused_in_one_line(d: str, t: str) -> None:
    items = ("parallel.dp=4", "parallel.tp=2", f"method.dp={d}", f"method.tp={t}")
    if not _runs(d, t):
        with pytest.raises(ConfigError) as e:
            load_config([*SMALL, *items])
        assert "\n" not in str(e.value) and "method." in str(e.value)
        return
    plan = _plan(*items)
    assert (plan.dp_strategy, plan.tp_strategy, plan.method) == (d, t, label(d, t))
    owners = plan.dp_owner
    for i in range(len(plan.params)):
        if not plan.uses_matrix_rule(i):
            continue
        # a matrix is computed by one DP rank (every DP rank under ddp), and by one TP rank
        # when the TP strategy pipelines
        assert (owners[i] is None) == (d == "ddp")
        assert (plan.tp_owner[i] is not None) == (t in ("async", "async_balanced"))
    grouped = [i for gs in plan.micro_groups for g in gs for i in g.items]
    if t in ("async", "async_balanced") and d != "ddp":
        assert sorted(grouped) == sorted(i for i in range(len(plan.params))
                                         if plan.uses_matrix_rule(i) and plan.params[i].tp_dim is not None)


def test_presets_keep_their_names_and_pairs() -> None:
    assert {n: (p.dp_strategy, p.tp_strategy) for n, p in PRESETS.items()} == {
        "canzona": ("balanced", "async_balanced"), "sync": ("ddp", "duplicated"),
        "layerwise": ("layerwise", "duplicated"), "adamw": ("zero1", "local"), "atomic": ("zero1_atomic", "duplicated"),
        "layerwise_sharded": ("layerwise_sharded", "duplicated"),
        "layerwise_sharded_ns": ("layerwise_sharded_ns", "duplicated"),
        "layerwise_sharded_gram": ("layerwise_sharded", "gram_allreduce")}
    cfg = load_config(["method=atomic", "method.tp=async"])
    assert (cfg.method.name, cfg.method.dp, cfg.method.tp, cfg.method.label) == (None, "zero1_atomic", "async",
                                                                                  "zero1_atomic+async")
    assert load_config(["method.dp=balanced", "method.tp=async_balanced"]).method.name == "canzona"
    assert [rung(PRESETS[m].dp_strategy, PRESETS[m].tp_strategy) for m in ("sync", "atomic", "canzona")] == [
        "0_0-0_0", "1_0-0_0", "1_1-1_1"]
    assert rung("zero1_atomic", "async") == "1_0-1_0" and rung("layerwise", "duplicated") is None


@pytest.mark.parametrize("bad,message", [
    ("method=synk", "method='synk' is not a preset or a peer; choose one of: canzona, sync"),
    ("method.dp=zero2", "method.dp='zero2' is not allowed; choose one of: ddp, zero1_atomic"),
    ("method.tp=sync", "method.tp='sync' is not allowed; choose one of: duplicated, async"),
])
def test_bad_method_names_are_one_line_errors(bad: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([bad])


def test_cli_refuses_a_pair_that_cannot_run_with_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "canzona.plan", "parallel.tp=2", "method.dp=zero1", "method.tp=async"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "use method.tp=local" in r.stderr


def _first_element_owner(start: int, bucket_start: int, bucket_numel: int, dp: int) -> int:
    """Megatron's equal shards: rank r holds [r·n/dp, (r+1)·n/dp) of the (padded) bucket."""
    return (start - bucket_start) // (bucket_numel // dp)


@pytest.mark.parametrize("model,dp,tp", [("qwen3-32b", 32, 8), ("qwen3-8b", 64, 4), ("qwen3-0.6b", 8, 1)])
def test_zero1_atomic_owners_are_megatrons_first_element_owners(model: str, dp: int, tp: int) -> None:
    plan = make_plan(load_config([f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}", "method=atomic"]),
                     device="cuda", cost_model=NumelCost())
    for b, ranges in zip(plan.layout.buckets, plan.shard_ranges):
        for s in b.params:
            want = _first_element_owner(s.start, b.start, b.numel, dp)
            assert plan.dp_owner[s.index] == want, (model, s.index)
            a, e = ranges[want]
            assert a <= s.start and s.end <= e  # the owner's shard is stretched to the tensor's end
        assert sorted(ranges) == sorted(ranges) and sum(e - a for a, e in ranges) == b.numel


def test_balance_removes_what_whole_tensor_ownership_piles_up() -> None:
    """The ladder's DP rung: balanced's compute imbalance is no worse than zero1_atomic's, and
    async TP with one owner per matrix computes each matrix once, not TP times."""
    plan = _plan("parallel.dp=4", "parallel.tp=2", "method=atomic")
    atomic = compute_metrics(plan)
    dp_bal = compute_metrics(_plan("parallel.dp=4", "parallel.tp=2", "method=atomic", "method.dp=balanced"))
    tp_async = compute_metrics(_plan("parallel.dp=4", "parallel.tp=2", "method=atomic", "method.tp=async"))
    assert dp_bal.compute_imbalance <= atomic.compute_imbalance + 1e-9
    sharded = sum(plan.cost[i] for i in range(len(plan.params)) if plan.uses_matrix_rule(i) and plan.params[i].tp_dim is not None)
    assert atomic.compute.sum() - tp_async.compute.sum() == pytest.approx(sharded)  # computed twice -> once


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """Module-level imports of a file, those under ``if TYPE_CHECKING:`` included, from the one
    import walk (`import_walk`): ``from pkg import y`` counts ``pkg`` (loaded first) and ``pkg.y``
    when y is one of ``modules``."""
    return {m for i in imports(path, modules, packages=None) if not i.lazy for m in (i.module, i.package) if m}


def test_no_import_cycle_counting_type_checking_imports() -> None:
    mods = module_files("canzona", "analysis")
    graph = {m: {d for d in _module_imports(p, set(mods)) if d in mods and d != m} for m, p in mods.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(d):], d]))
            if d not in state:
                walk(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [m])


def test_planners_read_no_config() -> None:
    """The strategies and the composer take plain inputs: no `TrialConfig`, no cost model."""
    planners = [*ROOT.glob("canzona/plan/strategies/*.py"), ROOT / "canzona/plan/compose.py", ROOT / "canzona/plan/registry.py"]
    modules = set(module_files("canzona"))
    for p in planners:
        found = _module_imports(p, modules)
        assert not {i for i in found if i.startswith(("canzona.config", "canzona.cost", "torch"))}, p


def _usage_blocks() -> list[str]:
    """The Python blocks of docs/usage.md's "Extending" section."""
    section = (ROOT / "docs" / "usage.md").read_text().split("\n## Extending\n", 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]


def test_usage_extending_strategies_are_the_shipped_ones() -> None:
    """docs/usage.md's DP and TP strategy examples ("Extending"), run as modules, plan what the
    registered `zero1_atomic` and `async` plan."""
    from canzona.plan.from_config import plan_inputs
    from canzona.plan.strategies import async_, zero1_atomic

    blocks = {("dp" if "def candidates" in b else "tp"): b for b in _usage_blocks() if "NAME = " in b and "def " in b}
    assert set(blocks) == {"dp", "tp"}
    inputs = plan_inputs(load_config([*SMALL, "parallel.dp=4", "parallel.tp=2"]), NumelCost())
    dp_mod: dict = {}
    exec(compile(blocks["dp"], "usage_dp.py", "exec"), dp_mod)
    assert dp_mod["NAME"] == zero1_atomic.NAME
    assert dp_mod["candidates"](inputs, frozenset()) == zero1_atomic.candidates(inputs, frozenset())
    tp_mod: dict = {}
    exec(compile(blocks["tp"], "usage_tp.py", "exec"), tp_mod)
    items = [i for i, p in enumerate(inputs.params) if p.kind == "matrix" and p.tp_dim is not None]
    assert tp_mod["NAME"] == async_.NAME and tp_mod["MODE"] == async_.MODE
    assert tp_mod["groups"](items, inputs, None) == async_.groups(items, inputs, None)
