"""Every method × optimizer × layout reproduces the single-process optimizer (docs/design.md
§3.3), and the executor makes exactly the calls its program lists.

Step parity: each DP rank is fed its *own* full gradients (rank-dependent, so a reduction that
did nothing would fail) for 3 steps; the reference optimizer gets their DP average. The
gradients are multiples of 2^-12 below 2^-4 in size, so every partial sum of P of them is exact
in fp32 whatever order a collective adds them in, and dividing by P (a power of two) is exact:
bit-exactness is then a property of the executor, not of a lucky summation order, on any CPU.
Owners see the exact full matrix; a matrix's update does not depend on what it is batched with
(see canzona/optim), so the distributed parameters must equal the reference's bit for bit.

Training parity: 3 full training steps through the real trial runner (`canzona.run`), where
the TP layers reorder sums, must stay within 1e-5 relative of the single-process run.
"""

from __future__ import annotations

import json

import pytest
import torch
from util import global_rel

pytestmark = pytest.mark.slow

MODEL = ["model=qwen3-8b", "model.width_div=64", "model.num_layers=2", "train.seed=7", "train.dtype=fp32"]
# TP=4 needs a vocabulary divisible by 4: width/32.
# float64 gradient norm: exact on the gradients' binary grid in any summation order, so clipping
# is bit for bit the reference's. The default float32 norm (Megatron's) sums in the order of each
# rank's shards: its combos (FP32_NORM) are held to FP32_NORM_REL instead.
STEP_MODEL = ["model=qwen3-8b", "model.width_div=32", "model.num_layers=2", "train.seed=7", "train.dtype=fp32",
              "optimizer.clip_norm_dtype=float64"]
METHODS = ["canzona", "atomic", "sync", "layerwise", "layerwise_sharded", "layerwise_sharded_ns", "adamw"]
# layerwise_sharded_ns differs from layerwise_sharded only in who owns a matrix (the buffer, the
# collectives and the update are the same code): its step parity runs Muon at every layout, and
# the every-optimizer and training-through-the-runner checks run on layerwise_sharded alone
OWNERS_ONLY = {"layerwise_sharded_ns"}
TRAIN_METHODS = [m for m in METHODS if m not in OWNERS_ONLY]
OPTIMIZERS = ["muon", "shampoo", "soap", "adamw"]
LAYOUTS = {"dp2": (2, 1), "tp2": (1, 2), "dp2tp2": (2, 2)}
WIDE_LAYOUTS = {"dp4": (4, 1), "tp4": (1, 4), "dp2tp4": (2, 4)}  # uneven and empty shards, 4-way TP
STEPS = 3
FP32_NORM = "optimizer.clip_norm_dtype=float32"
# Derived bound for the float32 norm: the distributed and the reference sums of squares differ by
# reordering only, a relative error of at most ~(terms per sum) x 2^-24 on fp32 partial norms of
# a few hundred tensors (< 1e-5); the clip coefficient inherits it, and Muon (normalised by
# Newton-Schulz) and AdamW (m / sqrt(v)) are invariant to a common gradient scale but through
# the momentum's mix of steps clipped differently, so the parameters differ by at most that
# relative amount times the update's share of the parameter (< 1).
FP32_NORM_REL = 1e-5


def _grads(specs, step: int, dp_rank: int) -> dict[str, torch.Tensor]:
    """Rank-dependent gradients on a 2^-12 grid, |g| < 2^-4: sums of up to 16 are exact in fp32."""
    g = torch.Generator().manual_seed(1000 + 17 * step + dp_rank)
    return {s.name: torch.randint(-255, 256, s.shape, generator=g).float() / 4096 for s in specs}


def _mean_grads(specs, step: int, dp: int) -> dict[str, torch.Tensor]:
    per_rank = [_grads(specs, step, d) for d in range(dp)]
    return {s.name: sum(g[s.name] for g in per_rank) / dp for s in specs}


def _local(full: torch.Tensor, spec, tp: int, tp_rank: int) -> torch.Tensor:
    if spec.tp_dim is None:
        return full
    return full.chunk(tp, dim=spec.tp_dim)[tp_rank].contiguous()


