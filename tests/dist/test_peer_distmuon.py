"""The peer ``torchtitan_distmuon`` (torchtitan 0.3.0's DistMuon on FSDP2, real gloo ranks)
against torch's own optimizers and the harness's.

Step parity: 2 ranks shard the harness's Qwen3 with FSDP2 and are handed, for 3 steps, the
DP-mean of rank-dependent gradients on the harness's coarse grid (multiples of 2^-12 below 2^-4,
as tests/dist/test_parity.py), each rank the FSDP2 shard of it; DistMuon gathers each matrix to
its one owner (all-to-all), orthogonalises it and sends the update back. The final parameters
must equal, bit for bit, torch.optim.Muon + torch.optim.AdamW(fused) stepping the full tensors
in one process: DistMuon's arithmetic is torch.optim.Muon's (bf16 Newton-Schulz) and an owner
sees the exact full matrix. Against the harness's single-process optimizer
(`ReferenceOptimizer`, ``optimizer.ns_dtype=bfloat16``) every parameter is equal bit for bit
except where Muon's shape scale s = sqrt(rows/cols) is not a power of two (Qwen3's fc1: s =
sqrt(6)): the harness rounds s·d before adding lr·(s·d), torch and DistMuon add (lr·s)·d. Derived
bound for those: per step the two exact sums differ by at most about 4u·lr·s·|d| (u = 2^-24, the
roundings of s·d, lr·s and lr) and each rounds once more (one ulp of the parameter between the
two), and an earlier step's difference is carried (scaled by 1 - lr·wd < 1), so after T steps
|Δ| <= T·(ulp(p) + 4u·lr·s·max|d|) with |d| <= 1.5 (the entries of a quintic Newton-Schulz
result are bounded by its largest singular value, < 1.2 for these coefficients).

Training: one step through the full loss (FSDP2's all-gathers, backward, its reduce-scatter)
equals the harness's own DP 2 run bit for bit but for the same fc1 rounding (a sum of two
ranks' gradients is the same in either order, and the model is the harness's). Over 3 steps
with clipping on, bf16 Newton-Schulz turns the last-bit differences of reordered sums into
bf16 roundings, so neither the harness's DP 2 run nor the peer stays within the fp32 training
bound (1e-5) of the single process; the peer must be as close to it as the harness's own DP 2
run is (within 2x its relative L2 distance; measured 7.5e-4 against 6.5e-4, parameters moved by
9e-2).
"""

from __future__ import annotations

import math

import pytest
import torch
from util import global_rel

pytestmark = pytest.mark.slow

NAME = "torchtitan_distmuon"
BASE = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "train.seed=7", "train.seq_len=32",
        "train.dtype=fp32", "optimizer.ns_dtype=bfloat16", "dist.device=cpu", "dist.threads_per_rank=1"]
STEPS = 3
U = 2.0**-24
D_MAX = 1.5


def _cfg(extra: list[str]):
    from canzona.config import load_config

    cfg = load_config([*BASE, "method=canzona", *extra])
    cfg.method.name = NAME  # run() does not read it; the config may not know the peer yet
    return cfg


def _grid_grads(specs, step: int, dp_rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + 17 * step + dp_rank)
    return {s.name: torch.randint(-255, 256, s.shape, generator=g).float() / 4096 for s in specs}


def _mean_grads(specs, step: int, dp: int) -> dict[str, torch.Tensor]:
    per = [_grid_grads(specs, step, d) for d in range(dp)]
    return {s.name: sum(g[s.name] for g in per) / dp for s in specs}


def _step_worker(rank: int, world: int, extra: list[str]) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from canzona.inventory import build_inventory
    from canzona.model.parallel import init_parallel
    from canzona.peers.torchtitan_distmuon import build, cpu_shim, owners

    cfg = _cfg([f"parallel.dp={world}", *extra])
    ctx = init_parallel(1, "gloo", 60.0)
    specs = build_inventory(cfg.model_cfg())
    with cpu_shim():
        model, muon, adamw, _ = build(cfg, ctx.device, "float32")
        for step in range(1, STEPS + 1):
            mean = _mean_grads(specs, step, world)
            for name, p in model.named_parameters():
                local = p.to_local()
                part = torch.chunk(mean[name], world, dim=0)  # FSDP2's Shard(0): torch.chunk's split
                mine = part[rank] if rank < len(part) else mean[name][:0]
                assert mine.shape == local.shape, (name, mine.shape, local.shape)
                p.grad = DTensor.from_local(mine.contiguous(), p.device_mesh, p.placements)
            muon.step()
            adamw.step()
        full = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        plan = owners(muon)
    dist.barrier()
    return {"params": full, "owners": plan}


