"""The built-in optimizers' descriptions: config options, flop counts, state sizes, blocking.

Everything here is arithmetic on shapes, without torch: the registry, the config schema, the
cost models and the planner read these, and each `OptimizerDef` names its update rule by import
path (`canzona.optim.muon`, `.shampoo`, `.soap`, `.adamw`), which is imported only when a rank
builds the rule. An optimizer of your own may keep its description and its rule in one module
(docs/usage.md, "Extending"); the built-ins keep them apart so that a command line is answered
without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from canzona.optim.spec import OptimizerDef, Option, Settings, Shape

# ---- AdamW (every elementwise parameter; Shampoo and SOAP read betas and eps too) ----

FLOPS_PER_ELEMENT = 12.0
BETAS = Option("betas", tuple[float, float], (0.9, 0.95), "Adam moment coefficients")
EPS = Option("eps", float, 1e-8, "Adam denominator epsilon")
ADAMW_OPTIONS = (Option("adamw_lr", float, 1e-3, "learning rate of AdamW parameters"), BETAS, EPS)

ADAMW = OptimizerDef(
    name="adamw",
    rule="canzona.optim.adamw:AdamW.from_config",
    options=ADAMW_OPTIONS,
    matrix=False,
    steady_flops=lambda shape, s: FLOPS_PER_ELEMENT * shape[0] * shape[1],
    state_numel=lambda shape, s: 2 * math.prod(shape),  # exp_avg and exp_avg_sq
)

# ---- Muon ----

LR_ADJUSTS = ("original", "match_rms_adamw", "none")
NS_DTYPE_NAMES = ("float32", "bfloat16")


def muon_flops(m: int, n: int, ns_steps: int = 5) -> float:
    """Newton-Schulz with k steps on an m x n matrix (m <= n after transposing).

    Per step: A = X Xᵀ (2 m² n), B = b A + c A A (2 m³), X' = a X + B X (2 m² n), i.e.
    k (4 m² n + 2 m³), plus O(m n) momentum and scaling.
    """
    m, n = min(m, n), max(m, n)
    return ns_steps * (4.0 * m * m * n + 2.0 * m**3) + 10.0 * m * n


def muon_gram_flops(shape: tuple[int, int], tp_dim: int, tp: int, ns_steps: int = 5) -> float:
    """One TP rank's Newton-Schulz of its shard of an m x n matrix cut along ``tp_dim`` into
    ``tp`` shards, Megatron's ``distributed`` way (`canzona.optim.newton_schulz.newton_schulz_sharded`):
    the shard is s x u with u the unsharded side and s = the sharded side / tp. Per step: the
    partial Gram product (2 s u²), the polynomial of the summed Gram, which every rank computes
    whole (2 u³), the shard's update (2 s u²): k (4 s u² + 2 u³), plus O(s u) momentum and scaling.
    """
    u = shape[1 - tp_dim]
    s = shape[tp_dim] // tp
    return ns_steps * (4.0 * s * u * u + 2.0 * u**3) + 10.0 * s * u


def muon_gram_share(shapes: list[tuple[int, int]], tp_dim: int, tp: int, ns_steps: int = 5) -> float:
    """`muon_gram_flops` of one rank's shards of these matrices (a fused matrix's sub-matrices)
    as a fraction of `muon_flops` of the whole matrices: what one TP rank does of the update."""
    whole = sum(muon_flops(m, n, ns_steps) for m, n in shapes)
    return sum(muon_gram_flops(sh, tp_dim, tp, ns_steps) for sh in shapes) / whole if whole else 0.0


MUON_OPTIONS = (
    Option("momentum", float, 0.95, "momentum coefficient"),
    Option("nesterov", bool, True, "Nesterov momentum"),
    Option("ns_steps", int, 5, "Newton-Schulz iterations", minimum=1),
    Option("ns_coefficients", tuple[float, float, float], (3.4445, -4.7750, 2.0315), "quintic coefficients"),
    Option("ns_eps", float, 1e-7, "floor of the normalising Frobenius norm"),
    # float32 for parity tests, bfloat16 as torch.optim.Muon does.
    Option("ns_dtype", str, "float32", "Newton-Schulz matmul dtype", choices=NS_DTYPE_NAMES),
    Option("lr_adjust", str, "original", "shape-dependent lr scale (torch.optim.Muon)", choices=LR_ADJUSTS),
    # off by default: a stacked GEMM is equal to one GEMM per matrix up to rounding only, and the
    # parity tests check the distributed methods bit for bit (canzona.optim.newton_schulz).
    Option("batch_equal_shapes", bool, False, "one stacked Newton-Schulz (bmm) per group of equal-shape matrices "
           "a rank updates together (MoE experts, a dense model's layers): the per-call overhead once per group; "
           "equal to one-at-a-time up to rounding, not bit for bit"),
)

MUON = OptimizerDef(
    name="muon",
    rule="canzona.optim.muon:Muon.from_config",
    options=MUON_OPTIONS,
    steady_flops=lambda shape, s: muon_flops(shape[0], shape[1], s.ns_steps),
    state_numel=lambda shape, s: math.prod(shape),  # the momentum buffer
    # momentum lerp, Nesterov lerp, normalisation, scale, casts
    elementwise_passes=8.0,
    matmul_dtype=lambda s: s.ns_dtype,
    tp_sharded=True,  # Newton-Schulz from TP-summed Gram products (`Muon.sharded_directions`)
)

# ---- Shampoo and SOAP: blocked Kronecker factors (see `canzona.optim.kronecker`) ----

MAX_PRECONDITIONER_DIM = 8192
# A dense symmetric eigendecomposition (tridiagonalisation + QR iterations + back-transform)
# costs about 9 n^3 flops; one power iteration + QR of an n x n basis about 2 n^3 + 4/3 n^3.
EIGH_FLOPS_FACTOR = 9.0
POWER_QR_FLOPS_FACTOR = 2.0 + 4.0 / 3.0

KRONECKER_OPTIONS = (
    Option("precondition_frequency", int, 10, "steps between preconditioner refreshes", minimum=1),
    Option("max_preconditioner_dim", int, MAX_PRECONDITIONER_DIM,
           "largest preconditioner side; longer sides are cut into blocks", minimum=1),
)


def _cuts(size: int, max_dim: int) -> list[slice]:
    return [slice(a, min(a + max_dim, size)) for a in range(0, size, max_dim)]


def blocks(shape: tuple[int, ...], max_dim: int) -> list[tuple[slice, slice]]:
    """The (rows, cols) slices of each block, row-major; one block when no side exceeds max_dim."""
    rows, cols = shape
    return [(r, c) for r in _cuts(rows, max_dim) for c in _cuts(cols, max_dim)]


def block_shapes(shape: tuple[int, ...], max_dim: int) -> list[Shape]:
    return [(r.stop - r.start, c.stop - c.start) for r, c in blocks(shape, max_dim)]


def factor_state_numel(shape: tuple[int, ...], max_dim: int) -> int:
    """Per block: two moments (m·n each), two factors and two roots or bases (m², n² each)."""
    return sum(2 * m * n + 2 * m * m + 2 * n * n for m, n in block_shapes(shape, max_dim))


def cube_sum(m: int, n: int) -> float:
    return float(m) ** 3 + float(n) ** 3


def kronecker_definition(
    name: str,
    rule: str,
    options: tuple[Option, ...],
    block_steady_flops: Callable[[int, int], float],
    block_refresh_flops: Callable[[int, int], float],
    elementwise_passes: float,
) -> OptimizerDef:
    """The `OptimizerDef` of a blocked Kronecker rule from its per-block flops: every cost, the
    state size and the calibration shapes are sums over the blocks."""

    def per_blocks(per_block: Callable[[int, int], float]) -> Callable[[Shape, Settings], float]:
        return lambda shape, s: sum(per_block(m, n) for m, n in block_shapes(shape, s.max_preconditioner_dim))

    return OptimizerDef(
        name=name,
        rule=rule,
        options=(*options, *KRONECKER_OPTIONS),
        steady_flops=per_blocks(block_steady_flops),
        refresh_flops=per_blocks(block_refresh_flops),
        refresh_every=lambda s: s.precondition_frequency,
        state_numel=lambda shape, s: factor_state_numel(shape, s.max_preconditioner_dim),
        kernels=lambda shape, s: block_shapes(shape, s.max_preconditioner_dim),
        elementwise_passes=elementwise_passes,
    )


def shampoo_block_steady_flops(m: int, n: int) -> float:
    """Factor updates L += G Gᵀ, R += Gᵀ G; preconditioning L^-1/4 G R^-1/4; Adam grafting."""
    per_step = 2.0 * m * m * n + 2.0 * m * n * n  # factor updates
    per_step += 2.0 * m * m * n + 2.0 * m * n * n  # preconditioning
    return per_step + 12.0 * m * n  # grafting: an Adam step


def shampoo_block_refresh_flops(m: int, n: int) -> float:
    """Both eigendecompositions and rebuilding the roots from them."""
    return (EIGH_FLOPS_FACTOR + 2.0) * cube_sum(m, n)


SHAMPOO = kronecker_definition(
    "shampoo",
    "canzona.optim.shampoo:Shampoo.from_config",
    (BETAS, EPS, Option("shampoo_eps", float, 1e-12, "ridge added to the factors before the inverse root")),
    shampoo_block_steady_flops,
    shampoo_block_refresh_flops,
    elementwise_passes=16.0,  # moments, grafting Adam, bias corrections, norms
)


def soap_block_steady_flops(m: int, n: int) -> float:
    """Factor EMAs; rotating the gradient and the moment into the eigenbasis and the update
    back; Adam in the rotated basis."""
    per_step = 2.0 * m * m * n + 2.0 * m * n * n  # factor updates
    per_step += 2.0 * (2.0 * m * m * n + 2.0 * m * n * n)  # rotate in and out
    return per_step + 12.0 * m * n


def soap_block_refresh_flops(m: int, n: int) -> float:
    """Power iteration + QR of both bases."""
    return POWER_QR_FLOPS_FACTOR * cube_sum(m, n)


SOAP = kronecker_definition(
    "soap",
    "canzona.optim.soap:SOAP.from_config",
    (BETAS, EPS),
    soap_block_steady_flops,
    soap_block_refresh_flops,
    elementwise_passes=16.0,  # moments, rotated Adam, bias corrections
)

BUILT_IN: tuple[OptimizerDef, ...] = (MUON, SHAMPOO, SOAP, ADAMW)
