"""The peer ``torchtitan_distmuon``: torchtitan 0.3.0's DistMuon on FSDP2, run as a method.

``run(cfg, out)`` starts ``parallel.dp`` local ranks (gloo on CPU, NCCL on CUDA). Each builds the
harness's own Qwen3 model at TP 1 (`canzona.model.qwen3.build_model`: the same parameter names,
shapes, seeded values), shards it with FSDP2 (``fully_shard`` per decoder layer, then the root)
over a one-axis device mesh, and trains it on the harness's synthetic batches
(`canzona.trial.rank.step_batches`) with the harness's loss: torchtitan's DistMuon
(``build_dist_muon``, every matrix ``Owned`` whole by one DP rank chosen by Newton-Schulz cost,
all-to-all to the owners and back, one bucket per decoder layer) for the parameters the harness
gives the matrix optimizer, torch's AdamW (fused, torchtitan's default implementation) for the
rest (norms; embedding and output layer unless ``model.matrix_embeddings``), and torch's
``clip_grad_norm_`` on the DTensor gradients when ``optimizer.clip_grad`` > 0.

Settings are the harness's (``optimizer.lr``, ``weight_decay``, ``momentum``, ``nesterov``,
``ns_coefficients``, ``ns_steps``, ``ns_eps``, ``lr_adjust``; AdamW's ``adamw_lr``, ``betas``,
``eps``). What DistMuon cannot run as asked is refused in one line (`check`) rather than changed:
TP > 1 (DistMuon has no Megatron TP), MoE models, an optimizer other than Muon,
``optimizer.ns_dtype=float32`` (DistMuon's Newton-Schulz is bf16 only, as torch.optim.Muon's),
``lr_adjust=none``, ``batch_equal_shapes``, ``model.split_fused`` and the float64 gradient norm.

dtype: ``train.dtype`` resolved as the harness resolves it (`canzona.devices.resolve_dtype`):
fp32 where the harness trains in fp32 (a CPU without native bf16); bf16 as FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 sharded parameters,
the equivalent of Megatron's bf16 compute with fp32 main parameters and fp32 gradient reduction.

On CPU only, two of DistMuon's CUDA-only points are shimmed at run time (`SHIM_TEXT`); site
packages are never edited and on CUDA nothing is patched.

Timing (docs/design.md §6, `canzona.executor.timing.StepTimer`: wall clock on CPU, compute-stream
events on CUDA): ``forward_ms`` (FSDP2's parameter all-gathers included), ``backward_ms`` (its
reduce-scatters, which overlap backward and are awaited at its end, included),
``optimizer_step_ms`` from "gradients reduced" to "every parameter updated" (clipping, DistMuon's
step with its all-to-alls, AdamW), ``clip_grad_ms``. FSDP2 exposes no separate exposed gradient
reduction or parameter sync: ``grad_reduce_ms``, ``param_sync_ms`` and the executor's
gather/compute/scatter/apply phases are null.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError
from canzona.host_memory import POLICY
from canzona.peers import PEERS, PeerRun

NAME = "torchtitan_distmuon"
MESH_AXIS = "dp_shard"  # FSDP2's mesh axis; DistMuon's Owned compute layout names it
LR_ADJUSTS = ("original", "match_rms_adamw")  # the harness's names DistMuon's adjust_lr_fn takes as they are
TORCHTITAN = "torchtitan==0.3.0"
SHIM_TEXT = (
    "CPU only (on CUDA nothing is patched), applied at run time in the peer's ranks, site-packages untouched: "
    "(1) DistMuon._validate_parameter_storage (torchtitan/distributed/flex_shard/dist_muon.py:358-368) refuses "
    "parameters not on one CUDA device; the shim accepts DTensor parameters whose local shards are all on one CPU "
    "device and returns that device (the same checks otherwise). "
    "(2) _CommunicationContext.create (torchtitan/distributed/flex_shard/_optimizer_reshard_runtime.py:267) builds "
    "its transfer stream as Stream(device=..., priority=0), keyword arguments torch.cpu.Stream does not take; "
    "the shim lets torch.cpu.Stream take and ignore them during that call (torch.cpu.Stream and torch.cpu.Event "
    "are torch's no-op placeholders: gloo collectives and CPU maths are synchronous). "
    "Neither changes any arithmetic, any collective or the owner assignment."
)


def check(cfg: Any) -> None:
    """ConfigError in one line for what DistMuon on FSDP2 cannot run as the harness asks."""
    m = cfg.model_cfg()
    opt = cfg.optimizer
    if cfg.parallel.tp != 1:
        raise ConfigError(f"method={NAME} runs over data parallelism only (FSDP2; DistMuon has no Megatron TP): "
                          f"parallel.tp={cfg.parallel.tp}; allowed: parallel.tp=1 with any parallel.dp")
    if m.moe:
        raise ConfigError(f"method={NAME} runs the dense Qwen3 models; {cfg.model.name} is MoE")
    if opt.name != "muon":
        raise ConfigError(f"method={NAME} runs torchtitan's DistMuon; optimizer={opt.name} is not it "
                          f"(allowed: optimizer=muon)")
    if opt.ns_dtype != "bfloat16":
        raise ConfigError(f"optimizer.ns_dtype={opt.ns_dtype}: DistMuon's Newton-Schulz runs in bf16 only (as "
                          f"torch.optim.Muon's); allowed with method={NAME}: optimizer.ns_dtype=bfloat16")
    if opt.lr_adjust not in LR_ADJUSTS:
        raise ConfigError(f"optimizer.lr_adjust={opt.lr_adjust} has no DistMuon adjust_lr_fn; allowed with "
                          f"method={NAME}: {', '.join(LR_ADJUSTS)}")
    if opt.batch_equal_shapes:
        raise ConfigError(f"optimizer.batch_equal_shapes=true: DistMuon orthogonalises each whole matrix alone; "
                          f"allowed with method={NAME}: false")
    if cfg.model.split_fused:
        raise ConfigError(f"model.split_fused=true: DistMuon orthogonalises the fused QKV and gate/up matrices "
                          f"whole; allowed with method={NAME}: model.split_fused=false")
    if opt.clip_norm_dtype != "float32":
        raise ConfigError(f"optimizer.clip_norm_dtype={opt.clip_norm_dtype}: FSDP2 clips with torch's fp32 "
                          f"clip_grad_norm_; allowed with method={NAME}: float32")
    if cfg.parallel.ep != 1:
        raise ConfigError(f"parallel.ep={cfg.parallel.ep}: method={NAME} has no expert parallelism; allowed: 1")


def settings(cfg: Any, dtype: str) -> dict[str, Any]:
    """What the ranks run: DistMuon's and AdamW's arguments, translated from the harness's keys."""
    opt = cfg.optimizer
    return {
        "dist_muon": {"lr": opt.lr, "weight_decay": opt.weight_decay, "momentum": opt.momentum,
                      "nesterov": bool(opt.nesterov), "ns_coefficients": list(opt.ns_coefficients),
                      "eps": opt.ns_eps, "ns_steps": opt.ns_steps, "adjust_lr_fn": opt.lr_adjust,
                      "compute_layout": f"Owned() on mesh axis {MESH_AXIS!r} (whole matrix, one owner by cost)",
                      "buckets": "one per decoder layer (+ one for the embedding/output layer when they are "
                                 "matrices), layer order", "newton_schulz_dtype": "bfloat16"},
        "adamw": {"impl": "torch.optim.AdamW(fused=True)", "lr": opt.adamw_lr, "betas": list(opt.betas),
                  "eps": opt.eps, "weight_decay": opt.weight_decay},
        "clip_grad": {"max_norm": opt.clip_grad, "impl": "torch.nn.utils.clip_grad_norm_ (fp32, DTensor)"
                      if opt.clip_grad > 0 else "off"},
        "fsdp": {"fully_shard": "each decoder layer, then the root", "reshard_after_forward": True,
                 "mesh_axis": MESH_AXIS, "grad_accum": cfg.train.grad_accum,
                 "gradient_sync": "last micro-batch only (set_requires_gradient_sync)"},
        "dtype": ("bf16 compute (MixedPrecisionPolicy param_dtype=bf16, reduce_dtype=fp32) over fp32 sharded "
                  "parameters" if dtype == "bfloat16" else "fp32 parameters, compute and reduction"),
        "weight_decay_on": "every parameter", "lr": "constant per optimizer",
        "matrix_params": "the harness's matrix parameters (spec.kind == 'matrix')",
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import torch

    out = {"torch": torch.__version__}
    for pkg in ("torchtitan", "spmd_types"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - not installed: the run fails on import with the install line
            out[pkg] = "missing"
    return out


def _require_torchtitan() -> None:
    try:
        import torchtitan.distributed.flex_shard  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"method={NAME} needs torchtitan 0.3.0 ({e}); install it with: python -m pip install "
                          f"--no-deps {TORCHTITAN} spmd_types==0.2.3 tyro (scripts/setup.sh does)") from None


def run(cfg: Any, out: Path) -> PeerRun:
    """Run ``cfg`` with FSDP2 + torchtitan's DistMuon on ``parallel.dp`` local ranks; their rows
    sorted by (step, rank) and what ran."""
    import torch.multiprocessing as mp

    from canzona import dist_rules, pythonpath_with_checkout
    from canzona.devices import resolve_dtype
    from canzona.net import free_port
    from canzona.plan.from_config import threads_per_rank, trial_device
    from canzona.trial import lifeline
    from canzona.trial.launch import stop_ranks

    check(cfg)
    _require_torchtitan()
    kind = trial_device(cfg, required=True)
    dtype, _why = resolve_dtype(cfg.train.dtype, kind)
    out = Path(out)
    work = out / "peer"
    work.mkdir(parents=True, exist_ok=True)
    for old in [*work.glob("rank*.jsonl"), work / "rank0-info.json"]:
        old.unlink(missing_ok=True)
    dp = cfg.parallel.dp
    threads = threads_per_rank(cfg)
    # as canzona.trial.launch: forkserver on CPU (torch and the model imported once), spawn on CUDA
    start_method = "spawn" if kind == "cuda" else "forkserver"
    if start_method == "forkserver":
        mp.set_forkserver_preload(["canzona.model.qwen3", "torchtitan.distributed.flex_shard"])
    os.environ["PYTHONPATH"] = pythonpath_with_checkout(os.environ.get("PYTHONPATH"))
    ctx = mp.start_processes(
        _rank_main, args=(cfg, str(work), kind, dtype, threads, free_port(), dp, lifeline.identity(),
                          os.environ.get(dist_rules.ENV, "")),
        nprocs=dp, join=False, start_method=start_method,
    )
    try:
        while not ctx.join():
            pass
    except KeyboardInterrupt:
        stop_ranks(ctx.processes)
        raise
    rows: list[dict[str, Any]] = []
    for r in range(dp):
        rows += [json.loads(line) for line in (work / f"rank{r}.jsonl").read_text().splitlines() if line]
    info = json.loads((work / "rank0-info.json").read_text())
    meta = {
        "peer": NAME, "follows": PEERS[NAME].follows, "versions": versions(), "settings": settings(cfg, dtype),
        "shim": SHIM_TEXT if kind == "cpu" else None, "env": sys.executable,
        "host_allocator": POLICY if kind == "cpu" else None,
        "backend": info["backend"], "device": kind, "device_name": info["device_name"],
        "peak_memory_mb": info["peak_memory_mb"], "torch_threads": threads,
        "owners": info["owners"],
    }
    return PeerRun(rows=sorted(rows, key=lambda row: (row["step"], row["rank"])), meta=meta)


# ------------------------------------------------------------------ the CPU shim


@contextlib.contextmanager
def cpu_shim() -> Any:
    """Patch DistMuon's two CUDA-only points for CPU ranks (see `SHIM_TEXT`); undone on exit."""
    import torch
    from torch.distributed.tensor import DTensor
    from torchtitan.distributed.flex_shard import _optimizer_reshard_runtime as runtime
    from torchtitan.distributed.flex_shard import dist_muon

    def validate_storage_cpu(self: Any) -> torch.device:
        devices = set()
        for group in self.param_groups:
            for p in group["params"]:
                if not isinstance(p, DTensor):
                    raise TypeError("DistMuon requires DTensor parameters")
                devices.add(p.to_local().device)
        if len(devices) != 1:
            raise ValueError(f"DistMuon needs the parameters on one device per process, got {sorted(map(str, devices))}")
        return devices.pop()

    original_create = runtime._CommunicationContext.create.__func__

    class _Stream(torch.cpu.Stream):  # torch's CPU placeholder, taking CUDA's keyword arguments
        def __init__(self, device: Any = None, priority: int = -1) -> None:
            super().__init__(priority)

    def create(cls: Any, device: torch.device) -> Any:
        if torch.device(device).type != "cpu":
            return original_create(cls, device)
        saved = torch.cpu.Stream
        torch.cpu.Stream = _Stream
        try:
            return original_create(cls, device)
        finally:
            torch.cpu.Stream = saved

    saved_validate = dist_muon.DistMuon._validate_parameter_storage
    dist_muon.DistMuon._validate_parameter_storage = validate_storage_cpu
    runtime._CommunicationContext.create = classmethod(create)
    try:
        yield
    finally:
        dist_muon.DistMuon._validate_parameter_storage = saved_validate
        runtime._CommunicationContext.create = classmethod(original_create)


# ------------------------------------------------------------------ one rank


def _rank_main(local_rank: int, cfg: Any, work: str, kind: str, dtype: str, threads: int, port: int, world: int,
               launcher: tuple[int, str | None], rules: str) -> None:
    from canzona import dist_rules
    from canzona.trial import lifeline

    lifeline.watch(launcher)  # forked from the forkserver: nothing else ends this rank with its launcher
    # the forkserver keeps the environment it started with: what a rank needs travels as arguments
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(world),
                      OMP_NUM_THREADS=str(threads), **{dist_rules.ENV: rules})
    run_rank(cfg, Path(work), kind, dtype, threads)


