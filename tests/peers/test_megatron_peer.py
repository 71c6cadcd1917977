"""Megatron's own optimizers (the peers ``megatron_layerwise`` / ``megatron_zero1``, megatron-core
0.19.2 in its own environment) against the harness's single-process optimizer.

Step parity: megatron's GPTModel is not the harness's model (its forward sums in other orders),
so training is not compared bit for bit; instead the worker installs the same gradients in both
(`megatron_worker.grid_grad`: a 2^-12 grid, |g| < 2^-4, rank-dependent so a reduction that did
nothing fails; sums of DP ranks' values and halving them are exact in fp32 in any order) and
takes two optimizer steps. The reference runs `canzona.optim.owner.ReferenceOptimizer` (the
harness's Muon and AdamW) on the worker's initial parameters with the DP-mean gradients.
Clipping and weight decay are off in the bit-exact checks: Megatron's norm is fp32 (reordered
sums) and its decoupled decay is ``p += -lr*wd*p`` where the harness's is ``p *= 1 - lr*wd``,
equal only up to rounding.

- ``duplicated`` with fp32 Newton-Schulz (``muon_fp32_matmul_prec="highest"``): each matrix's
  full gradient is gathered and orthogonalised as the harness does (same ops: normalise, the
  "simple" coefficients = the harness's, addmm order, shape scaling = the harness's
  ``lr_adjust=original``), so Megatron's fp32 main parameters equal the reference's bit for bit,
  at DP 2 and at TP 2.
- ``distributed``: Newton-Schulz on the shards with all-reduced Gram products and norm, sums in
  another order: no bit parity. Derived bound: measured against the same iteration in float64,
  its displacement must be as accurate as the harness's own fp32 path's (error within 4x of it;
  the same criterion the harness holds its batched Newton-Schulz to, canzona/optim/newton_schulz.py).
  Each Gram entry is a dot product over k <= 192 elements, reordered across two shards: it moves
  by at most γ_k = k·u/(1-k·u) ≈ 1.1e-5 of |x_i||x_j| (Higham Thm 3.5), the same size as the
  rounding error the single-process product already has, so both evaluations err alike.
- ``blockwise``: a different update, Newton-Schulz of each TP shard alone (scaled by the shard's
  shape): checked bit for bit against the harness's Muon run on each shard as its own matrix.
- ``megatron_zero1``: Megatron's DistributedOptimizer with torch's AdamW (single-tensor path)
  against the harness's fused AdamW: the same formula, but torch's CPU kernels round
  ``v*b2 + (1-b2)*g*g`` with or without a fused multiply-add (canzona/optim/adamw.py), so
  fp32 results may differ in the last bit; compared on the bf16 model parameters, every element
  within one bf16 ulp of the reference (a last-bit fp32 difference can flip at most one rounding).
Adam-managed parameters of ``megatron_layerwise`` (embeddings and norms) are checked the same way.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from canzona.devices import torch_threads

pytestmark = [pytest.mark.slow, pytest.mark.peers]

BASE = ["model=qwen3-0.6b", "model.width_div=32", "model.num_layers=2", "train.seq_len=32", "train.micro_batch=2",
        "train.seed=7", "optimizer.clip_grad=0", "optimizer.weight_decay=0"]
STEPS = 2


@pytest.fixture(scope="session")
def peer_python() -> Path:
    from canzona.peers.megatron_env import peer_python as make

    return make()  # created once (about 1.5 min) when missing


def _cfg(method: str, dp: int, tp: int, extra: list[str], save: Path):
    from canzona.config import load_config

    harness = {"megatron_layerwise": ["method=layerwise", "optimizer=muon"],
               "megatron_zero1": ["method=adamw", "optimizer=adamw"]}[method]
    cfg = load_config([*BASE, *harness, f"parallel.dp={dp}", f"parallel.tp={tp}", f"train.steps={STEPS}",
                       "train.warmup=0", "dist.device=cpu", f"save_params={save}", *extra])
    cfg.method.name = method  # until the config knows the peer methods
    return cfg


def _run_grid(peer_python: Path, tmp: Path, method: str, dp: int, tp: int, tp_mode: str = "duplicated"):
    from canzona.peers.megatron import launch, worker_config

    cfg = _cfg(method, dp, tp, [], tmp / "p.pt")
    job = worker_config(cfg, tmp, {"tp_mode": tp_mode, "ns_matmul_prec": "highest"}, threads=1)
    job["grid_grads"] = True
    rows = launch(job, tmp, peer_python, timeout_s=600)
    assert len(rows) == STEPS * dp * tp
    return cfg, torch.load(tmp / "p.pt")


def _is_matrix(name: str, t: torch.Tensor) -> bool:
    return t.ndim == 2 and not name.startswith(("embedding.", "output_layer."))


def _reference(cfg, snap, dp: int, tp: int, blockwise: bool = False, dtype=torch.float32):
    # at the ranks' one intra-op thread: Newton–Schulz's Frobenius norm of fc1 came 1.7e-8 off at two
    with torch_threads(1):
        return _reference_steps(cfg, snap, dp, tp, blockwise, dtype)


def _reference_steps(cfg, snap, dp: int, tp: int, blockwise: bool, dtype):
    """The harness's single-process optimizer on the worker's initial parameters and the DP-mean
    grid gradients; ``blockwise`` makes each TP shard of a matrix its own matrix."""
    from canzona.inventory import ParamSpec
    from canzona.optim.owner import ReferenceOptimizer
    from canzona.peers.megatron_worker import grid_grad

    init, part = snap["init"], snap["partition"]

    def pieces(name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if blockwise and tp > 1 and _is_matrix(name, t) and part[name] is not None:
            return [(f"{name}#{i}", s.contiguous()) for i, s in enumerate(t.chunk(tp, dim=part[name]))]
        return [(name, t)]

    params = {k: v.to(dtype).clone() for n, t in init.items() for k, v in pieces(n, t)}
    specs = [ParamSpec(k, tuple(v.shape), None, "matrix" if _is_matrix(n, t) else "adamw")
             for n, t in init.items() for k, v in pieces(n, t)]
    ref = ReferenceOptimizer(specs, cfg.optimizer, matrix_rule=cfg.optimizer.name != "adamw")
    if dtype == torch.float64:
        ref.matrices.rule.ns_dtype = torch.float64
    for step in range(STEPS):
        grads = {}
        for n, t in init.items():
            mean = sum(grid_grad(n, tuple(t.shape), step, d) for d in range(dp)) / dp
            grads.update({k: v.to(dtype) for k, v in pieces(n, mean)})
        ref.step(params, grads)
    out = {}
    for n, t in init.items():
        keys = [k for k, _ in pieces(n, t)]
        out[n] = params[n] if keys == [n] else torch.cat([params[k] for k in keys], dim=part[n])
    return out


def _bf16_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Every element within one bf16 ulp of the fp32 reference rounded to bf16."""
    w = want.float().bfloat16().float()
    ulp = torch.where(w == 0, torch.full_like(w, 2.0**-133), w.abs() * 2.0**-7)
    return bool(((got - w).abs() <= ulp).all())