def _pairs(dp: int, tp: int) -> list[tuple[str, str, list[str]]]:
    """Every DP x TP strategy pair that runs with Muon, besides the presets. A strategy of an
    axis of size 1 does nothing: at TP 1 one pair per DP strategy, at DP 1 one per TP strategy."""
    from canzona.plan.registry import DP_STRATEGIES, PRESETS, TP_STRATEGIES

    presets = {(p.dp_strategy, p.tp_strategy) for p in PRESETS.values()}
    out, tp_seen = [], set(p.tp_strategy for p in PRESETS.values()) if dp == 1 else set()
    for d in DP_STRATEGIES:
        for t in TP_STRATEGIES if tp > 1 else ["duplicated"]:
            if d == "zero1" or t == "local" or (d, t) in presets or t in tp_seen:
                continue  # zero1 and local are elementwise only: the adamw preset covers them
            if t == "gram_allreduce":
                continue  # not bit-exact by design: tests/dist/test_gram_parity.py holds it to a derived bound
            tp_seen |= {t} if dp == 1 else set()
            out.append(("canzona", "muon", [f"method.dp={d}", f"method.tp={t}"]))
    return out


def _combos(wide: bool = False, dp: int = 1, tp: int = 1) -> list[tuple[str, str, list[str]]]:
    pairs = _pairs(dp, tp)
    if wide:
        combos = [(m, "muon" if m != "adamw" else "adamw", []) for m in METHODS]
        combos += [("canzona", "shampoo", []), ("canzona", "soap", []), ("sync", "muon", ["dist.sync_variant=zero1_gather"])]
        combos += [("canzona", "muon", [f"dist.dp_collective={c}"]) for c in ("padded", "reduce_loop", "coalesced", "all_to_all")]
        return combos + pairs
    combos = [(m, o, []) for m in METHODS for o in OPTIMIZERS
              if not (m == "adamw" and o != "adamw") and not (m in OWNERS_ONLY and o != "muon")]
    combos += [
        ("canzona", "muon", ["model.split_fused=true"]),
        ("canzona", "muon", ["planner.pipeline_depth=0"]),
        ("canzona", "muon", ["dist.dp_collective=padded"]),
        ("canzona", "muon", ["dist.dp_collective=reduce_loop"]),
        ("canzona", "muon", ["dist.dp_collective=coalesced"]),
        ("canzona", "muon", ["dist.dp_collective=all_to_all"]),
        ("canzona", "shampoo", ["planner.grouping=single", "planner.alpha=0.5"]),
        ("sync", "muon", ["dist.sync_variant=zero1_gather"]),
        ("canzona", "muon", ["dist.overlap_grad_reduce=false"]),
        ("canzona", "muon", ["dist.overlap_param_gather=false"]),
        ("canzona", "muon", ["optimizer.clip_grad=0"]),
        ("adamw", "adamw", ["optimizer.clip_grad=1e9"]),
    ]
    if dp > 1 and tp > 1:  # the float32 norm: reduced over DP and TP, replicated params counted once
        combos += [("canzona", "muon", [FP32_NORM]), ("sync", "muon", [FP32_NORM]), ("adamw", "adamw", [FP32_NORM])]
    return combos + pairs


