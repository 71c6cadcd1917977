"""What Shampoo and SOAP share: Kronecker-factored state, the refresh schedule, and
preconditioner blocking.

Blocking (as Distributed Shampoo's ``max_preconditioner_dim``): a matrix whose side exceeds
``optimizer.max_preconditioner_dim`` (B) is cut into a grid of blocks of B rows and B columns
(the last row / column of blocks takes the remainder), and every block is optimised as a
matrix of its own, with its own moments, factors and inverse roots / eigenbases (and, for
Shampoo, its own Adam grafting, as Distributed Shampoo grafts per block). A blocked update is
therefore exactly the unblocked update of each block, independent of the other blocks, and
the factors of Qwen3-32B's fused fc1 (51200 × 5120) are 8192² and 5120² per block instead of
one 51200² matrix (10 GiB in fp32, and an eigendecomposition of 9·51200³ flops).

Default B = 8192, a value LLM training recipes built on Distributed Shampoo / SOAP use
(Distributed Shampoo's own default is 1024). Every side up to 8192 stays whole, which covers
the hidden size of every Qwen3 model (<= 5120) and every matrix of the scaled models the local
sweeps run, so blocking only cuts the long side of the large MLP, QKV and attention-output
matrices: a factor is at most 8192² fp32 = 256 MiB and one eigendecomposition at most ~5 TFLOP.
Memory hardly depends on B once B is below the long side: a bm × bn block keeps 2·bm·bn + 2·bm²
+ 2·bn² state elements, i.e. 2 + 2·bm/bn + 2·bn/bm per element of the matrix: about 6.5 for fc1
at B = 8192, 6 at B = 1024, against 22 unblocked (22 GiB of fp32 state for that one matrix).
What B trades is preconditioner quality (larger is closer to full Shampoo) against flops, which
grow linearly with B.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from torch import Tensor

from canzona.optim.definitions import block_shapes, blocks
from canzona.optim.rule import Shape, UpdateRule, check_matrices


def is_refresh_step(step: int, frequency: int) -> bool:
    """Steps 1, 1+f, 1+2f, ...: the first step always has a preconditioner."""
    return (step - 1) % frequency == 0


def block_of(t: Tensor, rows: slice, cols: slice) -> Tensor:
    """The view ``t[rows, cols]`` (by narrow: Python slicing fails on fake CUDA tensors of a
    CPU-only torch, which the dry run uses)."""
    return t.narrow(0, rows.start, rows.stop - rows.start).narrow(1, cols.start, cols.stop - cols.start)


class KroneckerRule(UpdateRule):
    """A rule that updates each block of a matrix as a matrix of its own.

    Subclasses implement `block_update` for one unblocked matrix and name their two
    preconditioner matrices (``left``: rows², ``right``: cols²). State keys of block i of a
    blocked matrix carry the suffix ``/i`` (``L/0``, ``exp_avg/3``); an unblocked matrix keeps
    the plain names.
    """

    elementwise = False
    name = "Kronecker"
    left = "left"
    right = "right"

    def __init__(
        self,
        betas: tuple[float, float],
        eps: float,
        precondition_frequency: int,
        max_preconditioner_dim: int,
    ) -> None:
        if precondition_frequency < 1:
            raise ValueError(f"precondition_frequency={precondition_frequency} must be >= 1")
        if max_preconditioner_dim < 1:
            raise ValueError(f"max_preconditioner_dim={max_preconditioner_dim} must be >= 1")
        self.betas = tuple(betas)
        self.eps = eps
        self.precondition_frequency = precondition_frequency
        self.max_preconditioner_dim = max_preconditioner_dim

    @property
    def state_keys(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq", "L", "R", self.left, self.right)

    @abstractmethod
    def block_update(self, G: Tensor, state: dict[str, Tensor], step: int) -> Tensor:
        """The update of one block from its contiguous gradient, mutating its state in place."""

    def init_state(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        cuts = block_shapes(shape, self.max_preconditioner_dim)
        if len(cuts) == 1:
            return kronecker_state(cuts[0], device, dtype, self.left, self.right)
        return {
            f"{k}/{i}": t
            for i, s in enumerate(cuts)
            for k, t in kronecker_state(s, device, dtype, self.left, self.right).items()
        }

    def directions(self, grads: list[Tensor], states: list[dict[str, Tensor]], step: int) -> list[Tensor]:
        check_matrices(grads, self.name)
        out = []
        for grad, state in zip(grads, states, strict=True):
            cuts = blocks(tuple(grad.shape), self.max_preconditioner_dim)
            if len(cuts) == 1:
                out.append(self.block_update(grad, state, step).to(grad.dtype))
                continue
            full = torch.empty_like(grad)
            for i, (rows, cols) in enumerate(cuts):
                sub = {k: state[f"{k}/{i}"] for k in self.state_keys}
                block = self.block_update(block_of(grad, rows, cols).contiguous(), sub, step)
                block_of(full, rows, cols).copy_(block)
            out.append(full)
        return out


def kronecker_state(
    shape: Shape, device: torch.device | str, dtype: torch.dtype, left: str, right: str
) -> dict[str, Tensor]:
    """Zero state of one block: Adam moments, the factors L (rows²) and R (cols²), and one rows²
    and one cols² matrix named `left` / `right` (inverse roots, or eigenbases)."""
    rows, cols = shape
    shapes = {"exp_avg": (rows, cols), "exp_avg_sq": (rows, cols), "L": (rows, rows), "R": (cols, cols),
              left: (rows, rows), right: (cols, cols)}
    return {k: torch.zeros(s, device=device, dtype=dtype) for k, s in shapes.items()}
