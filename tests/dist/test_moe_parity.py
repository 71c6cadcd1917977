"""An MoE model's expert matrices under every method reproduce the single-process optimizer, bit
for bit, with each expert owned as the method says (docs/design.md §3.3, MoE).

Step parity, as `test_parity.py` does it for dense models: every rank is fed gradients of its
own for 3 steps -- dense ones per DP rank, expert ones per (expert-DP rank, expert), as the
token dispatch would leave them -- on a 2^-12 grid below 2^-4, so every partial sum is exact in
fp32 in any order and dividing by a power of two is exact. The reference gets, per dense param,
the DP average, and per expert the sum over the expert-DP ranks holding it divided by the DP
size (Megatron's expert gradient scaling: every rank's tokens reach the experts, so that is the
gradient of the mean loss). The float64 gradient norm makes clipping exact too.

Layouts: DP 2 × EP 2 (expert-DP 1: the experts' reduction is a group of one that still scales),
DP 4 × EP 2 (expert-DP 2) and DP 2 × TP 2 × EP 2 (expert-TP 1: an EP group across TP ranks).
"""

from __future__ import annotations

import zlib

import pytest
import torch
from util import global_rel

pytestmark = pytest.mark.slow

MODEL = ["model=qwen3-30b-a3b", "model.width_div=32", "model.num_layers=2", "model.num_experts=4", "model.top_k=2",
         "train.seed=7", "train.dtype=fp32", "optimizer.clip_norm_dtype=float64", "parallel.sequence_parallel=true"]
COMBOS = [("canzona", "muon"), ("sync", "muon"), ("layerwise", "muon"), ("atomic", "muon"),
          ("canzona", "shampoo"), ("canzona", "soap"), ("adamw", "adamw")]
# (dp, tp, ep, etp)
LAYOUTS = {"dp2ep2": (2, 1, 2, 1), "dp4ep2": (4, 1, 2, 1), "dp2tp2ep2": (2, 2, 2, 1), "dp2tp2ep2etp2": (2, 2, 2, 2)}
STEPS = 3


