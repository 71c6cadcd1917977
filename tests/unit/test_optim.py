"""Optimizer maths: parity with torch.optim, batching and slicing invariance, preconditioner
blocking, refresh schedules, descent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from canzona.config import OptimizerSection
from canzona.optim import (
    SOAP,
    AdamW,
    Muon,
    Shampoo,
    UpdateRule,
    apply_update,
    fused_adamw_step,
    learning_rate,
    lr_scale,
    make_rule,
)
from canzona.optim.adamw import ALIGN
from canzona.optim.kronecker import blocks, is_refresh_step
from canzona.optim.newton_schulz import newton_schulz

REPO = Path(__file__).resolve().parents[2]

SHAPES = [(8, 24), (24, 8), (16, 16)]  # wide, tall, square


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def run_rule(rule: UpdateRule, grads_per_step: list[list[torch.Tensor]]) -> tuple[list, list]:
    """Directions per step and the final states, starting from fresh state."""
    states = [rule.init_state(tuple(g.shape), "cpu", g.dtype) for g in grads_per_step[0]]
    dirs = [rule.directions(grads, states, step) for step, grads in enumerate(grads_per_step, start=1)]
    return dirs, states


MATRIX_RULES = {
    "Muon": Muon(ns_dtype="float32"),
    "Muon-bf16": Muon(ns_dtype="bfloat16", nesterov=False, lr_adjust="match_rms_adamw"),
    "Shampoo": Shampoo(precondition_frequency=2),
    "SOAP": SOAP(precondition_frequency=2),
    # sides over 5 are cut into blocks of at most 5 x 5
    "Shampoo-blocked": Shampoo(precondition_frequency=2, max_preconditioner_dim=5),
    "SOAP-blocked": SOAP(precondition_frequency=2, max_preconditioner_dim=5),
}
each_matrix_rule = pytest.mark.parametrize("rule", list(MATRIX_RULES.values()), ids=list(MATRIX_RULES))


# ---- Muon ----


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("lr_adjust", ["original", "match_rms_adamw", "none"])
def test_muon_matches_torch(shape: tuple[int, int], nesterov: bool, lr_adjust: str) -> None:
    gen = torch.Generator().manual_seed(0)
    lr, wd = 0.02, 0.01
    ref = torch.randn(shape, generator=gen).requires_grad_(True)
    ours = ref.detach().clone()
    opt = torch.optim.Muon([ref], lr=lr, weight_decay=wd, nesterov=nesterov)
    # torch's constructor only accepts "original"/"match_rms_adamw"; any other name means no scaling.
    opt.param_groups[0]["adjust_lr_fn"] = lr_adjust
    rule = Muon(nesterov=nesterov, ns_dtype="bfloat16", lr_adjust=lr_adjust)  # torch's NS is bf16
    state = rule.init_state(shape, "cpu", torch.float32)
    for step in range(1, 5):
        grad = torch.randn(shape, generator=gen)
        ref.grad = grad.clone()
        opt.step()
        (direction,) = rule.directions([grad], [state], step)
        apply_update(ours, direction, lr, wd)
    if lr_scale(shape, lr_adjust) == 1.0:
        # Same ops in the same order: identical bits.
        torch.testing.assert_close(ours, ref.detach(), rtol=0, atol=0)
    else:
        # torch scales the lr, we scale the direction: one rounding apart.
        assert rel_err(ours, ref.detach()) <= 1e-6


def test_muon_lr_scale() -> None:
    assert lr_scale((32, 8), "original") == 2.0
    assert lr_scale((8, 32), "original") == 1.0
    assert lr_scale((8, 100), "match_rms_adamw") == pytest.approx(2.0)
    assert lr_scale((8, 100), "none") == 1.0
    with pytest.raises(ValueError):
        lr_scale((8, 8), "bogus")


def test_newton_schulz_orthogonalises_in_fp32() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 40, generator=gen)
    out = newton_schulz(x, steps=5, dtype=torch.float32)
    assert out.dtype == torch.float32 and out.shape == x.shape
    sv = torch.linalg.svdvals(out)
    # The quintic NS does not converge to 1; it lands singular values in roughly [0.7, 1.2].
    assert sv.min() > 0.5 and sv.max() < 1.5
    # Tall input is handled by transposing: NS(xᵀ) = NS(x)ᵀ exactly.
    torch.testing.assert_close(newton_schulz(x.mT), out.mT, rtol=0, atol=0)
    # A stack is orthogonalised matrix by matrix.
    for i in range(x.shape[0]):
        torch.testing.assert_close(out[i], newton_schulz(x[i], steps=5, dtype=torch.float32), rtol=0, atol=0)


# ---- properties shared by every matrix rule ----


@each_matrix_rule
def test_batched_equals_single(rule: UpdateRule) -> None:
    """A matrix's direction and state must not depend on which other matrices share the call.

    Bit-equality holds on any CPU and BLAS because every matrix kernel runs on one matrix at a
    time (see `test_matrix_kernels_see_one_matrix_at_a_time`), not because batched and single
    BLAS calls happen to agree on this machine."""
    gen = torch.Generator().manual_seed(2)
    shapes = [(8, 12), (12, 8), (8, 12), (6, 6), (8, 12)]
    steps = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(5)]
    together, states = run_rule(rule, steps)
    for i in range(len(shapes)):
        alone, alone_states = run_rule(rule, [[grads[i]] for grads in steps])
        for step in range(len(steps)):
            torch.testing.assert_close(together[step][i], alone[step][0], rtol=0, atol=0)
        for key, value in states[i].items():
            torch.testing.assert_close(value, alone_states[0][key], rtol=0, atol=0)


class KernelLog(TorchFunctionMode):
    """Records the largest operand rank of every matmul / decomposition call."""

    KERNELS = ("matmul", "mm", "addmm", "bmm", "baddbmm", "eigh", "qr")

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func)).strip("_").removeprefix("linalg_")
        if name in self.KERNELS:
            ranks = [a.ndim for a in [*args, *(kwargs or {}).values()] if isinstance(a, torch.Tensor)]
            self.calls.append((name, max(ranks, default=0)))
        return func(*args, **(kwargs or {}))


@each_matrix_rule
def test_matrix_kernels_see_one_matrix_at_a_time(rule: UpdateRule) -> None:
    """Every matmul, eigh and QR gets 2-D operands: nothing is stacked, so a matrix's update
    cannot depend on what else is in the call, whatever the BLAS does with batches."""
    gen = torch.Generator().manual_seed(8)
    shapes = [(8, 12), (8, 12), (12, 8), (6, 6)]
    states = [rule.init_state(s, "cpu", torch.float32) for s in shapes]
    log = KernelLog()
    with log:
        for step in (1, 2, 3):  # step 1 and 3 refresh at frequency 2 (eigh / power-QR)
            rule.directions([torch.randn(s, generator=gen) for s in shapes], states, step)
    assert log.calls and max(rank for _, rank in log.calls) == 2, sorted(set(log.calls))
    if not isinstance(rule, Muon):
        assert {"eigh"} <= {name for name, _ in log.calls}


@each_matrix_rule
def test_deterministic_and_shape_preserving(rule: UpdateRule) -> None:
    gen = torch.Generator().manual_seed(3)
    steps = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(3)]
    first, _ = run_rule(rule, steps)
    second, _ = run_rule(rule, steps)
    for a_step, b_step, grads in zip(first, second, steps):
        for a, b, g in zip(a_step, b_step, grads):
            assert a.shape == g.shape and a.dtype == g.dtype
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@each_matrix_rule
def test_matrix_rules_reject_vectors(rule: UpdateRule) -> None:
    with pytest.raises(ValueError, match="2-D"):
        rule.directions([torch.ones(4)], [{}], 1)


@pytest.mark.parametrize(
    ("rule", "keys"),
    [
        (Shampoo(precondition_frequency=3), ("L_inv_root", "R_inv_root")),
        (SOAP(precondition_frequency=3), ("Q_L", "Q_R")),
    ],
    ids=["Shampoo", "SOAP"],
)
def test_preconditioner_refreshed_on_schedule(rule: UpdateRule, keys: tuple[str, ...]) -> None:
    """Recomputed on steps 1, 1+f, 1+2f, ... and untouched in between."""
    gen = torch.Generator().manual_seed(4)
    shape = (6, 10)
    state = rule.init_state(shape, "cpu", torch.float32)
    refreshed = []
    for step in range(1, 11):
        before = {k: state[k].clone() for k in keys}
        rule.directions([torch.randn(shape, generator=gen)], [state], step)
        changed = [not torch.equal(before[k], state[k]) for k in keys]
        assert len(set(changed)) == 1, f"step {step}: left and right factors refreshed apart"
        refreshed.append(changed[0])
    assert refreshed == [is_refresh_step(s, 3) for s in range(1, 11)]
    assert [s for s, r in enumerate(refreshed, start=1) if r] == [1, 4, 7, 10]


@pytest.mark.parametrize(
    ("rule", "lr"),
    [
        (Muon(), 0.2),
        (Shampoo(precondition_frequency=5), 0.05),
        (SOAP(precondition_frequency=5), 0.2),
        (AdamW(), 0.05),
    ],
    ids=["Muon", "Shampoo", "SOAP", "AdamW"],
)
def test_descends_least_squares(rule: UpdateRule, lr: float) -> None:
    """20 steps on ½‖W X − Y‖² / N must at least halve the loss from a random start."""
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(16, 64, generator=gen)
    target = torch.randn(12, 16, generator=gen)
    Y = target @ X
    W = torch.zeros(12, 16)
    state = rule.init_state(tuple(W.shape), "cpu", W.dtype)

    def loss_and_grad(w: torch.Tensor) -> tuple[float, torch.Tensor]:
        residual = w @ X - Y
        return 0.5 * residual.square().sum().item() / X.shape[1], residual @ X.T / X.shape[1]

    initial, _ = loss_and_grad(W)
    for step in range(1, 21):
        _, grad = loss_and_grad(W)
        (direction,) = rule.directions([grad], [state], step)
        apply_update(W, direction, lr, 0.0)
    final, _ = loss_and_grad(W)
    assert final < 0.5 * initial, (initial, final)


# ---- preconditioner blocking ----


@pytest.mark.parametrize("cls", [Shampoo, SOAP])
def test_blocked_update_is_each_block_alone(cls) -> None:
    """A matrix with a side over max_preconditioner_dim is updated block by block, each block
    exactly as an unblocked matrix of its own (own moments, factors, roots / bases)."""
    gen = torch.Generator().manual_seed(9)
    shape, dim = (12, 7), 5
    cuts = blocks(shape, dim)
    assert [(r.stop - r.start, c.stop - c.start) for r, c in cuts] == [(5, 5), (5, 2), (5, 5), (5, 2), (2, 5), (2, 2)]
    blocked, whole = cls(precondition_frequency=3, max_preconditioner_dim=dim), cls(precondition_frequency=3)
    state = blocked.init_state(shape, "cpu", torch.float32)
    alone = [whole.init_state((r.stop - r.start, c.stop - c.start), "cpu", torch.float32) for r, c in cuts]
    for step in range(1, 8):  # covers refresh steps 1, 4, 7
        grad = torch.randn(shape, generator=gen)
        (direction,) = blocked.directions([grad], [state], step)
        for i, (r, c) in enumerate(cuts):
            (want,) = whole.directions([grad[r, c].contiguous()], [alone[i]], step)
            torch.testing.assert_close(direction[r, c], want, rtol=0, atol=0)
    for i in range(len(cuts)):
        for key, value in alone[i].items():
            torch.testing.assert_close(state[f"{key}/{i}"], value, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["muon", "shampoo", "soap", "adamw"])
@pytest.mark.parametrize("shape", [(8, 24), (24, 8), (13, 7), (20, 20)])
def test_state_numel_counts_the_state(name: str, shape: tuple[int, int]) -> None:
    from canzona.optim import registry

    settings = OptimizerSection(name=name, max_preconditioner_dim=6)
    definition = registry.get(name)
    state = definition.make_rule(settings).init_state(shape, "cpu", torch.float32)
    assert definition.state_numel(shape, settings) == sum(t.numel() for t in state.values())


def test_blocking_bounds_factors_flops_and_calibration_shapes() -> None:
    """Qwen3-32B's fused fc1 (51200 x 5120) at the default max_preconditioner_dim (8192)."""
    from canzona.optim import registry

    fc1, default = (51200, 5120), OptimizerSection()
    unblocked = OptimizerSection(max_preconditioner_dim=10**9)
    assert default.max_preconditioner_dim == 8192
    for name in ("shampoo", "soap"):
        d = registry.get(name)
        assert d.kernels(fc1, default) == [(8192, 5120)] * 6 + [(2048, 5120)]
        # 2·m·n moments + per block 2·(8192² + 5120²) or 2·(2048² + 5120²): ~6.5 floats per element, not 22
        assert d.state_numel(fc1, default) == 2 * 51200 * 5120 + 6 * 2 * (8192**2 + 5120**2) + 2 * (2048**2 + 5120**2)
        assert d.state_numel(fc1, unblocked) > 3 * d.state_numel(fc1, default)
        for flops in (d.steady_flops, d.refresh_flops):
            assert flops(fc1, default) == sum(flops(k, unblocked) for k in d.kernels(fc1, default))
            assert flops(fc1, default) < flops(fc1, unblocked)
        assert d.calibration_shapes([fc1, (5120, 25600), fc1, (1024, 3072)], default) == [
            (8192, 5120), (2048, 5120), (5120, 8192), (5120, 1024), (1024, 3072)]
    assert registry.get("muon").kernels(fc1, default) == [fc1]


