"""The Megatron peers run as methods: ``megatron_layerwise`` and ``megatron_zero1``.

``run(cfg, out)`` resolves the trial's shapes and settings here (Python 3.11, the harness's
environment), writes them as JSON, and runs `canzona.peers.megatron_worker` in the peer
environment (`canzona.peers.megatron_env`: megatron-core 0.19.2, emerging-optimizers 0.3.0),
which spawns the ranks and writes one row per rank per step. The harness's Muon and AdamW
settings are translated to Megatron's keys (`peer_settings`); a setting Megatron has no
equivalent of is refused in one line rather than silently changed.

What the peer runs as (docs/design.md §6 differences, said in ``meta["settings"]``): bf16
parameters with fp32 main parameters and fp32 gradient reduction (Megatron's layer-wise
optimizer cannot step in fp32: ``bf16=True`` always); Megatron's fp32 gradient norm; weight
decay on every parameter (``config_overrides={}``, as the harness); a constant learning rate per
optimizer (Muon's ``optimizer.lr``, AdamW's ``optimizer.adamw_lr``), the schedule Megatron's
scheduler would hold at warm-up-free constant.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError
from canzona.host_memory import ENV as HOST_MEMORY_ENV
from canzona.host_memory import POLICY as HOST_MEMORY_POLICY
from canzona.peers import PEERS, TP_MODES, PeerRun

WORKER = Path(__file__).with_name("megatron_worker.py")
SIMPLE_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # emerging-optimizers' "simple" set = the harness's default
NS_PREC = {"float32": "highest", "bfloat16": "medium"}
# harness optimizer.lr_adjust -> (muon_scale_mode, muon_extra_scale_factor)
SCALE_MODES = {"original": ("shape_scaling", 1.0), "match_rms_adamw": ("spectral", 0.2)}


def _peer_section(cfg: Any, settings: dict[str, Any] | None) -> dict[str, Any]:
    section = getattr(cfg, "peer", None)
    got: dict[str, Any] = {}
    if section is not None:
        got = {k: getattr(section, k) for k in ("tp_mode", "ns_matmul_prec") if hasattr(section, k)}
    got.update(settings or {})
    return got


def peer_settings(cfg: Any, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Megatron's settings for the trial ``cfg``: ``tp_mode`` (peer.tp_mode, default blockwise),
    ``ns_matmul_prec`` (peer.ns_matmul_prec, else from optimizer.ns_dtype), and the translation of
    the harness's Muon options. ConfigError for what Megatron cannot run as asked."""
    given = _peer_section(cfg, settings)
    tp_mode = given.get("tp_mode") or "blockwise"
    if tp_mode not in TP_MODES:
        raise ConfigError(f"peer.tp_mode={tp_mode!r}; allowed: {', '.join(TP_MODES)}")
    opt = cfg.optimizer
    prec = given.get("ns_matmul_prec") or NS_PREC[opt.ns_dtype]
    if prec not in ("highest", "high", "medium"):
        raise ConfigError(f"peer.ns_matmul_prec={prec!r}; allowed: highest, high, medium (null: from "
                          f"optimizer.ns_dtype)")
    out = {"tp_mode": tp_mode, "ns_matmul_prec": prec, "coefficient_type": "simple", "scale_mode": "shape_scaling",
           "extra_scale_factor": 1.0, "split_qkv": bool(cfg.model.split_fused)}
    if cfg.method.name == "megatron_layerwise":
        if opt.name != "muon":
            raise ConfigError(f"method=megatron_layerwise runs Megatron's Muon; optimizer={opt.name} is not it "
                              f"(use optimizer=muon)")
        if tuple(round(c, 6) for c in opt.ns_coefficients) != SIMPLE_COEFFICIENTS:
            raise ConfigError(f"optimizer.ns_coefficients={tuple(opt.ns_coefficients)}: Megatron's TensorParallelMuon "
                              f"takes a named set only; the harness's default {SIMPLE_COEFFICIENTS} is its 'simple'")
        if opt.lr_adjust not in SCALE_MODES:
            raise ConfigError(f"optimizer.lr_adjust={opt.lr_adjust} has no Megatron muon_scale_mode; allowed with "
                              f"the Megatron peers: {', '.join(SCALE_MODES)}")
        out["scale_mode"], out["extra_scale_factor"] = SCALE_MODES[opt.lr_adjust]
    return out


def check(cfg: Any, settings: dict[str, Any] | None = None) -> None:
    """ConfigError in one line for what Megatron's optimizers cannot run as the harness asks (a
    sweep calls it for every peer trial before it launches anything)."""
    name = cfg.method.name
    if name not in ("megatron_layerwise", "megatron_zero1"):
        raise ConfigError(f"canzona.peers.megatron runs megatron_layerwise and megatron_zero1, not {name!r}")
    if cfg.model_cfg().moe:
        raise ConfigError(f"method={name} runs the dense Qwen3 models; {cfg.model.name} is MoE")
    peer_settings(cfg, settings)