def _ulp(t: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(t), torch.frexp(t.abs().clamp_min(2.0**-126))[1] - 24)


def test_step_parity_dist_muon_equals_torch_muon_and_the_harness(run_ranks) -> None:
    from full_tensors import init_full_state_dict

    from canzona.inventory import build_inventory
    from canzona.optim.muon import lr_scale
    from canzona.optim.owner import ReferenceOptimizer

    extra = ["optimizer.clip_grad=0"]
    cfg = _cfg(extra)
    result = run_ranks(_step_worker, 2, extra, timeout_s=120)
    got = result[0]["params"]
    assert all(torch.equal(r["params"][n], got[n]) for r in result for n in got)
    mcfg, opt = cfg.model_cfg(), cfg.optimizer
    specs = build_inventory(mcfg)
    matrices = [s.name for s in specs if s.kind == "matrix"]
    assert result[0]["owners"] == result[1]["owners"]
    assert sorted(result[0]["owners"]) == sorted(matrices)
    assert all(len(r) == 1 for r in result[0]["owners"].values()), result[0]["owners"]
    assert {r[0] for r in result[0]["owners"].values()} == {0, 1}

    init = init_full_state_dict(mcfg, cfg.train.seed)
    torch_params = {n: torch.nn.Parameter(t.clone()) for n, t in init.items()}
    muon = torch.optim.Muon([torch_params[n] for n in matrices], lr=opt.lr, weight_decay=opt.weight_decay,
                            momentum=opt.momentum, nesterov=opt.nesterov, ns_coefficients=tuple(opt.ns_coefficients),
                            eps=opt.ns_eps, ns_steps=opt.ns_steps, adjust_lr_fn=opt.lr_adjust)
    adamw = torch.optim.AdamW([torch_params[s.name] for s in specs if s.kind != "matrix"], lr=opt.adamw_lr,
                              betas=tuple(opt.betas), eps=opt.eps, weight_decay=opt.weight_decay, fused=True)
    harness = {n: t.clone() for n, t in init.items()}
    reference = ReferenceOptimizer(list(specs), opt)
    for step in range(1, STEPS + 1):
        mean = _mean_grads(specs, step, 2)
        for n, p in torch_params.items():
            p.grad = mean[n].clone()
        muon.step()
        adamw.step()
        reference.step(harness, mean)

    for s in specs:
        n = s.name
        assert not torch.equal(got[n], init[n]), f"{n} did not move"
        assert torch.equal(got[n], torch_params[n].detach()), f"{n}: DistMuon differs from torch.optim"
        scale = lr_scale(s.shape, opt.lr_adjust) if s.kind == "matrix" else 1.0
        if math.log2(scale).is_integer():
            assert torch.equal(got[n], harness[n]), f"{n}: differs from the harness's optimizer"
        else:
            bound = STEPS * (_ulp(harness[n]) + 4 * U * opt.lr * scale * D_MAX)
            diff = (got[n] - harness[n]).abs()
            assert bool((diff <= bound).all()), f"{n}: {diff.max().item():.3g} beyond the derived bound"


def _peer(tmp_path, extra: list[str]) -> tuple[dict, object]:
    from canzona.peers.torchtitan_distmuon import run

    cfg = _cfg([*extra, "parallel.dp=2", "train.micro_batch=2", "train.warmup=0", f"save_params={tmp_path}/p.pt"])
    result = run(cfg, tmp_path)
    return torch.load(tmp_path / "p.pt"), result


