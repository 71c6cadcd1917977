"""The Megatron peers' worker: megatron-core 0.19.2's own optimizers, run inside the peer environment.

Run as ``<peer python> megatron_worker.py CONFIG.json`` (`canzona.peers.megatron` writes the JSON
and starts it). It is stand-alone on purpose: it runs under Python >= 3.12 with torch and
megatron-core 0.19.2 only, so it imports nothing from canzona; what it needs of the harness (the
resolved Qwen3 shapes, the step-record field names, the synthetic-data rule) arrives in the JSON
or is copied here (`synthetic_batch`: canzona/model/data.py's rule, same seed -> same tokens).

The main process spawns one process per rank (gloo on CPU, NCCL on GPUs). Each rank builds
megatron's own stack as megatron.training does: parallel_state, GPTModel configured as the
harness's Qwen3 (GQA, q/k RMSNorm, SwiGLU, RMSNorm, no bias, rotary, the config's tying) in bf16
(Float16Module), megatron's DistributedDataParallel with the distributed optimizer, and
get_megatron_optimizer: ``megatron_layerwise`` = Muon (TensorParallelMuon) under
LayerWiseDistributedOptimizer with its shard-aligned parameter layout, ``megatron_zero1`` = AdamW
under DistributedOptimizer. It writes ``rank<r>.jsonl``: one row per step with the keys the JSON
lists (the harness's STEP_FIELDS), null where Megatron exposes no such phase.

On a machine without CUDA, `install_cpu_shim` lets megatron's CUDA-only code run on the CPU. It
moves tensors, never changes arithmetic: factory calls asking for ``cuda`` allocate on the CPU,
``Tensor.cuda()`` is the identity, CPU float tensors report ``torch.cuda.*Tensor`` to
``Tensor.type()`` (the bf16 optimizer wrapper's type check), the CUDA RNG tracker keeps CPU RNG
states it never applies (every dropout is 0), and ``torch.cuda`` stream / synchronize /
current_device / empty_cache calls are no-ops (the CPU runs one stream, in order).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Run as a script, this folder is sys.path[0], where canzona/peers/megatron.py would shadow the
# megatron package: drop it (spawned ranks inherit the path).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

SHIM_TEXT = (
    "CPU shim (no CUDA device): factory calls with device='cuda' allocate on the CPU and Tensor.cuda() is "
    "the identity; CPU float tensors report torch.cuda.*Tensor to Tensor.type() (megatron's bf16 optimizer "
    "check); the CUDA RNG tracker holds CPU RNG states it never applies (dropout is 0); torch.cuda "
    "current_device/synchronize/current_stream/Stream/stream/empty_cache are no-ops. It moves tensors to "
    "the CPU and changes no arithmetic: every kernel megatron calls is the CPU kernel of the same op."
)


# ---------------------------------------------------------------- the harness's synthetic data
def _seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(map(str, ("canzona-data", *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def synthetic_batch(vocab: int, micro_batch: int, seq_len: int, seed: int, step: int, dp_rank: int = 0,
                    noise: float = 0.25):
    """canzona/model/data.py's `synthetic_batch` (same seed, step and rows -> the same tokens)."""
    import torch

    n = seq_len + 1
    rand_tok = torch.empty(micro_batch, n, dtype=torch.int64)
    restart = torch.empty(micro_batch, n, dtype=torch.bool)
    for j in range(micro_batch):
        g = torch.Generator().manual_seed(_seed(seed, step, dp_rank * micro_batch + j))
        rand_tok[j] = torch.randint(0, vocab, (n,), generator=g)
        restart[j] = torch.rand(n, generator=g) < noise
    restart[:, 0] = True
    succ = torch.randperm(vocab, generator=torch.Generator().manual_seed(_seed(seed, "perm")))
    seq = torch.empty_like(rand_tok)
    seq[:, 0] = rand_tok[:, 0]
    for t in range(1, n):
        seq[:, t] = torch.where(restart[:, t], rand_tok[:, t], succ[seq[:, t - 1]])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def grid_grad(name: str, shape: tuple[int, ...], step: int, dp_rank: int):
    """A test gradient of a full parameter on a 2^-12 grid, |g| < 2^-4 (sums of a few are exact in
    fp32 in any order); the step-parity test makes the same ones (`tests/peers`)."""
    import torch

    g = torch.Generator().manual_seed(_seed("peer-grad", name, step, dp_rank))
    return torch.randint(-255, 256, shape, generator=g).float() / 4096