def worker_config(cfg: Any, out: Path, settings: dict[str, Any] | None = None, *, device: str | None = None,
                  threads: int | None = None) -> dict[str, Any]:
    """The JSON the worker reads: the trial resolved (shapes, steps, optimizer, DDP, peer settings)."""
    from canzona.plan.from_config import threads_per_rank, trial_device
    from canzona.records import STEP_FIELDS

    check(cfg, settings)
    name = cfg.method.name
    m = cfg.model_cfg()
    opt, tr = cfg.optimizer, cfg.train
    return {
        "method": name, "dp": cfg.parallel.dp, "tp": cfg.parallel.tp,
        "sequence_parallel": bool(cfg.sequence_parallel),
        "device": device or trial_device(cfg, required=True),
        "threads_per_rank": threads or threads_per_rank(cfg), "timeout_s": cfg.dist.timeout_s,
        "out": str(out),
        "model": {"name": m.name, "hidden": m.hidden, "ffn": m.ffn, "num_layers": m.num_layers, "heads": m.heads,
                  "kv_heads": m.kv_heads, "head_dim": m.head_dim, "vocab": m.vocab,
                  "tied_embeddings": m.tied_embeddings},
        "train": {"steps": tr.steps, "warmup": tr.warmup, "seed": tr.seed, "micro_batch": tr.micro_batch,
                  "grad_accum": tr.grad_accum, "seq_len": tr.seq_len, "recompute": tr.recompute},
        "optimizer": {"lr": opt.lr, "adamw_lr": opt.adamw_lr, "weight_decay": opt.weight_decay,
                      "clip_grad": opt.clip_grad, "betas": list(opt.betas), "eps": opt.eps,
                      "momentum": getattr(opt, "momentum", 0.95), "nesterov": getattr(opt, "nesterov", True),
                      "ns_steps": getattr(opt, "ns_steps", 5)},
        "peer": peer_settings(cfg, settings),
        "ddp": {"overlap_grad_reduce": cfg.dist.overlap_grad_reduce,
                "overlap_param_gather": cfg.dist.overlap_param_gather, "bucket_size": cfg.bucket_size(),
                "step_barrier": cfg.dist.step_barrier},
        "step_fields": list(STEP_FIELDS),
        "save_params": cfg.save_params,
    }


def launch(job: dict[str, Any], out: Path, python: Path, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Run the worker on ``job`` (written to ``out/peer-config.json``) with ``python``; its ranks'
    rows sorted by (step, rank). RuntimeError with the worker's log tail if it fails."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "peer-config.json"
    path.write_text(json.dumps(job, indent=1))
    log = out / "peer-worker.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(job["threads_per_rank"]), PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    if job["device"] == "cpu":  # its ranks keep freed memory, as the harness's CPU ranks do
        env.update(HOST_MEMORY_ENV)
    if timeout_s is None:
        timeout_s = 300 + job["timeout_s"] * (job["train"]["steps"] + job["train"]["warmup"] + 2)
    with open(log, "w") as fh:
        try:
            rc = subprocess.run([str(python), str(WORKER), str(path)], stdout=fh, stderr=subprocess.STDOUT,
                                env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        what = f"exceeded {timeout_s:.0f}s" if rc is None else f"exited with {rc}"
        raise RuntimeError(f"the {job['method']} worker ({python}) {what}; last lines of {log}:\n{tail}")
    rows = []
    for r in range(job["dp"] * job["tp"]):
        rows += [json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines() if line]
    return sorted(rows, key=lambda row: (row["step"], row["rank"]))


def run(cfg: Any, out: Path, settings: dict[str, Any] | None = None) -> PeerRun:
    """Run ``cfg`` (method megatron_layerwise or megatron_zero1) with megatron-core 0.19.2's own
    optimizers in the peer environment; ``settings`` (tp_mode, ns_matmul_prec) stand in for the
    ``peer`` config section where the config has none."""
    from canzona.peers.megatron_env import env_dir, peer_python, peer_versions
    from canzona.peers.megatron_worker import SHIM_TEXT

    out = Path(out)
    job = worker_config(cfg, out / "peer", settings)
    python = peer_python()
    rows = launch(job, out / "peer", python)
    meta = {
        "peer": cfg.method.name, "follows": PEERS[cfg.method.name].follows, "versions": peer_versions(),
        "settings": {**job["peer"], "dtype": "bf16 params, fp32 main params and gradient reduction",
                     "optimizer": "muon (TensorParallelMuon, layer-wise) + adam for embeddings and norms"
                     if cfg.method.name == "megatron_layerwise" else "adam (AdamW, DistributedOptimizer)",
                     "ddp": job["ddp"], "weight_decay_on": "every parameter", "lr": "constant per optimizer"},
        "shim": SHIM_TEXT if job["device"] == "cpu" else None,
        "host_allocator": HOST_MEMORY_POLICY if job["device"] == "cpu" else None,
        "env": str(env_dir()), "python": str(python),
    }
    return PeerRun(rows=rows, meta=meta)

