"""The batched Muon path (``optimizer.batch_equal_shapes``) against the one-at-a-time update.

A stacked GEMM is not bit-identical to one GEMM per matrix on every CPU and BLAS (see
`canzona.optim.newton_schulz`), so the batched Newton–Schulz is held to the derived tolerance
there: measured against the same iteration in float64, it is as accurate as the exact path.
Everything around it (momentum, grouping, order, lr scale) is checked bit for bit.
Shampoo and SOAP keep one matrix at a time (docs/design.md, "Batched updates").
"""

from __future__ import annotations

import pytest
import torch

from canzona.optim import Muon, lr_scale, make_rule
from canzona.optim.newton_schulz import newton_schulz
from canzona.optim.rule import equal_shape_groups
from canzona.optim.section import OptimizerSection

# the derived tolerance (canzona.optim.newton_schulz): batched error <= ACCURACY x exact error
ACCURACY = 4.0
NS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (x.double() - ref).abs().max().item()


@pytest.mark.parametrize("shape", [(12, 32, 80), (6, 80, 32), (16, 48, 48)], ids=["wide", "tall", "square"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_newton_schulz_is_as_accurate_as_one_at_a_time(shape: tuple[int, int, int], dtype: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape)
    exact64 = torch.stack([newton_schulz(m.double(), dtype=torch.float64) for m in x])
    one = torch.stack([newton_schulz(m, dtype=NS_DTYPES[dtype]) for m in x])
    batched = newton_schulz(x, dtype=NS_DTYPES[dtype], stacked=True)
    assert batched.shape == x.shape and batched.dtype == NS_DTYPES[dtype]
    e_one, e_batched = max_err(one, exact64), max_err(batched, exact64)
    assert e_one > 0.0  # the float64 reference resolves the rounding it is measuring
    assert e_batched <= ACCURACY * e_one
    assert max_err(batched, one.double()) <= (1.0 + ACCURACY) * e_one


def test_batched_newton_schulz_normalises_each_matrix_alone() -> None:
    """A matrix scaled by 1000 next to one of unit scale: each gets its own Frobenius norm."""
    torch.manual_seed(1)
    x = torch.randn(2, 16, 24)
    x[0] *= 1000.0
    batched = newton_schulz(x, stacked=True)
    for k in range(2):
        assert torch.allclose(batched[k], newton_schulz(x[k]), atol=1e-5)


def test_stacked_newton_schulz_refuses_a_single_matrix() -> None:
    with pytest.raises(ValueError, match=r"takes \(B, m, n\) with stacked=True"):
        newton_schulz(torch.randn(4, 6), stacked=True)


def test_equal_shape_groups_keep_first_appearance_order() -> None:
    ts = [torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64),
          torch.zeros(3, 2)]
    assert equal_shape_groups(ts) == [[0, 2], [1, 4], [3]]
    assert equal_shape_groups([]) == []


# a rank's matrices in one call: 5 experts of one shape, 3 tall ones, two lone shapes
CALL_SHAPES = [(24, 40)] * 3 + [(40, 16)] + [(24, 40)] * 2 + [(16, 16)] + [(40, 16)] * 2 + [(8, 40)]


@pytest.mark.parametrize("nesterov", [True, False])
def test_batched_muon_matches_one_at_a_time(nesterov: bool) -> None:
    torch.manual_seed(2)
    exact = Muon(nesterov=nesterov, lr_adjust="original")
    batched = Muon(nesterov=nesterov, lr_adjust="original", batch_equal_shapes=True)
    s_exact = [exact.init_state(s, "cpu", torch.float32) for s in CALL_SHAPES]
    s_batched = [batched.init_state(s, "cpu", torch.float32) for s in CALL_SHAPES]
    groups = equal_shape_groups([torch.empty(s) for s in CALL_SHAPES])
    for step in (1, 2, 3):
        grads = [torch.randn(s) for s in CALL_SHAPES]
        # the updates the exact path orthogonalises, from a copy of its state before the step
        before = [{k: v.clone() for k, v in st.items()} for st in s_exact]
        updates = [exact._momentum(g, st) for g, st in zip(grads, before)]
        d_exact = exact.directions(grads, s_exact, step)
        d_batched = batched.directions(grads, s_batched, step)
        for a, b in zip(s_exact, s_batched):  # momentum is elementwise: bit for bit
            assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
        for group in groups:
            if len(group) == 1:  # a lone shape takes the exact 2-D path
                assert torch.equal(d_batched[group[0]], d_exact[group[0]])
                continue
            stack = torch.stack([updates[i] for i in group])
            # the plumbing is exact: the batched directions are the batched iteration, scaled
            want = newton_schulz(stack, stacked=True)
            exact64 = torch.stack([newton_schulz(u.double(), dtype=torch.float64) for u in stack])
            e_one = max_err(torch.stack([newton_schulz(u) for u in stack]), exact64)
            for k, i in enumerate(group):
                scale = lr_scale(CALL_SHAPES[i], "original")
                assert d_batched[i].shape == grads[i].shape and d_batched[i].dtype == grads[i].dtype
                assert torch.equal(d_batched[i], want[k] * scale)
                assert max_err(d_batched[i], d_exact[i].double()) <= (1.0 + ACCURACY) * e_one * scale


def test_batch_equal_shapes_is_off_by_default_and_read_from_the_config() -> None:
    assert OptimizerSection().batch_equal_shapes is False
    assert make_rule(OptimizerSection(), "matrix").batch_equal_shapes is False
    assert make_rule(OptimizerSection(batch_equal_shapes=True), "matrix").batch_equal_shapes is True