def _grad(name: str, shape, step: int, key: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{step}/{key}/{name}".encode()))
    return torch.randint(-255, 256, tuple(shape), generator=g).float() / 4096


def _local(full: torch.Tensor, spec, tp: int, tp_rank: int) -> torch.Tensor:
    if spec.tp_dim is None or tp == 1:
        return full
    return full.chunk(tp, dim=spec.tp_dim)[tp_rank].contiguous()


def _worker(rank: int, world: int, dp: int, tp: int, ep: int, etp: int) -> dict:
    from full_tensors import step_from_grads

    from canzona.config import load_config
    from canzona.executor.runtime import Runtime
    from canzona.executor.timing import StepTimer
    from canzona.model.parallel import init_parallel
    from canzona.model.qwen3 import build_model
    from canzona.plan.experts import rank_space
    from canzona.plan.from_config import make_plan
    from canzona.program.check import compare_recorded
    from canzona.program.lower import lower_rank

    ctx = init_parallel(tp, "gloo", 60.0, ep=ep, etp=etp)
    out: dict = {}
    for method, optimizer in COMBOS:
        cfg = load_config([*MODEL, f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.ep={ep}", f"parallel.etp={etp}", f"method={method}",
                           f"optimizer={optimizer}", "planner.cost=numel"])
        plan = make_plan(cfg, device="cpu")
        program = lower_rank(plan, rank)
        space = rank_space(plan, rank)
        edp_rank, ep_rank, etp_rank = plan.experts.layout.coords(rank)

        def local(i: int, s, t: torch.Tensor, space=space, etp_rank=etp_rank) -> torch.Tensor:
            """A dense param's TP shard, an expert's expert-TP shard."""
            return _local(t, s, tp, ctx.tp_rank) if i < space.dense_params else _local(t, s, etp, etp_rank)

        model = build_model(cfg.model_cfg(), seed=cfg.train.seed, sequence_parallel=cfg.sequence_parallel)
        runtime = Runtime(model, plan, program, cfg.optimizer, ctx)
        timer = StepTimer(ctx.device)
        recorded: list[str] = []
        for step in range(1, STEPS + 1):
            grads = [local(i, s, _grad(s.name, s.shape, step, f"d{ctx.dp_rank}" if i < space.dense_params
                                       else f"e{edp_rank}")) for i, s in enumerate(space.params)]
            step_from_grads(runtime, grads, timer)
            recorded += compare_recorded(program, runtime.bytes_by_tag(), with_backward=False)
        runtime.finish(timer)
        out[f"{method} {optimizer}"] = {
            # the reference in a rank's process: the same BLAS threads as the ranks' (bits depend on them)
            "reference": _reference(method, optimizer, dp, tp, ep, etp) if rank == 0 else None,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "computed": sorted(space.params[i].name for i in runtime.computed),
            "coords": (ctx.dp_rank, ctx.tp_rank, edp_rank, ep_rank, etp_rank),
            "recorded": recorded,
        }
    return out


@pytest.fixture(scope="module", params=list(LAYOUTS))
def moe_results(request):
    from util import run_ranks

    dp, tp, ep, etp = LAYOUTS[request.param]
    return request.param, (dp, tp, ep, etp), run_ranks(_worker, dp * tp, dp, tp, ep, etp, timeout_s=600)


def _reference(method: str, optimizer: str, dp: int, tp: int, ep: int, etp: int) -> tuple:
    from full_tensors import init_full_state_dict

    from canzona.config import load_config
    from canzona.inventory import build_inventory
    from canzona.optim.owner import ReferenceOptimizer
    from canzona.plan.from_config import make_plan

    cfg = load_config([*MODEL, f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.ep={ep}", f"parallel.etp={etp}", f"method={method}",
                       f"optimizer={optimizer}", "planner.cost=numel"])
    plan = make_plan(cfg, device="cpu")
    specs = build_inventory(cfg.model_cfg())
    edp = plan.experts.layout.edp
    params = init_full_state_dict(cfg.model_cfg(), cfg.train.seed)
    ref = ReferenceOptimizer(specs, cfg.optimizer, matrix_rule=plan.matrix_rule)
    for step in range(1, STEPS + 1):
        grads = {}
        for s in specs:
            keys = [f"d{d}" for d in range(dp)] if s.expert is None else [f"e{d}" for d in range(edp)]
            grads[s.name] = sum(_grad(s.name, s.shape, step, k) for k in keys) / dp
        ref.step(params, grads)
    return params, plan, specs, init_full_state_dict(cfg.model_cfg(), cfg.train.seed)


def _assemble(results: list[dict], key: str, specs, tp: int, etp: int) -> tuple[dict, list[str]]:
    """Full tensors from the ranks' local ones (dense: the TP shards of each DP rank; experts: the
    expert-TP shards of each expert-DP rank), and every disagreement between copies that should be
    equal."""
    problems, full = [], {}
    for s in specs:
        holders = [r[key] for r in results if s.name in r[key]["params"]]
        split = tp if s.expert is None else etp
        if s.tp_dim is not None and split > 1:
            copies: dict = {}
            for h in holders:
                d, t, ed, _, et = h["coords"]
                copies.setdefault(d if s.expert is None else ed, {})[t if s.expert is None else et] = h["params"][s.name]
            fulls = [torch.cat([copies[d][t] for t in range(split)], dim=s.tp_dim) for d in sorted(copies)]
        else:
            fulls = [h["params"][s.name] for h in holders]
        if not fulls:
            problems.append(f"{s.name}: held by no rank")
            continue
        if any(not torch.equal(f, fulls[0]) for f in fulls):
            problems.append(f"{s.name}: replicas differ")
        full[s.name] = fulls[0]
    return full, problems


def test_moe_step_parity_and_ownership(moe_results) -> None:
    layout, (dp, tp, ep, etp), results = moe_results
    failures = []
    for method, optimizer in COMBOS:
        key = f"{method} {optimizer}"
        want, plan, specs, init = results[0][key]["reference"]
        got, problems = _assemble(results, key, specs, tp, etp)
        failures += [f"{layout} {key}: {p}" for p in problems]
        differ = [n for n in want if n in got and not torch.equal(got[n], want[n])]
        if differ:
            failures.append(f"{layout} {key}: {len(differ)} params differ from the reference, e.g. {differ[:3]}")
        moved = [n for n in want if n in got and not torch.equal(got[n], init[n])]
        if not moved:
            failures.append(f"{layout} {key}: no parameter moved")
        # ownership: how many ranks compute each matrix's full update
        counts: dict[str, int] = {}
        for r in results:
            for n in r[key]["computed"]:
                counts[n] = counts.get(n, 0) + 1
        edp = plan.experts.layout.edp
        ddp, duplicated = plan.dp_strategy == "ddp", plan.tp_strategy == "duplicated"
        for s in specs:
            if s.kind != "matrix" or not plan.matrix_rule:
                continue
            if s.expert is not None:
                expect = (edp if ddp else 1) * (etp if duplicated and etp > 1 else 1)
            else:
                expect = (dp if ddp else 1) * (tp if duplicated and tp > 1 else 1)
            if counts.get(s.name, 0) != expect:
                failures.append(f"{layout} {key}: {s.name} computed by {counts.get(s.name, 0)} ranks, want {expect}")
                break
        failures += [f"{layout} {key}: {p}" for r in results for p in r[key]["recorded"]][:3]
    assert not failures, "\n".join(failures)



# ------------------------------------------------------------------ training through the trial runner
TRAIN = ["model=qwen3-30b-a3b", "model.width_div=32", "model.num_layers=2", "model.num_experts=4", "model.top_k=2",
         "train.seed=7", "train.dtype=fp32", "train.steps=3", "train.warmup=0", "train.seq_len=16",
         "optimizer=muon", "planner.cost=numel"]


def test_moe_trials_train_as_single_process(tmp_path) -> None:
    """Three Muon steps of the MoE model through the real trial runner (`canzona.run`: model,
    token dispatch over EP, the executor) at DP 2 × EP 2 and DP 2 × TP 2 × EP 2 (sequence
    parallel, expert-TP 1) stay within the dense models' training-parity bound (1e-5 relative L2)
    of the single process: the dispatch and the TP layers reorder sums (the routing itself is
    the same: equal logits up to rounding pick the same experts on these seeds, or the bound
    would fail), and each expert matrix is computed by one rank, the executor's calls its
    program's."""
    from canzona.config import load_config
    from canzona.run import run_trial

    got, summaries = {}, {}
    layouts = {"single": ["train.micro_batch=4"],
               "dp2ep2": ["train.micro_batch=2", "parallel.dp=2", "parallel.ep=2", "method=canzona"],
               "dp2tp2ep2": ["train.micro_batch=2", "parallel.dp=2", "parallel.tp=2", "parallel.ep=2", "parallel.etp=1",
                             "parallel.sequence_parallel=true", "method=canzona"]}
    for name, layout in layouts.items():
        out = tmp_path / name
        summaries[name] = run_trial(load_config([*TRAIN, *layout, f"save_params={out}/p.pt"]), out)
        got[name] = torch.load(out / "p.pt")
    from full_tensors import init_full_state_dict

    init = init_full_state_dict(load_config(TRAIN).model_cfg(), 7)
    moved = global_rel(init, got["single"])
    for name in ("dp2ep2", "dp2tp2ep2"):
        s = summaries[name]
        assert list(got[name]) == list(init), name  # every expert, in the full inventory's order
        err = global_rel(got[name], got["single"])
        assert err <= 1e-5, f"{name}: relative L2 difference {err:.2e}"
        assert moved > 100 * max(err, 1e-12), "training did not move the parameters enough for the check to mean anything"
        assert s["program_check"]["ok"] and s["matrix_owner_counts"] == {"min": 1, "max": 1}, name
        assert s["world"]["ep"] == 2, name