def _step_parity_worker(rank: int, world: int, dp: int, tp: int, wide: bool) -> dict:
    from full_tensors import init_full_state_dict, step_from_grads

    from canzona.config import load_config
    from canzona.executor.runtime import Runtime
    from canzona.executor.timing import StepTimer
    from canzona.model.parallel import init_parallel
    from canzona.model.qwen3 import build_model, full_state_dict
    from canzona.plan.from_config import make_plan
    from canzona.program.check import compare_recorded
    from canzona.program.lower import lower_rank

    ctx = init_parallel(tp, "gloo", 60.0)
    results = {}
    for method, optimizer, extra in _combos(wide, dp, tp):
        cfg = load_config([*STEP_MODEL, f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}",
                           f"optimizer={optimizer}", *extra])
        plan = make_plan(cfg, device="cpu")
        program = lower_rank(plan, ctx.rank)
        mcfg = cfg.model_cfg()
        model = build_model(mcfg, seed=cfg.train.seed)
        runtime = Runtime(model, plan, program, cfg.optimizer, ctx)
        timer = StepTimer(ctx.device)
        recorded_ok: list[str] = []
        for step in range(1, STEPS + 1):
            full = _grads(plan.params, step, ctx.dp_rank)
            step_from_grads(runtime, [_local(full[s.name], s, tp, ctx.tp_rank) for s in plan.params], timer)
            recorded_ok += compare_recorded(program, runtime.bytes_by_tag(), with_backward=False)
        runtime.finish(timer)
        got = full_state_dict(model)
        computed: list = [None] * world
        torch.distributed.all_gather_object(computed, sorted(runtime.computed))
        # every DP replica must hold the same parameters
        flat = torch.cat([t.reshape(-1) for t in got.values()])
        replicas = [torch.empty_like(flat) for _ in range(world)]
        torch.distributed.all_gather(replicas, flat)
        key = " ".join([method, optimizer, *extra])
        if rank != 0:
            continue
        ref_params = _reference(mcfg, cfg, plan, dp)
        worst, exact = 0.0, True
        for name, want in ref_params.items():
            diff = (got[name] - want).abs().max().item()
            worst = max(worst, diff / max(want.abs().max().item(), 1e-30))
            exact = exact and torch.equal(got[name], want)
        counts = [0] * len(plan.params)
        for items in computed:
            for i in items:
                counts[i] += 1
        matrices = [counts[i] for i in range(len(plan.params)) if plan.uses_matrix_rule(i)]
        results[key] = {
            "rel": worst,
            "exact": exact,
            "moved": any(not torch.equal(got[n], w) for n, w in init_full_state_dict(mcfg, cfg.train.seed).items()),
            "replicas_equal": all(torch.equal(r, replicas[0]) for r in replicas),
            "owners": sorted(set(matrices)),
            "pair": (cfg.method.dp, cfg.method.tp),
            "recorded": recorded_ok,
        }
    return results


_REFERENCES: dict[str, dict[str, torch.Tensor]] = {}


def _reference(mcfg, cfg, plan, dp: int) -> dict[str, torch.Tensor]:
    """The single-process optimizer's parameters after `STEPS` steps on the DP-mean gradients.
    Many combos of a layout share one (every method with the same optimizer settings and
    params): computed once per worker and key -- the key holds everything the reference reads."""
    key = repr((mcfg, cfg.train.seed, cfg.optimizer, plan.params, plan.matrix_rule, dp))
    if key not in _REFERENCES:
        from full_tensors import init_full_state_dict

        from canzona.optim.owner import ReferenceOptimizer

        params = init_full_state_dict(mcfg, cfg.train.seed)
        ref = ReferenceOptimizer(list(plan.params), cfg.optimizer, matrix_rule=plan.matrix_rule)
        for step in range(1, STEPS + 1):
            ref.step(params, _mean_grads(plan.params, step, dp))
        _REFERENCES[key] = params
    return _REFERENCES[key]


def _expected_owners(pair: tuple[str, str], optimizer: str, dp: int, tp: int) -> list[int]:
    """How many ranks compute each matrix: every DP rank under ddp, else one; every TP rank under
    duplicated TP, else one (an owner per matrix); none without a matrix rule (zero1, adamw)."""
    d, t = pair
    if d == "zero1" or optimizer == "adamw":
        return []
    return [(dp if d == "ddp" else 1) * (tp if t == "duplicated" else 1)]


@pytest.fixture(scope="module", params=[*LAYOUTS, *WIDE_LAYOUTS])
def layout_results(request):
    from util import run_ranks

    wide = request.param in WIDE_LAYOUTS
    dp, tp = {**LAYOUTS, **WIDE_LAYOUTS}[request.param]
    return request.param, dp, tp, run_ranks(_step_parity_worker, dp * tp, dp, tp, wide, timeout_s=900)[0]