def _harness(tmp_path, extra: list[str], dp: int) -> dict:
    from canzona.config import load_config
    from canzona.run import run_trial

    cfg = load_config([*BASE, "method=canzona", *extra, f"parallel.dp={dp}", f"train.micro_batch={4 // dp}",
                       "train.warmup=0", f"save_params={tmp_path}/p.pt"])
    run_trial(cfg, tmp_path)
    return torch.load(tmp_path / "p.pt")


def test_one_training_step_equals_the_harness_dp2_run(tmp_path) -> None:
    from full_tensors import init_full_state_dict

    from canzona.optim.muon import lr_scale
    from canzona.records import STEP_FIELDS

    extra = ["train.steps=1", "optimizer.clip_grad=0"]
    got, result = _peer(tmp_path / "peer", extra)
    want = _harness(tmp_path / "harness", extra, 2)
    cfg = _cfg(extra)
    init = init_full_state_dict(cfg.model_cfg(), cfg.train.seed)
    assert sorted(got) == sorted(want) == sorted(init)
    for n, w in want.items():
        shape = tuple(w.shape)
        scale = lr_scale(shape, cfg.optimizer.lr_adjust) if len(shape) == 2 and not n.startswith("embedding") else 1.0
        if math.log2(scale).is_integer():
            assert torch.equal(got[n], w), f"{n}: {(got[n] - w).abs().max().item():.3g} from the harness's DP 2 run"
        else:
            bound = _ulp(w) + 4 * U * cfg.optimizer.lr * scale * D_MAX
            assert bool(((got[n] - w).abs() <= bound).all()), n
        assert not torch.equal(got[n], init[n]), f"{n} did not move"
    rows = result.rows
    assert [(r["step"], r["rank"]) for r in rows] == [(0, 0), (0, 1)]
    for r in rows:
        assert set(STEP_FIELDS) <= set(r)
        assert r["iteration_ms"] >= r["optimizer_step_ms"] > 0 and r["forward_ms"] > 0 and r["backward_ms"] > 0
        assert r["grad_reduce_ms"] is None and r["param_sync_ms"] is None
        # the step's timer starts after the harness's barrier, as its own trials' do (dist.step_barrier)
        assert {e["phase"] for e in r["events"]} >= {"forward", "backward", "barrier", "dist_muon_step", "adamw_step"}
        assert r["barrier_ms"] >= 0.0
    meta = result.meta
    assert meta["versions"]["torchtitan"] == "0.3.0" and "Neither changes any arithmetic" in meta["shim"]


def test_three_training_steps_as_close_to_single_process_as_the_harness(tmp_path) -> None:
    extra = [f"train.steps={STEPS}"]  # clipping on (1.0, fp32 norm)
    got, result = _peer(tmp_path / "peer", extra)
    single = _harness(tmp_path / "single", extra, 1)
    harness_dp2 = _harness(tmp_path / "dp2", extra, 2)
    from full_tensors import init_full_state_dict

    cfg = _cfg(extra)
    peer_err, harness_err = global_rel(got, single), global_rel(harness_dp2, single)
    moved = global_rel(init_full_state_dict(cfg.model_cfg(), cfg.train.seed), single)
    assert peer_err <= 2 * harness_err, f"peer {peer_err:.2e} vs the harness's DP 2 {harness_err:.2e}"
    assert moved > 50 * peer_err
    losses = [r["loss"] for r in result.rows]
    assert losses[0] == losses[1] and len(losses) == 2 * STEPS


@pytest.mark.parametrize("extra,needle", [
    (["parallel.tp=2"], "parallel.tp=2"),
    (["model=qwen3-30b-a3b"], "MoE"),
    (["optimizer=adamw"], "optimizer=muon"),
    (["optimizer.ns_dtype=float32"], "optimizer.ns_dtype=bfloat16"),
    (["optimizer.lr_adjust=none"], "original, match_rms_adamw"),
])
def test_refused_in_one_line(tmp_path, extra: list[str], needle: str) -> None:
    from canzona.errors import ConfigError
    from canzona.peers.torchtitan_distmuon import run

    cfg = _cfg(extra)
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path)
    message = str(err.value)
    assert "\n" not in message and needle in message, message
    assert not list(tmp_path.iterdir()), "a refused run must start nothing"