# ---- AdamW ----


def _adamw_steps(shape: tuple[int, ...], steps: int, rule: AdamW, lr: float, wd: float, seed: int):
    """(our parameter, torch's fused AdamW parameter) after ``steps`` steps on the same grads."""
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=gen).requires_grad_(True)
    ours = ref.detach().clone()
    opt = torch.optim.AdamW([ref], lr=lr, betas=rule.betas, eps=rule.eps, weight_decay=wd, fused=True)
    state = rule.init_state(tuple(ours.shape), "cpu", ours.dtype)
    for step in range(1, steps + 1):
        grad = torch.randn(shape, generator=gen)
        ref.grad = grad.clone()
        opt.step()
        rule.step([ours], [grad], [state], step, lr, wd)
    return ours, ref.detach()


def test_adamw_matches_torch_fused() -> None:
    """torch's fused AdamW kernel, decoupled decay included: identical bits on tensors of a
    multiple of ALIGN elements (every element in the kernel's vectorised body either way), one
    rounding apart elsewhere (torch sends a tensor's last elements through its scalar tail)."""
    rule = AdamW(betas=(0.9, 0.95), eps=1e-8)
    ours, ref = _adamw_steps((4, ALIGN), 20, rule, 1e-2, 0.1, seed=6)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    ours, ref = _adamw_steps((7, 5), 20, rule, 1e-2, 0.1, seed=6)
    assert rel_err(ours, ref) <= 1e-6