# ---------------------------------------------------------------- CPU shim
def install_cpu_shim() -> None:
    """Let megatron's CUDA-only code run on the CPU (see the module docstring); moves, never computes."""
    import torch

    def cpu(device: Any) -> Any:
        if isinstance(device, int) and not isinstance(device, bool):
            return "cpu"
        if isinstance(device, torch.device) and device.type == "cuda":
            return "cpu"
        if isinstance(device, str) and device.startswith("cuda"):
            return "cpu"
        return device

    def factory(fn):
        def wrapped(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            return fn(*args, **kwargs)
        wrapped.__wrapped__ = fn
        return wrapped

    for name in ("empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn", "randint", "empty_like",
                 "zeros_like", "ones_like", "full_like", "as_tensor", "empty_strided", "eye", "linspace"):
        setattr(torch, name, factory(getattr(torch, name)))

    to = torch.Tensor.to

    def tensor_to(self, *args, **kwargs):
        args = tuple(cpu(a) if isinstance(a, (str, torch.device)) or type(a) is int else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = cpu(kwargs["device"])
        return to(self, *args, **kwargs)

    torch.Tensor.to = tensor_to
    torch.Tensor.cuda = lambda self, *a, **k: self
    type_of = torch.Tensor.type

    def tensor_type(self, *args, **kwargs):
        out = type_of(self, *args, **kwargs)
        if not args and not kwargs and isinstance(out, str) and out.startswith("torch.") and self.is_floating_point():
            return out.replace("torch.", "torch.cuda.", 1)
        return out

    torch.Tensor.type = tensor_type

    class _Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def wait_event(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def record_event(self, *a, **k):
            return None

    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.default_stream = lambda *a, **k: _Stream()
    torch.cuda.Stream = _Stream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.empty_cache = lambda: None
    torch.cuda.manual_seed = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._set_cuda_rng_state = lambda *a, **k: None


# ---------------------------------------------------------------- timing
class Phases:
    """Phase marks: wall clock on CPU, CUDA events on the current stream on GPUs (read at the end)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        import torch

        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[name] = ev
        else:
            self.marks[name] = time.perf_counter()

    def ms(self, a: str, b: str) -> float:
        if self.cuda:
            return float(self.marks[a].elapsed_time(self.marks[b]))
        return (self.marks[b] - self.marks[a]) * 1e3


class Accumulator:
    """Time spent inside wrapped calls (outermost only), for the phases Megatron runs inside others:
    clipping inside optimizer.step(), the parameter all-gather inside it when not overlapped."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.total = 0.0
        self.calls = 0
        self.depth = 0

    def wrap(self, fn):
        def wrapped(*args, **kwargs):
            import torch

            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.cuda:
                    torch.cuda.synchronize()
                self.total += (time.perf_counter() - t0) * 1e3
                self.calls += 1
                self.depth -= 1
        return wrapped

    def take(self) -> float | None:
        out = self.total if self.calls else None
        self.total, self.calls = 0.0, 0
        return out


def _leaf_optimizers(optimizer) -> list[Any]:
    """The MixedPrecision/DistributedOptimizers under megatron's (possibly nested) ChainedOptimizer."""
    subs = getattr(optimizer, "chained_optimizers", None)
    if subs is None:
        return [optimizer]
    return [leaf for sub in subs for leaf in _leaf_optimizers(sub)]


def _time_step_parts(optimizer, cuda: bool) -> dict[str, Accumulator]:
    """Accumulators inside ``optimizer.step()``, in the harness's step phases (canzona/records.py):
    ``compute``: the torch optimizers' own steps (Muon's update with its Newton–Schulz, Adam on the
    other params), less the TP gathers; ``apply``: the bf16 wrapper's copy of the fp32 main params
    into the model; ``ns_tp`` / ``ns``: Muon's ``newton_schulz_tp`` and the ``newton_schulz`` inside
    it, whose difference is the duplicated mode's all-gather of each matrix over TP (with its
    concatenation and slicing): the step's ``gather``. Wrapping adds a Python call per matrix and
    changes no arithmetic."""
    parts = {k: Accumulator(cuda) for k in ("compute", "apply", "ns_tp", "ns")}
    for leaf in _leaf_optimizers(optimizer):
        inner = getattr(leaf, "optimizer", None)
        if inner is not None and hasattr(inner, "step"):
            inner.step = parts["compute"].wrap(inner.step)
        if hasattr(leaf, "_copy_main_params_to_model_params"):
            leaf._copy_main_params_to_model_params = parts["apply"].wrap(leaf._copy_main_params_to_model_params)
    try:
        from emerging_optimizers.orthogonalized_optimizers import muon_utils
        from megatron.core.optimizer import emerging_optimizers as eo
    except ImportError:  # an AdamW-only install: no Muon to time
        return parts
    if hasattr(eo, "newton_schulz_tp"):
        eo.newton_schulz_tp = parts["ns_tp"].wrap(eo.newton_schulz_tp)
        muon_utils.newton_schulz = parts["ns"].wrap(muon_utils.newton_schulz)
    return parts


# ---------------------------------------------------------------- one rank
def _short(name: str) -> str:
    """A parameter's name without the DDP / Float16Module wrappers' ``module.`` prefixes."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def build(cfg: dict[str, Any], cuda: bool):
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    m, tr, opt, peer = cfg["model"], cfg["train"], cfg["optimizer"], cfg["peer"]
    layerwise = cfg["method"] == "megatron_layerwise"
    tp = cfg["tp"]
    torch.manual_seed(tr["seed"])  # CPU initialisation: the full master weights, the same on every rank
    model_parallel_cuda_manual_seed(tr["seed"])
    tcfg = TransformerConfig(
        num_layers=m["num_layers"], hidden_size=m["hidden"], ffn_hidden_size=m["ffn"],
        num_attention_heads=m["heads"], num_query_groups=m["kv_heads"], kv_channels=m["head_dim"],
        normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=False, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, tensor_model_parallel_size=tp,
        sequence_parallel=bool(cfg.get("sequence_parallel")) and tp > 1, use_cpu_initialization=True,
        init_method_std=0.02, bias_activation_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
        recompute_granularity="full" if tr.get("recompute") == "full" else None,
        recompute_method="uniform" if tr.get("recompute") == "full" else None,
        recompute_num_layers=1 if tr.get("recompute") == "full" else None,
    )
    model = GPTModel(
        tcfg, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"), vocab_size=m["vocab"],
        max_sequence_length=tr["seq_len"], share_embeddings_and_output_weights=m["tied_embeddings"],
        position_embedding_type="rope", rotary_base=1_000_000, parallel_output=True,
    )
    if cuda:
        model.cuda(torch.cuda.current_device())
    model = Float16Module(tcfg, model)
    d = cfg["ddp"]
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=d["overlap_grad_reduce"],
        overlap_param_gather=d["overlap_param_gather"], use_distributed_optimizer=True,
        bucket_size=d["bucket_size"], average_in_collective=False,
    )
    layout = None
    if layerwise:  # 0.19's shard-aligned layout: whole matrices per DP shard, reduce-scatter + all-gather
        from megatron.core.optimizer.layer_wise_optimizer import (
            LayerWiseDistributedOptimizer,
            tag_params_for_buffer_routing,
        )

        tag_params_for_buffer_routing([model])
        layout = LayerWiseDistributedOptimizer.compute_full_param_layout(
            [p for p in model.parameters() if p.requires_grad],
            d["bucket_size"] if d["overlap_grad_reduce"] else None,
            parallel_state.get_data_parallel_world_size(with_context_parallel=True), ddp_cfg)
    ddp = DistributedDataParallel(tcfg, ddp_cfg, model, full_param_layout=layout)
    common = dict(lr=opt["lr"], min_lr=opt["lr"], weight_decay=opt["weight_decay"], bf16=True,
                  params_dtype=torch.bfloat16, clip_grad=opt["clip_grad"], use_distributed_optimizer=True,
                  adam_beta1=opt["betas"][0], adam_beta2=opt["betas"][1], adam_eps=opt["eps"],
                  decoupled_weight_decay=True)
    if layerwise:
        ocfg = OptimizerConfig(
            optimizer="muon", use_layer_wise_distributed_optimizer=True, muon_momentum=opt["momentum"],
            muon_nesterov=opt["nesterov"], muon_num_ns_steps=opt["ns_steps"],
            muon_coefficient_type=peer["coefficient_type"], muon_scale_mode=peer["scale_mode"],
            muon_extra_scale_factor=peer["extra_scale_factor"], muon_fp32_matmul_prec=peer["ns_matmul_prec"],
            muon_tp_mode=peer["tp_mode"], muon_split_qkv=peer["split_qkv"],
            overlap_param_gather=d["overlap_param_gather"], **common)
    else:
        ocfg = OptimizerConfig(optimizer="adam", overlap_param_gather=d["overlap_param_gather"], **common)
        ocfg.lr = ocfg.min_lr = opt["adamw_lr"]
    # {}: every parameter decays, as the harness's AdamW does (megatron's standard overrides would
    # exempt biases and norms)
    optimizer = get_megatron_optimizer(ocfg, [ddp], config_overrides={})
    for group in optimizer.param_groups:  # a constant schedule: the harness's lr per optimizer
        group["lr"] = opt["lr"] if layerwise and group.get("optimizer", "muon") == "muon" else opt["adamw_lr"]
    return ddp, optimizer


def _muon_managed(param) -> bool:
    return param.dim() == 2 and not getattr(param, "is_embedding_or_output_parameter", False)


def _main_params(optimizer, ddp) -> dict[str, Any]:
    """name -> this rank's fp32 main parameter (its TP shard) of every Muon-managed matrix it owns."""
    names = {p: _short(n) for n, p in ddp.named_parameters()}
    out: dict[str, Any] = {}
    stack = [optimizer]
    while stack:
        o = stack.pop()
        stack += list(getattr(o, "chained_optimizers", []))
        for model_group, main_group in zip(getattr(o, "float16_groups", []), getattr(o, "fp32_from_float16_groups", [])):
            for p, main in zip(model_group, main_group):
                if p in names and _muon_managed(p):
                    out[names[p]] = main.detach().float().cpu().clone()
    return out


def _full(local, param, tp: int, tp_group):
    """A parameter's full tensor from its TP shards (gathered over the TP group)."""
    import torch
    import torch.distributed as dist

    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return local
    parts = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(parts, local.contiguous(), group=tp_group)
    return torch.cat(parts, dim=param.partition_dim)


def rank_main(rank: int, cfg: dict[str, Any], port: int) -> None:
    import torch

    world = cfg["dp"] * cfg["tp"]
    cuda = cfg["device"] == "cuda"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(cfg["threads_per_rank"])
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        install_cpu_shim()
    import datetime

    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg["timeout_s"]))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=cfg["tp"])
    try:
        _train(rank, cfg, cuda)
    finally:
        dist.barrier()
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _train(rank: int, cfg: dict[str, Any], cuda: bool) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.optimizer import layer_wise_optimizer as lw_mod
    from megatron.core.optimizer import optimizer as opt_mod

    dp_rank = parallel_state.get_data_parallel_rank()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_group = parallel_state.get_tensor_model_parallel_group()
    dp_group = parallel_state.get_data_parallel_group()
    ddp, optimizer = build(cfg, cuda)
    tr, dp, tp = cfg["train"], cfg["dp"], cfg["tp"]
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    clip = Accumulator(cuda)  # gradient norm and clipping inside optimizer.step()
    for mod in (opt_mod, lw_mod):
        for fn in ("get_grad_norm_fp32", "clip_grad_by_total_norm_fp32"):
            if hasattr(mod, fn):
                setattr(mod, fn, clip.wrap(getattr(mod, fn)))
    psync = Accumulator(cuda)  # the parameter all-gather megatron runs inside step() when not overlapped
    ddp.start_param_sync = psync.wrap(ddp.start_param_sync)
    inner = _time_step_parts(optimizer, cuda)
    # the overlapped gather's exposed part: the waits in the next forward's pre-hooks (booked as
    # param_sync and taken out of the forward, as the harness's timer does)
    fsync = Accumulator(cuda)
    for bg in list(ddp.bucket_groups) + list(getattr(ddp, "expert_parallel_bucket_groups", [])):
        bg.finish_param_sync = fsync.wrap(bg.finish_param_sync)

    grid = cfg.get("grid_grads")  # test hook: install gradients instead of forward/backward
    named = [(_short(n), p) for n, p in ddp.named_parameters() if p.requires_grad]
    snapshots: dict[str, Any] = {}
    if cfg.get("save_params"):
        snapshots["init"] = {n: _full(p.detach().float().cpu(), p, tp, tp_group) for n, p in named}
    fields = cfg["step_fields"]
    out = Path(cfg["out"])
    rows = []
    k = tr["grad_accum"]
    for step in range(tr["warmup"] + tr["steps"]):
        ph = Phases(cuda)
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        losses = []
        fwd = bwd = 0.0
        fwd_sync = None
        ph.mark("start")
        if grid:
            for n, p in named:
                full_shape = list(p.shape)
                if tp > 1 and getattr(p, "tensor_model_parallel", False):
                    full_shape[p.partition_dim] *= tp
                g = grid_grad(n, tuple(full_shape), step, dp_rank)
                if tp > 1 and getattr(p, "tensor_model_parallel", False):
                    g = g.chunk(tp, dim=p.partition_dim)[tp_rank]
                p.main_grad.copy_(g.to(device))
            losses.append(torch.zeros((), device=device))
            ph.mark("bwd_end")
        else:
            for mb in range(k):
                tokens, labels = synthetic_batch(cfg["model"]["vocab"], tr["micro_batch"], tr["seq_len"], tr["seed"],
                                                 step, dp_rank * k + mb)
                tokens, labels = tokens.to(device), labels.to(device)
                pos = torch.arange(tr["seq_len"], device=device).unsqueeze(0).expand_as(tokens)
                sync = contextlib.nullcontext() if mb == k - 1 else ddp.no_sync()
                with sync:
                    ph.mark("f0")
                    loss = ddp(tokens, pos, None, labels=labels).float().mean()
                    ph.mark("f1")
                    (loss / k).backward()
                    ph.mark("b1")
                waited = fsync.take()
                if waited is not None:
                    fwd_sync = (fwd_sync or 0.0) + waited
                fwd += ph.ms("f0", "f1") - (waited or 0.0)
                bwd += ph.ms("f1", "b1")
                losses.append(loss.detach())
            ph.mark("bwd_end")
        ddp.finish_grad_sync()  # finalize_model_grads' call: waits for (or issues) every bucket's reduction
        ph.mark("reduced")
        if cfg["ddp"].get("step_barrier") and dp * tp > 1:  # Megatron's timers("optimizer").start(barrier=True)
            dist.barrier()
        ph.mark("step")
        optimizer.step()
        ph.mark("end")
        global_loss = torch.stack(losses).mean().float()
        dist.all_reduce(global_loss, group=dp_group)
        if cuda:
            torch.cuda.synchronize()
        step_ms = ph.ms("step", "end")
        sync_ms = psync.take()
        exposed_sync = None if sync_ms is None and fwd_sync is None else (sync_ms or 0.0) + (fwd_sync or 0.0)
        parts = {k: acc.take() for k, acc in inner.items()}
        ns_outer, ns = parts.pop("ns_tp"), parts.pop("ns")
        gather_ms = None if ns_outer is None else ns_outer - (ns or 0.0)
        compute_ms = None if parts["compute"] is None else parts["compute"] - (gather_ms or 0.0)
        row = dict.fromkeys(fields)
        row.update({
            "step": step, "measured": step >= tr["warmup"], "rank": rank, "dp_rank": dp_rank, "tp_rank": tp_rank,
            "iteration_ms": ph.ms("start", "end"), "forward_ms": None if grid else fwd,
            "backward_ms": None if grid else bwd, "grad_reduce_ms": ph.ms("bwd_end", "reduced"),
            "clip_grad_ms": clip.take(), "optimizer_step_ms": step_ms - (sync_ms or 0.0),
            "barrier_ms": ph.ms("reduced", "step"),
            "step_start_ms": ph.ms("start", "step"), "param_sync_ms": exposed_sync,
            "gather_ms": gather_ms, "compute_ms": compute_ms, "apply_ms": parts["apply"],
            "loss": float(global_loss) / dp,
        })
        rows.append({f: row.get(f) for f in fields})
    (out / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if cfg.get("save_params"):
        if cfg["ddp"]["overlap_param_gather"]:  # the last step's gather is dispatched lazily: finish it
            ddp.start_param_sync(force_sync=True)
        snapshots["final"] = {n: _full(p.detach().float().cpu(), p, tp, tp_group) for n, p in named}
        snapshots["main"] = _main_params(optimizer, ddp)  # this rank's owned fp32 shards
        snapshots["partition"] = {n: (getattr(p, "partition_dim", -1) if getattr(p, "tensor_model_parallel", False)
                                      else None) for n, p in named}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {"dp_rank": dp_rank, "tp_rank": tp_rank, "main": snapshots.pop("main")})
        if rank == 0:
            main: dict[str, Any] = {}
            for name, pdim in snapshots["partition"].items():
                shards = {g["tp_rank"]: g["main"][name] for g in gathered if name in g["main"]}
                if not shards:
                    continue
                main[name] = shards[0] if pdim is None or tp == 1 else torch.cat([shards[t] for t in range(tp)], pdim)
            snapshots["main"] = main
            torch.save(snapshots, cfg["save_params"])


def _spawned(rank: int, cfg: dict[str, Any], port: int) -> None:
    try:
        rank_main(rank, cfg, port)
    except BaseException:
        sys.stderr.write(f"rank {rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        raise


def main(argv: list[str]) -> int:
    import socket

    import torch.multiprocessing as mp

    cfg = json.loads(Path(argv[0]).read_text())
    Path(cfg["out"]).mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = cfg["dp"] * cfg["tp"]
    try:
        mp.start_processes(_spawned, args=(cfg, port), nprocs=world, join=True, start_method="spawn")
    except mp.ProcessRaisedException as e:
        print(f"megatron worker failed: {e}", file=sys.stderr)
        return 1
    except mp.ProcessExitedException as e:
        print(f"megatron worker failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
