"""The per-rank programs: every group's calls line up, the counting pass agrees with the planner,
ownership is what each method says, and the architecture keeps decisions in the lowering."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from import_walk import imports, module_files

from canzona.config import load_config
from canzona.plan import loads
from canzona.plan.from_config import make_plan
from canzona.program.actions import BucketReduce, Compute, TpGather
from canzona.program.check import check_matching, expected_bytes
from canzona.program.count import compute_metrics, count_programs
from canzona.program.lower import lower, resolve_impl
from canzona.program.render import render_program

REPO = Path(__file__).resolve().parents[2]
PACKAGE = module_files("canzona")  # module name -> file
METHODS = ["canzona", "sync", "layerwise", "adamw"]
SMALL = ["model=qwen3-8b", "model.width_div=32", "model.num_layers=2", "bucket.size=20000"]


def plan_for(*items: str):
    """A plan with a machine-independent cost model (``planner.cost=flops`` unless given): what a
    test checks of a plan must not depend on the CPU that runs it (measured costs do)."""
    given = any(o.startswith("planner.cost=") for o in items)
    return make_plan(load_config([*([] if given else ["planner.cost=flops"]), *items]))


LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (2, 4), (3, 2)]
VARIANTS = [[], ["dist.dp_collective=padded"], ["dist.dp_collective=reduce_loop"], ["dist.dp_collective=coalesced"],
            ["dist.dp_collective=all_to_all"], ["dist.overlap_grad_reduce=false"], ["planner.pipeline_depth=0"],
            ["dist.sync_variant=zero1_gather"], ["optimizer=shampoo"], ["model.split_fused=true"]]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"dp{x[0]}tp{x[1]}")
def test_every_group_makes_matching_calls(method: str, layout: tuple[int, int]) -> None:
    dp, tp = layout
    for extra in VARIANTS:
        plan = plan_for(*SMALL, f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}", *extra)
        assert check_matching(lower(plan)) == [], f"{method} dp{dp} tp{tp} {extra}"


def test_full_size_programs_match_at_256_ranks() -> None:
    for method in METHODS:
        plan = plan_for("model=qwen3-32b", "parallel.dp=32", "parallel.tp=8", f"method={method}")
        programs = lower(plan)
        assert len(programs) == 256
        assert check_matching(programs) == [], method


def test_a_mismatch_between_ranks_is_found() -> None:
    plan = plan_for(*SMALL, "parallel.dp=2", "parallel.tp=2", "method=canzona")
    programs = lower(plan)
    # rank 1 skips its first TP gather: its TP group would hang
    bad = [a for a in programs[1].actions if not (isinstance(a, TpGather) and a.tag == "gather g0")]
    programs[1] = replace(programs[1], actions=tuple(bad))
    problems = check_matching(programs)
    assert problems and "tp group 0" in problems[0]
    # a reduce-scatter whose ranges disagree between DP ranks
    programs = lower(plan)
    acts = list(programs[2].actions)
    hook = acts[1].hooks[0]
    r = hook.issue[0]
    assert isinstance(r, BucketReduce)
    (a0, b0), (a1, b1) = r.ranges
    shifted = replace(r, ranges=((a0, b0 + 128), (a1 + 128, b1)))  # this rank thinks the cut is elsewhere
    acts[1] = replace(acts[1], hooks=(replace(hook, issue=(shifted,)), *acts[1].hooks[1:]))
    programs[2] = replace(programs[2], actions=tuple(acts))
    problems = check_matching(programs)
    assert problems and all(p.startswith("dp group") for p in problems)


@pytest.mark.parametrize("layout", [(8, 1), (8, 8), (32, 8), (64, 4)], ids=lambda x: f"dp{x[0]}tp{x[1]}")
def test_counting_pass_equals_the_planners_own_loads(layout: tuple[int, int]) -> None:
    dp, tp = layout
    plan = plan_for("model=qwen3-14b", f"parallel.dp={dp}", f"parallel.tp={tp}")
    assert np.allclose(compute_metrics(plan).compute, loads.owner_loads(plan), rtol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_each_method_computes_each_matrix_as_often_as_it_says(method: str) -> None:
    dp, tp = 2, 4
    plan = plan_for(*SMALL, f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}")
    counts = np.zeros(len(plan.params), dtype=int)
    for prog in lower(plan):
        for a in prog.actions:
            if isinstance(a, Compute):
                counts[list(a.items)] += 1
        assert set(prog.matrix_items) == {i for a in prog.actions if isinstance(a, Compute) for i in a.items}
    matrices = counts[[i for i in range(len(plan.params)) if plan.uses_matrix_rule(i)]]
    want = {"canzona": 1, "layerwise": tp, "sync": dp * tp}.get(method)
    if want is None:
        assert matrices.size == 0 and counts.sum() == 0
    else:
        assert set(matrices.tolist()) == {want}


def test_sync_is_redundant_and_canzona_is_balanced() -> None:
    sync = compute_metrics(plan_for("model=qwen3-8b", "parallel.dp=8", "method=sync"))
    assert sync.compute_imbalance == pytest.approx(8.0, rel=0.01)
    canz = compute_metrics(plan_for("model=qwen3-8b", "parallel.dp=8"))
    assert canz.compute_imbalance < 1.05


def test_auto_collective_pads_only_cheap_buckets() -> None:
    assert resolve_impl(((0, 4), (4, 8)), "auto") == "even"
    assert resolve_impl(((0, 5), (5, 8)), "auto") == "padded"  # 2 x 5 <= 1.25 x 8
    assert resolve_impl(((0, 7), (7, 8)), "auto") == "coalesced"
    assert resolve_impl(((0, 7), (7, 8)), "reduce_loop") == "reduce_loop"
    assert resolve_impl(((4, 8), (0, 4)), "auto") == "padded"  # equal but not in rank order


def test_bytes_per_action_follow_the_calls() -> None:
    plan = plan_for(*SMALL, "parallel.dp=2", "parallel.tp=2", "method=canzona")
    prog = lower(plan, [0])[0]
    got = expected_bytes(prog)
    assert sum(v[2] for v in got.values()) == len(prog.calls())
    m = count_programs(plan, lower(plan))
    assert m.collectives == max(len(p.calls()) for p in lower(plan))


def test_elementwise_updates_fill_the_first_gathers_wait() -> None:
    """In canzona's TP pipeline the elementwise AdamW ranges run after the first micro-groups'
    gathers are issued and before they are waited for (they need no TP communication); where a
    DP rank has no micro-group they stay at the end of the step."""
    plan = plan_for(*SMALL, "method=canzona", "parallel.dp=2", "parallel.tp=2")
    for d, prog in zip(range(2), lower(plan, [0, 2])):
        acts = [a for a in prog.actions if type(a).__name__ in ("TpGather", "Elementwise", "Wait")]
        names = [(type(a).__name__, getattr(a, "tag", None) or getattr(a, "label", None)) for a in acts]
        assert plan.micro_groups[d], "the test needs micro-groups on every DP rank"
        first_gather = next(k for k, a in enumerate(acts) if isinstance(a, TpGather))
        elementwise = next(k for k, (kind, _) in enumerate(names) if kind == "Elementwise")
        first_wait = next(k for k, (kind, tag) in enumerate(names) if kind == "Wait" and tag == "wait gather g0")
        assert first_gather < elementwise < first_wait, names


def test_program_text_names_every_action() -> None:
    plan = plan_for(*SMALL, "parallel.dp=2", "parallel.tp=2", "method=canzona")
    prog = lower(plan, [3])[0]
    text = render_program(plan, prog)
    assert text.startswith("rank 3 (dp 1, tp 1)")
    assert text.count("\n") >= len(prog.actions)
    for word in ("forward", "backward", "step_start", "step_end", "gather g0", "param_sync"):
        assert word in text


# ------------------------------------------------------------------ architecture
MODES = {"grad_reduce", "param_sync", "tp_mode", "regathers_grads", "elementwise_on_shards", "every_rank_updates_all",
         "shard_ranges", "micro_groups", "dp_owner", "tp_owner", "method"}
INTERPRETERS = ["canzona/executor", "canzona/sim/interpret.py", "canzona/sim/simulate.py", "canzona/program/count.py"]


def _files(paths: list[str]) -> list[Path]:
    out = []
    for p in paths:
        path = REPO / p
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


@pytest.mark.parametrize("path", _files(INTERPRETERS), ids=lambda p: str(p.relative_to(REPO)))
def test_interpreters_read_no_plan_modes(path: Path) -> None:
    """The executor, the simulator and the metrics walk programs: none of them looks at how a
    method plans (its modes, owners, shards or micro-groups) -- only the lowering does."""
    tree = ast.parse(path.read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in ("plan", "plan_", "self.plan")}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
             and n.value.attr == "plan"}
    assert not (used & MODES), f"{path.name} reads {sorted(used & MODES)}"


def _imports(path: Path) -> set[str]:
    """Modules a file imports at run time (anywhere in it; ``if TYPE_CHECKING:`` blocks excepted),
    from the one import walk (`import_walk`): ``from pkg import y`` is ``pkg.y`` when y is a module
    of the package, else ``pkg``."""
    return {i.module for i in imports(path, set(PACKAGE), packages=None) if not i.typing}


def test_no_import_cycles_inside_the_package() -> None:
    graph = {mod: {m for m in _imports(f) if m in PACKAGE} for mod, f in PACKAGE.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = {tuple(sorted(c)) for m in graph if (c := cycle_from(m)) and not all(x.endswith("__init__") for x in c)}
    assert not cycles, f"import cycles: {sorted(cycles)[:3]}"


def test_planner_never_imports_the_executor_or_program() -> None:
    for f in (REPO / "canzona/plan").rglob("*.py"):
        if f.name == "__main__.py":  # the planner's CLI shows programs too
            continue
        bad = {m for m in _imports(f) if m.startswith(("canzona.executor", "canzona.program", "torch", "canzona.sim"))}
        assert not bad, f"{f.name} imports {bad}"


@pytest.mark.parametrize("extra", [[], ["model=qwen3-30b-a3b", "model.width_div=64", "model.num_layers=2",
                                        "model.num_experts=4", "model.top_k=2", "parallel.ep=2"]])
def test_the_step_timer_waits_at_a_barrier_of_every_rank(extra: list[str]) -> None:
    """Megatron's optimizer timer starts after a barrier (``--barrier-with-L1-time``, its
    default): every rank's program waits at one, over the whole world, right before the step's
    mark; alone there is nothing to wait for, and ``dist.step_barrier=false`` leaves it out."""
    from canzona.program.actions import Mark, StepBarrier, Wait

    def before_step(program) -> list:
        acts = list(program.actions)
        at = next(k for k, a in enumerate(acts) if isinstance(a, Mark) and a.name == "step_start")
        return acts[max(0, at - 2):at]

    for program in lower(plan_for(*extra, "parallel.dp=2", "parallel.tp=2")):
        barrier, wait = before_step(program)
        assert isinstance(barrier, StepBarrier) and barrier.calls()[0].axis == "world"
        assert isinstance(wait, Wait) and wait.tags == (barrier.tag,) and wait.phase == "barrier"
    off = lower(plan_for(*extra, "parallel.dp=2", "parallel.tp=2", "dist.step_barrier=false"))
    assert not any(isinstance(a, StepBarrier) for p in off for a in p.actions)
    if not extra:
        alone = lower(plan_for("parallel.dp=1", "parallel.tp=1"))
        assert not any(isinstance(a, StepBarrier) for p in alone for a in p.actions)
