"""What an owner does with whole tensors, shared by every distributed method and the
single-process reference, so they cannot drift apart.

`MatrixUpdates` turns full gradients of matrices into full updates: one call of the rule over
all matrices given (each computed alone, so any owner may take any subset; Muon's opt-in
``batch_equal_shapes`` stacks equal shapes, exact to rounding only), a fused matrix
optimised as its logical sub-matrices when the inventory lists them (``split_fused``), and the
state kept per (param, sub-matrix). `ElementwiseUpdates` runs AdamW's fused, slice-invariant
step on targets of any shape: whole tensors, TP shards, or flat ZeRO-1 slices cut anywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from canzona.inventory import ParamSpec, SubMatrix
from canzona.optim.clip import clip_coefficient, sum_of_squares
from canzona.optim.registry import learning_rate, make_rule
from canzona.optim.rule import UpdateRule, apply_update
from canzona.optim.section import OptimizerSection


def _rows(sub: SubMatrix) -> list[int]:
    return [r for a, b, step in sub.row_blocks for r in range(a, b, step)]


class MatrixUpdates:
    def __init__(self, specs: tuple[ParamSpec, ...] | list[ParamSpec], opt: OptimizerSection):
        self.specs = specs
        self.opt = opt
        self.rule: UpdateRule = make_rule(opt, "matrix")
        self.lr = learning_rate(opt, "matrix")
        self.states: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        self._row_index: dict[tuple[str, int, int], torch.Tensor] = {}

    def _pieces(self, index: int, g: torch.Tensor, tp: int = 1,
                rank: int = 0) -> list[tuple[str, torch.Tensor, tuple[int, ...]]]:
        """(name, tensor, whole shape) of each matrix the rule sees in ``g``: param ``index``'s
        gradient, or the ``rank``-th of its ``tp`` TP shards (a fused matrix's sub-matrices: its
        rows of each, cut along dim 0)."""
        spec = self.specs[index]
        if not spec.subs:
            return [(spec.name, g, spec.shape)]
        if tp > 1 and spec.tp_dim != 0:
            raise ValueError(f"{spec.name}: sub-matrices of a matrix cut along dim {spec.tp_dim}")
        return [(s.name, g[self._rows_of(spec, s, g.device, tp, rank)], s.shape) for s in spec.subs]

    def _rows_of(self, spec: ParamSpec, sub: SubMatrix, device: torch.device, tp: int = 1,
                 rank: int = 0) -> torch.Tensor:
        """The rows of ``sub`` the ``rank``-th of ``tp`` row shards of ``spec`` holds (tp 1: the
        whole matrix), as indices into it, in the sub-matrix's order."""
        key = (sub.name, tp, rank)
        if key not in self._row_index:
            n = spec.shape[0] // tp
            lo = rank * n
            self._row_index[key] = torch.tensor([r - lo for r in _rows(sub) if lo <= r < lo + n],
                                                dtype=torch.long, device=device)
        return self._row_index[key]

    def _split(self, indices: list[int], grads: list[torch.Tensor], tp: int = 1, rank: int = 0):
        """The rule's inputs: state keys, contiguous matrices and their whole shapes."""
        keys, pieces, shapes = [], [], []
        for i, g in zip(indices, grads):
            for name, piece, shape in self._pieces(i, g, tp, rank):
                keys.append((i, name))
                pieces.append(piece.contiguous())
                shapes.append(shape)
        return keys, pieces, shapes

    def _join(self, indices: list[int], grads: list[torch.Tensor], dirs: list[torch.Tensor], tp: int = 1,
              rank: int = 0) -> list[torch.Tensor]:
        """The rule's directions put back into each param's (or shard's) shape."""
        out: list[torch.Tensor] = []
        k = 0
        for i, g in zip(indices, grads):
            spec = self.specs[i]
            if not spec.subs:
                out.append(dirs[k])
                k += 1
                continue
            whole = torch.empty_like(g)
            for s in spec.subs:
                whole[self._rows_of(spec, s, g.device, tp, rank)] = dirs[k]
                k += 1
            out.append(whole)
        return out

    def directions(self, indices: list[int], full_grads: list[torch.Tensor], step: int) -> list[torch.Tensor]:
        keys, grads, _ = self._split(indices, full_grads)
        states = [self._state(k, g) for k, g in zip(keys, grads)]
        dirs = self.rule.directions(grads, states, step) if grads else []
        return self._join(indices, full_grads, dirs)

    def shard_directions(self, indices: list[int], local_grads: list[torch.Tensor], step: int, tp: int, rank: int,
                         reduce: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Updates of the ``rank``-th of ``tp`` shards of matrices (each cut along its spec's
        ``tp_dim``), whose other shards are held elsewhere: ``reduce`` sums a tensor over the
        holders of all of them (`UpdateRule.sharded_directions`). A fused matrix's sub-matrices
        are its local rows of each (``split_fused``: they are cut along dim 0). The state is kept
        per (param, sub-matrix) in the shard's shape."""
        for i in indices:
            if self.specs[i].tp_dim is None:
                raise ValueError(f"{self.specs[i].name} is not split over TP")
        keys, grads, shapes = self._split(indices, local_grads, tp, rank)
        dims = [self.specs[i].tp_dim for i, _ in keys]
        states = [self._state(k, g) for k, g in zip(keys, grads)]
        dirs = self.rule.sharded_directions(grads, states, step, shapes, dims, reduce) if grads else []
        return self._join(indices, local_grads, dirs, tp, rank)

    def _state(self, key: tuple[int, str], grad: torch.Tensor) -> dict[str, torch.Tensor]:
        if key not in self.states:
            self.states[key] = self.rule.init_state(tuple(grad.shape), grad.device, grad.dtype)
        return self.states[key]

    def apply(self, param: torch.Tensor, direction: torch.Tensor) -> None:
        apply_update(param, direction, self.lr, self.opt.weight_decay)


class ElementwiseUpdates:
    """AdamW on arbitrary tensors (whole params, TP shards, or flat slices of a shard)."""

    def __init__(self, opt: OptimizerSection):
        self.opt = opt
        self.rule = make_rule(opt, "adamw")
        self.lr = learning_rate(opt, "adamw")
        self.states: dict[object, dict[str, torch.Tensor]] = {}

    def step(self, keys: list[object], params: list[torch.Tensor], grads: list[torch.Tensor], step: int) -> None:
        if not keys:
            return
        states = []
        for k, g in zip(keys, grads):
            if k not in self.states:
                self.states[k] = self.rule.init_state(tuple(g.shape), g.device, g.dtype)
            states.append(self.states[k])
        self.rule.step(list(params), list(grads), states, step, self.lr, self.opt.weight_decay)


class ReferenceOptimizer:
    """The single-process optimizer on the full model: the ground truth for parity tests.

    ``matrix_rule`` False gives AdamW everywhere (the ``adamw`` method / optimizer).
    """

    def __init__(self, specs: list[ParamSpec], opt: OptimizerSection, matrix_rule: bool = True):
        self.specs = specs
        self.opt = opt
        self.matrix_rule = matrix_rule and opt.name != "adamw"
        self.matrices = MatrixUpdates(specs, opt)
        self.elementwise = ElementwiseUpdates(opt)
        self.steps = 0

    @torch.no_grad()
    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        self.steps += 1
        sumsq = sum_of_squares((grads[s.name] for s in self.specs), self.opt.clip_norm_dtype)
        coef = clip_coefficient(float(sumsq), self.opt.clip_grad)
        if coef is not None:
            grads = {n: g * coef for n, g in grads.items()}
        mat = [i for i, s in enumerate(self.specs) if self.matrix_rule and s.kind == "matrix"]
        ew = [i for i, s in enumerate(self.specs) if i not in set(mat)]
        dirs = self.matrices.directions(mat, [grads[self.specs[i].name] for i in mat], self.steps)
        for i, d in zip(mat, dirs):
            self.matrices.apply(params[self.specs[i].name], d)
        names = [self.specs[i].name for i in ew]
        self.elementwise.step(names, [params[n] for n in names], [grads[n] for n in names], self.steps)