def test_step_parity_every_method_optimizer(layout_results) -> None:
    layout, _, _, results = layout_results
    assert len(results) == len(_combos(layout in WIDE_LAYOUTS, *{**LAYOUTS, **WIDE_LAYOUTS}[layout]))
    failures = []
    for key, r in results.items():
        close = r["exact"] or (FP32_NORM in key and r["rel"] <= FP32_NORM_REL)
        if not (close and r["moved"] and r["replicas_equal"]):
            failures.append(f"{layout} {key}: exact={r['exact']} rel={r['rel']:.2e} moved={r['moved']} "
                            f"replicas_equal={r['replicas_equal']}")
    assert not failures, "\n".join(failures)


def test_every_matrix_owned_as_the_method_says(layout_results) -> None:
    layout, dp, tp, results = layout_results
    for key, r in results.items():
        assert r["owners"] == _expected_owners(r["pair"], key.split()[1], dp, tp), f"{layout} {key}: owners {r['owners']}"


def test_executor_makes_the_calls_its_program_lists(layout_results) -> None:
    layout, _, _, results = layout_results
    problems = [f"{layout} {key}: {p}" for key, r in results.items() for p in r["recorded"]]
    assert not problems, "\n".join(problems[:20])


# ------------------------------------------------------------------ full training parity
# AdamW's first steps move each element by about lr·sign(grad); elements whose gradient is at
# rounding-noise level (which TP's reordered sums perturb) then flip sign. eps=1e-6 keeps those
# elements from dominating a check that is about the executor, not about Adam's sensitivity;
# the executor itself is bit-exact (step parity above).
TRAIN_OPT = {"muon": [], "adamw": ["optimizer.eps=1e-6"]}


@pytest.fixture(scope="module")
def reference_params(tmp_path_factory):
    """Single-process (dp=1, tp=1) parameters after 3 training steps, per optimizer."""
    from canzona.config import load_config
    from canzona.run import run_trial

    refs = {}
    for optimizer in ("muon", "adamw"):
        out = tmp_path_factory.mktemp(f"ref-{optimizer}")
        cfg = load_config([*MODEL, "train.steps=3", "train.warmup=0", "train.micro_batch=4",
                           f"optimizer={optimizer}", *TRAIN_OPT[optimizer], f"save_params={out}/p.pt"])
        run_trial(cfg, out)
        refs[optimizer] = torch.load(out / "p.pt")
    return refs


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("method", TRAIN_METHODS)
def test_three_training_steps_match_single_process(tmp_path, reference_params, layout: str, method: str) -> None:
    """Through the real trial runner. The TP layers reorder sums, and Muon's Newton-Schulz and
    AdamW's normalisation amplify those last-bit differences, so the bound is on the relative
    L2 error of the whole parameter vector (1e-5), not elementwise."""
    from canzona.config import load_config
    from canzona.run import run_trial

    dp, tp = LAYOUTS[layout]
    optimizer = "adamw" if method == "adamw" else "muon"
    cfg = load_config(
        [*MODEL, "train.steps=3", "train.warmup=0", f"train.micro_batch={4 // dp}", f"parallel.dp={dp}",
         f"parallel.tp={tp}", f"method={method}", f"optimizer={optimizer}", *TRAIN_OPT[optimizer],
         f"save_params={tmp_path}/p.pt"]
    )
    summary = run_trial(cfg, tmp_path)
    got = torch.load(tmp_path / "p.pt")
    want = reference_params[optimizer]
    assert sorted(got) == sorted(want)
    err = global_rel(got, want)
    assert err <= 1e-5, f"{method} {layout}: relative L2 difference {err:.2e}"
    moved = global_rel(init_params(cfg), want)
    assert moved > 100 * max(err, 1e-12), "training did not move the parameters enough for the check to mean anything"
    if method == "canzona" and optimizer == "muon":
        assert summary["matrix_owner_counts"] == {"min": 1, "max": 1}
        # the CPU ranks' CPU times: the step lies inside the iteration, on the same clocks
        rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
        assert all(r["iteration_thread_cpu_ms"] >= r["step_thread_cpu_ms"] > 0
                   and r["iteration_other_threads_cpu_ms"] >= r["step_other_threads_cpu_ms"] >= 0 for r in rows)
        assert summary["step_thread_cpu_ms_mean"] > 0 and summary["step_cores_busy"] > 0