def _check_adam_params(snap, want) -> None:
    for n, t in snap["final"].items():
        if not _is_matrix(n, t):
            assert _bf16_close(t, want[n]), f"{n}: {(t - want[n]).abs().max():.3e}"


@pytest.mark.parametrize("layout", [(2, 1), (1, 2)], ids=["dp2", "tp2"])
def test_layerwise_duplicated_fp32_equals_the_harness_muon_bit_for_bit(peer_python, tmp_path, layout) -> None:
    dp, tp = layout
    cfg, snap = _run_grid(peer_python, tmp_path, "megatron_layerwise", dp, tp, "duplicated")
    want = _reference(cfg, snap, dp, tp)
    matrices = [n for n, t in snap["init"].items() if _is_matrix(n, t)]
    assert sorted(snap["main"]) == sorted(matrices), "every Muon matrix is owned by some DP rank"
    for n in matrices:
        assert not torch.equal(snap["main"][n], snap["init"][n]), f"{n} did not move"
        assert torch.equal(snap["main"][n], want[n]), f"{n}: max diff {(snap['main'][n] - want[n]).abs().max():.3e}"
        assert torch.equal(snap["final"][n], want[n].bfloat16().float()), f"{n}: bf16 model copy"
    _check_adam_params(snap, want)


def test_layerwise_blockwise_is_newton_schulz_per_tp_shard(peer_python, tmp_path) -> None:
    cfg, snap = _run_grid(peer_python, tmp_path, "megatron_layerwise", 1, 2, "blockwise")
    want = _reference(cfg, snap, 1, 2, blockwise=True)
    whole = _reference(cfg, snap, 1, 2, blockwise=False)
    for n, t in snap["init"].items():
        if _is_matrix(n, t):
            assert torch.equal(snap["main"][n], want[n]), f"{n}: max diff {(snap['main'][n] - want[n]).abs().max():.3e}"
    split = [n for n, t in snap["init"].items() if _is_matrix(n, t) and snap["partition"][n] is not None]
    assert split and any(not torch.equal(want[n], whole[n]) for n in split), "blockwise is a different update"


def test_layerwise_distributed_within_the_derived_bound(peer_python, tmp_path) -> None:
    cfg, snap = _run_grid(peer_python, tmp_path, "megatron_layerwise", 1, 2, "distributed")
    fp32 = _reference(cfg, snap, 1, 2)
    exact = _reference(cfg, snap, 1, 2, dtype=torch.float64)
    lr = cfg.optimizer.lr
    for n, t in snap["init"].items():
        if not _is_matrix(n, t):
            continue
        truth = (t.double() - exact[n]) / lr  # the two steps' summed directions, in float64
        err_peer = float((((t.double() - snap["main"][n].double()) / lr) - truth).norm() / truth.norm())
        err_harness = float((((t.double() - fp32[n].double()) / lr) - truth).norm() / truth.norm())
        assert err_peer <= 4 * err_harness + 1e-7, f"{n}: {err_peer:.2e} vs the fp32 path's {err_harness:.2e}"
        assert math.isfinite(err_peer)
    _check_adam_params(snap, fp32)


def test_zero1_adamw_matches_the_harness_adamw(peer_python, tmp_path) -> None:
    cfg, snap = _run_grid(peer_python, tmp_path, "megatron_zero1", 2, 1)
    want = _reference(cfg, snap, 2, 1)
    for n, t in snap["final"].items():
        assert t.ndim == 1 or not torch.equal(t, snap["init"][n]), f"{n} did not move"
        assert _bf16_close(t, want[n]), f"{n}: {(t - want[n]).abs().max():.3e}"