def test_adamw_directions_are_its_step() -> None:
    """The direction contract (for callers that apply separately) moves as the fused step."""
    rule = AdamW(betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(10)
    p = torch.randn(9, 11, generator=gen)
    q = p.clone()
    s1, s2 = (rule.init_state((9, 11), "cpu", torch.float32) for _ in range(2))
    for step in range(1, 6):
        g = torch.randn(9, 11, generator=gen)
        rule.step([p], [g], [s1], step, 1e-2, 0.1)
        (d,) = rule.directions([g], [s2], step)
        apply_update(q, d, 1e-2, 0.1)
    torch.testing.assert_close(s1["exp_avg"], s2["exp_avg"], rtol=0, atol=0)
    assert rel_err(q, p) <= 1e-6


def _adamw_on_pieces(n: int, cuts: list[int], steps: int = 4) -> torch.Tensor:
    """Parameter and moments of an n-element tensor stepped as the pieces between ``cuts``."""
    gen = torch.Generator().manual_seed(1)
    p, m, v = torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)
    bounds = list(zip(cuts[:-1], cuts[1:]))
    for step in range(1, steps + 1):
        g = torch.randn(n, generator=gen)
        fused_adamw_step([p[a:b] for a, b in bounds], [g[a:b] for a, b in bounds], [m[a:b] for a, b in bounds],
                         [v[a:b] for a, b in bounds], step, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return torch.cat([p, m, v])


def test_adamw_flat_slices_equal_whole_tensor() -> None:
    """ZeRO-1 cuts shards anywhere: every odd offset and length must give the whole tensor's bits."""
    import random

    n = 1000
    whole = _adamw_on_pieces(n, [0, n])
    for seed in range(40):
        r = random.Random(seed)
        cuts = sorted(set(r.sample(range(1, n), r.randint(1, 12))))
        assert torch.equal(_adamw_on_pieces(n, [0, *cuts, n]), whole), cuts
    for width in (1, 3, ALIGN - 1, ALIGN + 1, 97):  # every piece the same odd width
        assert torch.equal(_adamw_on_pieces(n, [*range(0, n, width), n]), whole), width


def test_adamw_rule_on_slices_and_shapes() -> None:
    """Through the rule, on a 2-D tensor against its flat slices (uneven cuts across rows)."""
    gen = torch.Generator().manual_seed(7)
    shape = (6, 9)
    rule = AdamW(betas=(0.9, 0.95))
    p = torch.randn(shape, generator=gen)
    sliced = p.clone().reshape(-1)
    bounds = [(0, 5), (5, 31), (31, 54)]
    whole_state = rule.init_state(shape, "cpu", torch.float32)
    piece_states = [rule.init_state((b - a,), "cpu", torch.float32) for a, b in bounds]
    for step in range(1, 5):
        g = torch.randn(shape, generator=gen)
        rule.step([p], [g], [whole_state], step, 1e-2, 0.1)
        flat = g.reshape(-1)
        rule.step([sliced[a:b] for a, b in bounds], [flat[a:b] for a, b in bounds], piece_states, step, 1e-2, 0.1)
    torch.testing.assert_close(sliced, p.reshape(-1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="contiguous"):
        rule.step([p.mT], [g.mT], [rule.init_state((9, 6), "cpu", torch.float32)], 1, 1e-2, 0.1)


# Run in a fresh interpreter per CPU capability: the AdamW step on random cuts of 1000- and
# 70001-element tensors (the latter split over threads by torch) and apply_update on row and
# column TP shards, each against the whole tensor; prints the number of differing elements.
SLICING_CHECK = """
import json, random, torch
from canzona.optim.adamw import fused_adamw_step
from canzona.optim.rule import apply_update

def adamw(n, cuts):
    gen = torch.Generator().manual_seed(1)
    p, m, v = torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)
    b = list(zip(cuts[:-1], cuts[1:]))
    for step in range(1, 4):
        g = torch.randn(n, generator=gen)
        fused_adamw_step([p[x:y] for x, y in b], [g[x:y] for x, y in b], [m[x:y] for x, y in b],
                         [v[x:y] for x, y in b], step, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return torch.cat([p, m, v])

def apply(shape, tp, dim):
    gen = torch.Generator().manual_seed(2)
    p, u = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    whole = p.clone()
    apply_update(whole, u, 0.02, 0.01)
    shards = [s.contiguous() for s in p.chunk(tp, dim)]
    for s, d in zip(shards, u.chunk(tp, dim)):
        apply_update(s, d, 0.02, 0.01)
    return int((torch.cat(shards, dim) != whole).sum())

out = {"capability": torch.backends.cpu.get_cpu_capability()}
for threads in (1, 2):
    torch.set_num_threads(threads)
    bad = 0
    for n in (1000, 70001):
        whole = adamw(n, [0, n])
        for t in range(8):
            cuts = sorted(set(random.Random(t * 7 + n).sample(range(1, n), 9)))
            bad += int((adamw(n, [0, *cuts, n]) != whole).sum())
    out[f"adamw_threads{threads}"] = bad
    out[f"apply_threads{threads}"] = sum(apply(s, tp, d) for s in [(37, 53), (301, 333)] for tp in (2, 3) for d in (0, 1))
print(json.dumps(out))
"""


def test_elementwise_kernels_slice_invariant_on_every_cpu_capability() -> None:
    """The AdamW step and apply_update give the whole tensor's bits on any shard, under each
    kernel set torch dispatches to on an x86 CPU (default, AVX2, AVX-512) and 1 or 2 threads.
    torch's own fused AdamW kernel fails this under AVX2 / AVX-512 (see canzona.optim.adamw)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for capability in ("default", "avx2", "avx512"):
        run = subprocess.run([sys.executable, "-c", SLICING_CHECK], env={**env, "ATEN_CPU_CAPABILITY": capability},
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout.strip().splitlines()[-1])
        if result.pop("capability").lower() != capability:
            continue  # this CPU lacks it; torch fell back to a lower capability, checked on its own turn
        assert set(result.values()) == {0}, (capability, result)


# ---- factory ----


def test_make_rule_and_learning_rate() -> None:
    opt = OptimizerSection(name="soap", lr=0.03, adamw_lr=1e-3, precondition_frequency=7, betas=(0.8, 0.9))
    matrix, vector = make_rule(opt, "matrix"), make_rule(opt, "adamw")
    assert isinstance(matrix, SOAP) and not matrix.elementwise and matrix.precondition_frequency == 7
    assert isinstance(vector, AdamW) and vector.elementwise and vector.betas == (0.8, 0.9)
    assert learning_rate(opt, "matrix") == 0.03 and learning_rate(opt, "adamw") == 1e-3
    blocked = make_rule(OptimizerSection(name="shampoo", max_preconditioner_dim=64), "matrix")
    assert isinstance(blocked, Shampoo) and blocked.max_preconditioner_dim == 64
    muon = make_rule(OptimizerSection(name="muon", ns_dtype="bfloat16", lr_adjust="none"), "matrix")
    assert isinstance(muon, Muon) and muon.ns_dtype == torch.bfloat16 and muon.lr_adjust == "none"
    assert isinstance(make_rule(OptimizerSection(name="shampoo"), "matrix"), Shampoo)
    adamw_only = OptimizerSection(name="adamw")
    assert isinstance(make_rule(adamw_only, "matrix"), AdamW)
    assert learning_rate(adamw_only, "matrix") == adamw_only.adamw_lr
    with pytest.raises(ValueError):
        make_rule(opt, "vector")


def test_float32_gradient_norm_is_megatrons_and_close_to_the_exact_one() -> None:
    """``optimizer.clip_norm_dtype=float32`` (the default): per-tensor fp32 norms in one
    multi-tensor call, squared and summed in fp32, as Megatron's ``get_grad_norm_fp32``; within
    fp32 rounding of the float64 sum (relative 1e-5: a few hundred terms of relative error 2^-24
    each at most, cascaded sums inside each norm), and float64 stays the exact mode."""
    from canzona.optim.clip import sum_of_squares

    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(s, generator=g) * 10 ** torch.randint(-3, 2, (1,), generator=g).item()
             for s in [(512, 384), (384,), (1024, 96), (7, 3), (4096,)]]
    fp32, fp64 = sum_of_squares(grads, "float32"), sum_of_squares(grads, "float64")
    assert fp32.dtype == torch.float32 and fp64.dtype == torch.float64
    megatron = torch.stack([torch.linalg.vector_norm(t) for t in grads]).square().sum()
    assert torch.allclose(fp32, megatron, rtol=1e-6)
    assert abs(fp32.double() - fp64).item() / fp64.item() <= 1e-5
    exact = sum((t.double() ** 2).sum() for t in grads)
    assert abs(fp64 - exact).item() / exact.item() <= 1e-12
    assert sum_of_squares([], "float32").item() == 0.0