def test_another_tokenizer_and_tied_output_layer_train_as_single_process(tmp_path) -> None:
    """GPT-2's vocabulary (padded as Megatron pads it) on Qwen3-8B with its output layer tied to
    the embedding, as the paper's authors trained: canzona over DP 2 matches the single process
    within the training-parity bound, and the trained state has no output layer of its own."""
    from analysis.load import model_label
    from canzona.config import load_config
    from canzona.run import run_trial

    model = [*MODEL, "model.vocab=50257", "model.tied_embeddings=true", "train.steps=3", "train.warmup=0",
             "optimizer=muon", *TRAIN_OPT["muon"]]
    got = {}
    for name, layout in (("single", ["train.micro_batch=4"]), ("dp2", ["train.micro_batch=2", "parallel.dp=2"])):
        out = tmp_path / name
        summary = run_trial(load_config([*model, *layout, f"save_params={out}/p.pt"]), out)
        got[name] = torch.load(out / "p.pt")
    assert summary["program_check"]["ok"] and model_label(summary["config"]) == "qwen3-8b/w64l2/v50257/tied"
    assert "output_layer.weight" not in got["dp2"]
    assert got["dp2"]["embedding.word_embeddings.weight"].shape[0] == 50304 // 64
    assert global_rel(got["dp2"], got["single"]) <= 1e-5


@pytest.mark.parametrize("method,extra", [("canzona", []), ("sync", []), ("canzona", ["train.recompute=full"])])
def test_sequence_parallel_trains_as_single_process(tmp_path, reference_params, method: str, extra: list[str]) -> None:
    """parallel.sequence_parallel over dp=2 x tp=2: the residual stream split over the sequence,
    all-gathers and reduce-scatters in place of the TP all-reduces, the norms' partial gradients
    summed over TP; within the training-parity bound of the single process, the executor's calls
    those of its program."""
    from canzona.config import load_config
    from canzona.run import run_trial

    cfg = load_config([*MODEL, "train.steps=3", "train.warmup=0", "train.micro_batch=2", "parallel.dp=2",
                       "parallel.tp=2", "parallel.sequence_parallel=true", f"method={method}", "optimizer=muon",
                       *extra, f"save_params={tmp_path}/p.pt"])
    summary = run_trial(cfg, tmp_path)
    assert summary["program_check"]["ok"]
    err = global_rel(torch.load(tmp_path / "p.pt"), reference_params["muon"])
    assert err <= 1e-5, f"{method} {extra}: relative L2 difference {err:.2e}"


# ------------------------------------------------------------------ bf16 training parity
BF16_MODEL = [m for m in MODEL if not m.startswith("train.dtype")] + ["train.dtype=bf16"]


@pytest.fixture(scope="module")
def bf16_references(tmp_path_factory):
    """Per optimizer: the single-process bf16 run and the single-process fp32 run, 3 steps each."""
    from canzona.config import load_config
    from canzona.run import run_trial

    refs = {}
    for optimizer in ("muon", "adamw"):
        pair = {}
        for dtype in ("bf16", "fp32"):
            out = tmp_path_factory.mktemp(f"ref-{optimizer}-{dtype}")
            model = [m for m in MODEL if not m.startswith("train.dtype")] + [f"train.dtype={dtype}"]
            cfg = load_config([*model, "train.steps=3", "train.warmup=0", "train.micro_batch=4",
                               f"optimizer={optimizer}", *TRAIN_OPT[optimizer], f"save_params={out}/p.pt"])
            run_trial(cfg, out)
            pair[dtype] = {k: v.double() for k, v in torch.load(out / "p.pt").items()}
        refs[optimizer] = pair
    return refs