def build(cfg: Any, device: Any, dtype: str) -> tuple[Any, Any, Any, list[str]]:
    """This rank's FSDP2 model (the harness's Qwen3 at TP 1, seeded as the harness seeds it) and
    its optimizers: (model, DistMuon, AdamW or None, the matrix names). The process group and
    Megatron's TP-1 groups must be up (`canzona.model.parallel.init_parallel`)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torchtitan.distributed.flex_shard import build_dist_muon
    from torchtitan.distributed.flex_shard.optimizer_reshard import BucketConfig, ComputeLayout, Owned

    from canzona.model.qwen3 import build_model

    mcfg = cfg.model_cfg()
    model = build_model(mcfg, device=device, seed=cfg.train.seed, dtype=torch.float32,
                        recompute=cfg.train.recompute == "full")
    specs = {s.name: s for s in model.param_specs()}
    mesh = init_device_mesh(device.type, (cfg.parallel.dp,), mesh_dim_names=(MESH_AXIS,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if dtype == "bfloat16" else MixedPrecisionPolicy())
    for layer in model.decoder.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    named = list(model.named_parameters())
    matrices = [(n, p) for n, p in named if specs[n].kind == "matrix"]
    rest = [p for n, p in named if specs[n].kind != "matrix"]
    names = [n for n, _ in matrices]
    buckets = [BucketConfig(patterns=tuple(n for n in names if n.startswith(f"decoder.layers.{i}.")),
                            name=f"layers.{i}") for i in range(mcfg.num_layers)]
    outside = tuple(n for n in names if not n.startswith("decoder.layers."))
    if outside:
        buckets.append(BucketConfig(patterns=outside, name="embedding_output"))
    opt = cfg.optimizer
    owned = ComputeLayout(shardings_by_mesh_axis={MESH_AXIS: Owned()})
    muon = build_dist_muon(
        [{"params": [p for _, p in matrices], "param_names": names}],
        compute_sharding_by_fqn={n: owned for n in names}, bucket_configs=[b for b in buckets if b.patterns],
        lr=opt.lr, weight_decay=opt.weight_decay, momentum=opt.momentum, nesterov=bool(opt.nesterov),
        ns_coefficients=tuple(opt.ns_coefficients), eps=opt.ns_eps, ns_steps=opt.ns_steps,
        adjust_lr_fn=opt.lr_adjust,
    )
    adamw = torch.optim.AdamW(rest, lr=opt.adamw_lr, betas=tuple(opt.betas), eps=opt.eps,
                              weight_decay=opt.weight_decay, fused=True) if rest else None
    return model, muon, adamw, names


def owners(muon: Any) -> dict[str, list[int]]:
    """The ranks DistMuon's plan computes each matrix on (its Owned plan: one), read from its
    bucket plans; a matrix already whole on this rank (DP 1) is computed where it is."""
    import torch.distributed as dist

    found: dict[str, list[int]] = {}
    for plan in getattr(muon, "_bucket_plans", ()):
        for item in getattr(plan, "unredistributed_items", getattr(plan, "items", ())):
            found[item.fqn] = [dist.get_rank()]
        for item, redist in zip(getattr(plan, "redistributed_items", ()), getattr(plan, "redistribution_plans", ())):
            found[item.fqn] = [part.participant for part in redist.compute_partitions if part.logical_regions]
    return found


def run_rank(cfg: Any, work: Path, kind: str, dtype: str, threads: int) -> None:
    """One rank: set up, train ``train.warmup + train.steps`` steps, write its rows (and, on rank
    0, the saved parameters and the run's info)."""
    import torch
    import torch.distributed as dist

    from canzona import dist_rules
    from canzona.executor.timing import StepTimer
    from canzona.host_memory import retain_freed_memory
    from canzona.model.parallel import destroy_parallel, init_parallel
    from canzona.records import atomic_torch_save
    from canzona.trial.rank import step_batches
    from canzona.trial.summary import device_name, peak_memory_mb

    dist_rules.install_from_env()
    torch.set_num_threads(threads)
    if kind == "cpu":  # as the harness's CPU ranks run (`canzona.host_memory`)
        retain_freed_memory()
    ctx = init_parallel(1, kind, cfg.dist.timeout_s)
    shim = cpu_shim() if kind == "cpu" else contextlib.nullcontext()
    try:
        with shim:
            model, muon, adamw, _names = build(cfg, ctx.device, dtype)
            rows = train(cfg, model, muon, adamw, ctx, StepTimer(ctx.device), step_batches)
            full = None
            if cfg.save_params:  # gathered (a collective: every rank), fp32, the harness's names and order
                full = {n: p.full_tensor().detach().float().cpu() for n, p in model.named_parameters()}
        if full is not None and ctx.rank == 0:
            atomic_torch_save(full, Path(cfg.save_params))
        with open(work / f"rank{ctx.rank}.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        if ctx.rank == 0:
            info = {"backend": ctx.backend, "device_name": device_name(ctx.device),
                    "peak_memory_mb": peak_memory_mb(ctx.device), "owners": owners(muon)}
            (work / "rank0-info.json").write_text(json.dumps(info))
        dist.barrier()  # DistMuon's ranks must all be done before the group goes
    finally:
        destroy_parallel()


def train(cfg: Any, model: Any, muon: Any, adamw: Any, ctx: Any, timer: Any, batches_of: Any) -> list[dict[str, Any]]:
    """The step loop; one row of `canzona.records.STEP_FIELDS` per step."""
    import torch
    import torch.distributed as dist

    k = cfg.train.grad_accum
    clip = cfg.optimizer.clip_grad
    params = [p for p in model.parameters()]
    rows = []
    for step in range(cfg.train.warmup + cfg.train.steps):
        batches = [tuple(t.to(ctx.device) for t in b) for b in batches_of(cfg, step, ctx.dp_rank, ctx.dp)]
        timer.reset()
        losses = []
        for m, (tokens, labels) in enumerate(batches):
            model.set_requires_gradient_sync(m == k - 1)  # reduce-scatter once, after the last micro-batch
            with timer.phase("forward"):
                loss = model(tokens, labels)
            losses.append(loss.detach().float())
            with timer.phase("backward"):
                (loss / k if k > 1 else loss).backward()
        if cfg.dist.step_barrier and ctx.dp > 1:  # the harness's timer barrier (torchtitan's own has none)
            with timer.phase("barrier"):
                dist.barrier()
        timer.mark("step_start")
        if clip > 0:
            with timer.phase("clip_grad"):
                torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        with timer.phase("dist_muon_step"):
            muon.step()
        if adamw is not None:
            with timer.phase("adamw_step"):
                adamw.step()
        timer.mark("step_end")
        muon.zero_grad(set_to_none=True)
        if adamw is not None:
            adamw.zero_grad(set_to_none=True)
        timer.mark("end")
        timer.finish()
        global_loss = torch.stack(losses).mean()
        dist.all_reduce(global_loss)
        ms = timer.ms
        rows.append({
            "step": step, "measured": step >= cfg.train.warmup, "rank": ctx.rank, "dp_rank": ctx.dp_rank,
            "tp_rank": 0, "iteration_ms": timer.at("end"), "forward_ms": ms.get("forward", 0.0),
            "backward_ms": ms.get("backward", 0.0), "grad_reduce_ms": None, "barrier_ms": ms.get("barrier", 0.0),
            "clip_grad_ms": ms.get("clip_grad", 0.0) if clip > 0 else 0.0,
            "optimizer_step_ms": timer.between("step_start", "step_end"), "step_start_ms": timer.at("step_start"),
            "gather_ms": None, "compute_ms": None, "scatter_ms": None, "apply_ms": None, "param_sync_ms": None,
            "wait_ms": None, "param_gather_ms": None, "param_sync_peer_ms": None, "compute_load": None,
            "loss": float(global_loss) / ctx.dp,
            "dist_muon_step_ms": ms.get("dist_muon_step", 0.0), "adamw_step_ms": ms.get("adamw_step", 0.0),
            "events": timer.events,
        })
    return rows
