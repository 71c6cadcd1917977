"""Optimizer maths: parity with torch.optim, batching invariance, refresh schedules, descent."""

from __future__ import annotations

import pytest
import torch

from canzona.config import OptimizerSection
from canzona.optim import (
    SOAP,
    AdamW,
    Muon,
    Shampoo,
    UpdateRule,
    apply_update,
    learning_rate,
    lr_scale,
    make_rule,
    newton_schulz,
)
from canzona.optim.shampoo import is_refresh_step

SHAPES = [(8, 24), (24, 8), (16, 16)]  # wide, tall, square


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def run_rule(rule: UpdateRule, grads_per_step: list[list[torch.Tensor]]) -> tuple[list, list]:
    """Directions per step and the final states, starting from fresh state."""
    states = [rule.init_state(tuple(g.shape), "cpu", g.dtype) for g in grads_per_step[0]]
    dirs = [rule.directions(grads, states, step) for step, grads in enumerate(grads_per_step, start=1)]
    return dirs, states


def matrix_rules() -> list[UpdateRule]:
    return [
        Muon(ns_dtype="float32"),
        Muon(ns_dtype="bfloat16", nesterov=False, lr_adjust="match_rms_adamw"),
        Shampoo(precondition_frequency=2),
        SOAP(precondition_frequency=2),
    ]


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


# ---- properties shared by every matrix rule ----


@pytest.mark.parametrize("rule", matrix_rules(), ids=lambda r: type(r).__name__)
def test_batched_equals_single(rule: UpdateRule) -> None:
    """A matrix's direction and state must not depend on which other matrices share the call."""
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


@pytest.mark.parametrize("rule", matrix_rules(), ids=lambda r: type(r).__name__)
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


@pytest.mark.parametrize("rule", matrix_rules(), ids=lambda r: type(r).__name__)
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


# ---- AdamW ----


def test_adamw_matches_torch() -> None:
    gen = torch.Generator().manual_seed(6)
    lr, wd, betas, eps = 1e-2, 0.1, (0.9, 0.95), 1e-8
    ref = torch.randn(7, 5, generator=gen).requires_grad_(True)
    ours = ref.detach().clone()
    opt = torch.optim.AdamW([ref], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    rule = AdamW(betas=betas, eps=eps)
    state = rule.init_state(tuple(ours.shape), "cpu", ours.dtype)
    for step in range(1, 21):
        grad = torch.randn(7, 5, generator=gen)
        ref.grad = grad.clone()
        opt.step()
        (direction,) = rule.directions([grad], [state], step)
        apply_update(ours, direction, lr, wd)
    # torch multiplies m/denom by lr/(1-beta1^t); we divide m/denom by (1-beta1^t) and multiply by lr.
    assert rel_err(ours, ref.detach()) <= 1e-6


def test_adamw_flat_slices_equal_whole_tensor() -> None:
    gen = torch.Generator().manual_seed(7)
    shape = (6, 9)
    steps = [[torch.randn(shape, generator=gen)] for _ in range(4)]
    rule = AdamW(betas=(0.9, 0.95))
    whole, _ = run_rule(rule, steps)
    bounds = [(0, 5), (5, 31), (31, 54)]  # uneven cuts across rows
    sliced, _ = run_rule(rule, [[g.reshape(-1)[a:b] for a, b in bounds for g in grads] for grads in steps])
    for step in range(len(steps)):
        torch.testing.assert_close(torch.cat(sliced[step]), whole[step][0].reshape(-1), rtol=0, atol=0)


# ---- factory ----


def test_make_rule_and_learning_rate() -> None:
    opt = OptimizerSection(name="soap", lr=0.03, adamw_lr=1e-3, precondition_frequency=7, betas=(0.8, 0.9))
    matrix, vector = make_rule(opt, "matrix"), make_rule(opt, "adamw")
    assert isinstance(matrix, SOAP) and not matrix.elementwise and matrix.precondition_frequency == 7
    assert isinstance(vector, AdamW) and vector.elementwise and vector.betas == (0.8, 0.9)
    assert learning_rate(opt, "matrix") == 0.03 and learning_rate(opt, "adamw") == 1e-3
    muon = make_rule(OptimizerSection(name="muon", ns_dtype="bfloat16", lr_adjust="none"), "matrix")
    assert isinstance(muon, Muon) and muon.ns_dtype == torch.bfloat16 and muon.lr_adjust == "none"
    assert isinstance(make_rule(OptimizerSection(name="shampoo"), "matrix"), Shampoo)
    adamw_only = OptimizerSection(name="adamw")
    assert isinstance(make_rule(adamw_only, "matrix"), AdamW)
    assert learning_rate(adamw_only, "matrix") == adamw_only.adamw_lr
    with pytest.raises(ValueError):
        make_rule(opt, "vector")