@pytest.mark.parametrize("method", TRAIN_METHODS)
def test_three_bf16_training_steps_match_single_process(tmp_path, bf16_references, method: str) -> None:
    """bf16 through the real runner at dp=2 x tp=2 against the single-process bf16 run.

    Tolerance, derived: parallelism changes the order of bf16 sums (TP all-reduces of bf16
    activations, shard boundaries), a perturbation of the same nature as bf16 rounding itself.
    So the distributed bf16 run must be at least as close to the single-process bf16 run as that
    run is to the single-process fp32 run -- measured here, on the same model and steps (about
    1e-2 relative L2 for Muon on this model, against 8e-2 of parameter movement). A broken
    reduction, a wrong shard or a lost update moves the parameters by the size of an update and
    fails it.
    """
    from canzona.config import load_config
    from canzona.run import run_trial

    optimizer = "adamw" if method == "adamw" else "muon"
    cfg = load_config([*BF16_MODEL, "train.steps=3", "train.warmup=0", "train.micro_batch=2", "parallel.dp=2",
                       "parallel.tp=2", f"method={method}", f"optimizer={optimizer}", *TRAIN_OPT[optimizer],
                       f"save_params={tmp_path}/p.pt"])
    summary = run_trial(cfg, tmp_path)
    assert summary["plan"]["execution"]["dtype"] == "bfloat16" and summary["program_check"]["ok"]
    got = {k: v.double() for k, v in torch.load(tmp_path / "p.pt").items()}
    ref = bf16_references[optimizer]
    tolerance = global_rel(ref["bf16"], ref["fp32"])
    err = global_rel(got, ref["bf16"])
    moved = global_rel({k: v.to(torch.bfloat16).double() for k, v in init_params(cfg).items()}, ref["bf16"])
    assert err <= tolerance, f"{method}: {err:.2e} from the bf16 reference, bf16 itself is {tolerance:.2e} from fp32"
    assert moved > 3 * tolerance, "training did not move the parameters enough for the check to mean anything"


def test_records_state_the_dtype_of_every_collective(tmp_path) -> None:
    """docs/usage.md, "What is measured": under bf16, parameters are all-gathered in bf16 (2 bytes
    per element), gradients reduced and TP-gathered/scattered in fp32 (4), the clipping norm
    reduced in fp32 (4, the default `optimizer.clip_norm_dtype`), the step timer's barrier one fp32
    element -- checked from a trial's records (steps.jsonl's bytes per action against the
    element counts of the program re-lowered from its config.yaml)."""
    import json

    import yaml

    from canzona.config import load_config
    from canzona.plan.from_config import make_plan
    from canzona.program.lower import lower
    from canzona.run import run_trial

    cfg = load_config([*BF16_MODEL, "train.steps=1", "train.warmup=0", "parallel.dp=2", "parallel.tp=2",
                       f"out={tmp_path}"])
    run_trial(cfg, tmp_path)
    recorded = load_config(base=yaml.safe_load((tmp_path / "config.yaml").read_text()))
    programs = lower(make_plan(recorded, device="cpu"))
    want = {"param_sync": 2, "grad_reduce": 4, "gather": 4, "scatter": 4, "grad norm reduce": 4, "backward": 4,
            "step barrier": 4}  # fp32 norm; the timer's barrier: one fp32 element
    seen = set()
    for line in (tmp_path / "steps.jsonl").read_text().splitlines():
        row = json.loads(line)
        elems: dict[str, int] = {}
        for tag, call in programs[row["rank"]].calls():
            elems[tag] = elems.get(tag, 0) + call.in_elems
        for tag, (in_bytes, _out, _n) in row["comm_bytes"].items():
            kind = next(k for k in want if tag.startswith(k))
            assert in_bytes == want[kind] * elems[tag], f"{tag}: {in_bytes} bytes for {elems[tag]} elements"
            seen.add(kind)
    assert seen == set(want)


def test_gradient_accumulation_equals_data_parallelism(tmp_path) -> None:
    """Two micro-batches accumulated on one rank train exactly like two DP ranks with one each:
    the global batch is the same samples (micro-batch m of DP rank d is block d·k + m), each
    micro-batch's loss is halved (a power-of-two scale, exact) and the DP average halves the sum
    (exact too), so the bound only guards against denormals on other CPUs. Both runs use one
    thread per rank: a BLAS may block a matmul differently with another thread count (seen: 2e-6
    between 2 threads and 1 on a Xeon), which is not what this compares."""
    from canzona.config import load_config
    from canzona.run import run_trial

    got = {}
    for name, layout in (("dp", ["parallel.dp=2"]), ("accum", ["train.grad_accum=2"])):
        out = tmp_path / name
        summary = run_trial(load_config([*MODEL, "train.steps=3", "train.warmup=0", "train.micro_batch=2", *layout,
                                         "dist.threads_per_rank=1", f"save_params={out}/p.pt"]), out)
        assert summary["program_check"]["ok"]
        got[name] = torch.load(out / "p.pt")
    assert global_rel(got["accum"], got["dp"]) <= 1e-6


def test_accumulated_micro_batches_wait_for_the_overlapped_gathers_once(tmp_path) -> None:
    """With several buckets the overlapped parameter gathers are chained through the forward
    pre-hooks; only the iteration's first forward waits and dispatches (Megatron's hooks find the
    later micro-batches' gathers done): DP 2 x 2 micro-batches hands torch.distributed exactly the
    program's calls and trains bit for bit as with the gathers waited for after the step."""
    from canzona.config import load_config
    from canzona.run import run_trial

    got = {}
    for overlap in ("true", "false"):
        out = tmp_path / overlap
        summary = run_trial(load_config([*MODEL, "train.steps=3", "train.warmup=0", "train.micro_batch=1",
                                         "parallel.dp=2", "train.grad_accum=2", "bucket.size=20000",
                                         f"dist.overlap_param_gather={overlap}", f"save_params={out}/p.pt"]), out)
        assert summary["program_check"]["ok"], summary["program_check"]["mismatches"][:2]
        assert summary["plan"]["buckets"] > 2
        got[overlap] = torch.load(out / "p.pt")
    assert got["true"].keys() == got["false"].keys()
    assert all(torch.equal(got["true"][k], got["false"][k]) for k in got["true"])


def test_activation_recomputation_trains_bit_for_bit_as_without(tmp_path) -> None:
    """train.recompute=full runs each decoder layer's forward again in backward (no dropout: the
    same computation): over dp=2 x tp=2, with the overlapped gathers' pre-hooks firing in the
    recomputed forwards too, the parameters after 3 steps equal those without, bit for bit."""
    from canzona.config import load_config
    from canzona.run import run_trial

    got = {}
    for rc in ("none", "full"):
        out = tmp_path / rc
        summary = run_trial(load_config([*MODEL, "train.steps=3", "train.warmup=0", "parallel.dp=2", "parallel.tp=2",
                                         "bucket.size=20000", f"train.recompute={rc}", f"save_params={out}/p.pt"]), out)
        assert summary["program_check"]["ok"] and summary["plan"]["buckets"] > 2
        got[rc] = torch.load(out / "p.pt")
    assert all(torch.equal(got["none"][k], got["full"][k]) for k in got["none"])


def init_params(cfg) -> dict[str, torch.Tensor]:
    from full_tensors import init_full_state_dict

    return init_full_state_dict(cfg.model_cfg(), cfg.train.seed)


def test_failing_rank_ends_trial_with_its_traceback(tmp_path) -> None:
    import subprocess
    import sys
    import time

    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "canzona.run", *MODEL, "parallel.dp=2", "train.steps=2", "train.warmup=0",
         "train.fail_on_rank=1", "train.fail_at_step=1", "dist.timeout_s=20", f"out={tmp_path}"],
        capture_output=True, text=True, timeout=180,
    )
    assert r.returncode != 0
    assert "injected failure on rank 1 at step 1" in r.stderr
    # told once: the rank's traceback, not again inside the launcher's
    assert r.stderr.count("Traceback (most recent call last)") == 1, r.stderr
    assert r.stderr.count("RuntimeError: injected failure") == 1, r.stderr
    assert "trial failed: rank 1 raised" in r.stderr
    assert not (tmp_path / "summary.json").exists()
    assert time.monotonic() - start < 170  # ended by the failure, not by the test's own timeout
