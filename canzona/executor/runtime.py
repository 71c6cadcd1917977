"""The executor: runs one rank's `Program` on real process groups, tensors and the model.

It decides nothing: the program says what to issue, wait for, compute and apply, in which
order. The runtime owns the flat buffers (`FlatBuffers`), the communicator (`Communicator`,
which records what it hands to torch per action) and the optimizer state (`MatrixUpdates` for
whole-matrix rules, `ElementwiseUpdates` for AdamW ranges), and books each action's time to the
phase the program names (`StepTimer`).

Data flows between actions by tag: a gather's result (full matrices) feeds a `Compute` whose
``source`` names it, a `Compute`'s updates feed a scatter or an `Apply`, a scatter's received
shards feed an `Apply`.

bf16: the model's parameters (and the flat parameter buffer the DP all-gather fills) are bf16;
the optimizer updates fp32 main parameters held for the program's ``main_ranges`` only and
copies them into the model at the end of the step (`CopyToModel`). In fp32 the model's
parameters are the main parameters.

Overlapped parameter gather: the gathers the step issues stay in flight; `Forward` lists, per
gather, the first parameter that needs it, and a forward pre-hook on that parameter's module
waits for it (booked as ``param_sync``, the exposed part).
"""

from __future__ import annotations

import bisect
from typing import Any

import torch
from torch import nn

from canzona.executor.buffer import FlatBuffers
from canzona.executor.comm import Communicator, Pending, Recorder
from canzona.optim.clip import clip_coefficient, sum_of_squares
from canzona.optim.owner import ElementwiseUpdates, MatrixUpdates
from canzona.plan.experts import rank_space
from canzona.program.actions import (
    TRANSFER_TYPES,
    Apply,
    Backward,
    ClipScale,
    Comm,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GradNorm,
    GramCompute,
    Mark,
    Program,
    Wait,
    dispatch_table,
)

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def model_dtype(plan) -> torch.dtype:
    """The torch dtype a plan's model is built in (``plan.execution.dtype``)."""
    return _TORCH_DTYPES[plan.execution.dtype]


def _in_space_order(model: nn.Module, specs) -> list[nn.Parameter]:
    """The model's parameters in the order of the rank's params ``specs`` (by name): an MoE
    model registers its experts inside each layer, the buffer holds them after the dense params."""
    named = dict(model.named_parameters())
    names = [s.name for s in specs]
    if set(named) != set(names):
        missing, extra = sorted(set(names) - set(named)), sorted(set(named) - set(names))
        raise ValueError(f"the model's parameters differ from the plan's: missing {missing[:3]}, "
                         f"unexpected {extra[:3]} ({len(named)} vs {len(names)})")
    return [named[n] for n in names]


class Runtime:
    def __init__(self, model: nn.Module, plan, program: Program, optimizer_cfg, ctx):
        if (plan.dp, plan.tp) != (ctx.dp, ctx.tp) or (program.dp_rank, program.tp_rank) != (ctx.dp_rank, ctx.tp_rank):
            raise ValueError(
                f"program of rank (dp {program.dp_rank}, tp {program.tp_rank}) of a dp={plan.dp} tp={plan.tp} plan "
                f"cannot run on rank (dp {ctx.dp_rank}, tp {ctx.tp_rank}) of dp={ctx.dp} tp={ctx.tp}"
            )
        self.model, self.plan, self.program = model, plan, program
        # this rank's params and buffer: the plan's, and an MoE rank's experts after them
        self.space = space = rank_space(plan, program.rank)
        self.buffers = FlatBuffers(_in_space_order(model, space.params), space.layout, ctx.device,
                                   _TORCH_DTYPES[program.param_dtype], space.chains)
        # fp32 main parameters (bf16 training): one tensor per main range, from the model's values
        self._main_starts = [a for a, _ in program.main_ranges]
        self._main = [self.buffers.param_buf[a:b].float() for a, b in program.main_ranges]
        self.recorder = Recorder()
        self.comm = Communicator(ctx.dp_group, ctx.tp_group, ctx.device, self.recorder,
                                 edp_group=ctx.edp_group, etp_group=ctx.etp_group)
        self.matrices = MatrixUpdates(space.params, optimizer_cfg)
        self.elementwise = ElementwiseUpdates(optimizer_cfg)
        self.tp_dims = {i: p.tp_dim for i, p in enumerate(space.params) if p.tp_dim is not None}
        self.steps = 0
        self.pending: dict[str, Pending] = {}
        self.results: dict[str, Any] = {}
        self.computed: set[int] = set()  # matrices whose full update this rank computed
        self.loss: torch.Tensor | None = None
        self._batches: list = []
        self._losses: list[torch.Tensor] = []
        self._timer = None
        self._waited: set[str] = set()  # parameter gathers the forward pre-hooks waited for (`start_iteration`)
        backwards = [k for k, a in enumerate(program.actions) if isinstance(a, Backward)]
        self._backward_index = backwards[-1] if backwards else -1
        backward = program.actions[self._backward_index] if backwards else None
        self._micro = sum(isinstance(a, Forward) for a in program.actions)
        self._hooks = {h.bucket: h.issue for h in backward.hooks} if backward is not None else {}
        partial = {i for i, _ in backward.tp_partial} if backward is not None else set()
        self.buffers.install_hooks(self._bucket_ready if self._hooks else None,
                                   self._partial_grad if partial else None)
        self._partial = partial
        forward = program.actions[0] if program.actions and isinstance(program.actions[0], Forward) else None
        self._install_gather_waits(forward.waits if forward is not None else ())
        self._release = self._last_readers(program.actions)

    def _gather_done(self, pend: Pending) -> None:
        """Add a parameter gather's own duration (issue to completion) to this iteration's."""
        ms = pend.duration_ms()
        if ms is not None and self.param_gather_ms is not None:
            self.param_gather_ms += ms
        else:
            self.param_gather_ms = None

    def _partial_grad(self, i: int, grad: torch.Tensor) -> torch.Tensor:
        """A replicated param's partial gradient (q/k-norm) summed over TP, in fp32 as Megatron
        sums such gradients on its fp32 main grads."""
        if i not in self._partial:
            return grad
        full = grad.float()
        self.comm.tp_partial_reduce(full)
        return full

    def _install_gather_waits(self, waits) -> None:
        """A forward pre-hook on the module owning each listed param waits for its gather and
        dispatches the next one (Megatron's overlapped parameter gather)."""
        if not waits:
            return
        owner = {}
        index = {id(p): i for i, p in enumerate(self.buffers.params)}
        for module in self.model.modules():
            for p in module.parameters(recurse=False):
                owner.setdefault(index[id(p)], module)
        for w in waits:
            def pre_hook(_module, _args, w=w) -> None:
                # only the iteration's first forward waits and dispatches: the later micro-batches'
                # forwards (and a recomputed forward) find the gather done, as Megatron's hooks do
                if w.tag in self._waited:
                    return
                self._waited.add(w.tag)
                with self._timer.phase("param_sync", f"wait {w.tag}"):
                    self._gather_wait(w)

            owner[w.param].register_forward_pre_hook(pre_hook)
        for a in self.program.prologue:  # as if a previous step had ended
            self._issue(a)

    def _gather_wait(self, w) -> None:
        pend = self.pending.pop(w.tag, None)
        if pend is not None:
            pend.wait()
            self._gather_done(pend)
        if w.then is not None:
            self._issue(w.then)

    # ------------------------------------------------------------------ running
    def iteration(self, batches, timer) -> torch.Tensor:
        """One training iteration over ``batches`` (one ``(tokens, labels)`` per micro-batch);
        returns this rank's mean loss."""
        batches = [batches] if isinstance(batches, tuple) else list(batches)
        if len(batches) != self._micro:
            raise ValueError(f"the program runs {self._micro} micro-batches per iteration, got {len(batches)}")
        self._batches, self._losses = batches, []
        self.run(self.program.actions, timer)
        return torch.stack([x.detach().float() for x in self._losses]).mean()

    def run(self, actions, timer) -> None:
        self._timer = timer
        for a in actions:
            self._do(a, timer)
            for tag in self._release.get(id(a), ()):  # its last reader ran: free the gathered
                self.results.pop(tag, None)           # gradients / updates now, not at step end

    @staticmethod
    def _last_readers(actions) -> dict[int, tuple[str, ...]]:
        """Per action (by id), the result tags it is the last to read (``source``, ``norm``), so
        a step holds one micro-group's or one matrix's gathered gradients and updates at a time, as
        on a GPU where they would be freed as soon as they were used. A tag nobody reads is freed
        by its own wait."""
        last: dict[str, int] = {}
        for a in actions:
            for field_name in ("source", "norm"):
                tag = getattr(a, field_name, None)
                if isinstance(tag, str):
                    last[tag] = id(a)
            if isinstance(a, Wait):
                for tag in a.tags:
                    last.setdefault(tag, id(a))
        out: dict[int, list[str]] = {}
        for tag, reader in last.items():
            out.setdefault(reader, []).append(tag)
        return {k: tuple(v) for k, v in out.items()}

    def finish(self, timer) -> None:
        """Complete whatever the program leaves in flight after its last iteration."""
        self.run(self.program.drain, timer)

    def bytes_by_tag(self) -> dict[str, list[int]]:
        """Per action tag: [input bytes, output bytes, calls] handed to torch.distributed."""
        return self.recorder.bytes_by_tag()

    def tensors_by_role(self) -> dict[str, list[torch.Tensor]]:
        """The long-lived tensors of this rank by role: the flat parameter and gradient buffers,
        the fp32 main parameters and the optimizer state (created by the first step). A memory
        report (`canzona.trial.dryrun`) books everything else as activations or transient."""
        states = [t for held in (self.matrices.states, self.elementwise.states) for state in held.values()
                  for t in state.values() if isinstance(t, torch.Tensor)]
        return {"parameters": [self.buffers.param_buf], "gradients": [self.buffers.grad_buf],
                "main_parameters": list(self._main), "optimizer_state": states}

    # ------------------------------------------------------------------ main parameters
    def main_slice(self, lo: int, hi: int) -> torch.Tensor:
        """The parameters this rank updates over buffer range [lo, hi): fp32 main parameters
        in bf16 training, the model's own parameters in fp32."""
        if not self._main:
            return self.buffers.param_buf[lo:hi]
        k = bisect.bisect_right(self._main_starts, lo) - 1
        start, end = self.program.main_ranges[max(k, 0)]
        if k < 0 or hi > end:
            raise RuntimeError(f"buffer range [{lo}, {hi}) is not in this rank's main parameters")
        return self._main[k][lo - start : hi - start]

    def main_view(self, index: int) -> torch.Tensor:
        s = self.buffers.slots[index]
        return self.main_slice(s.start, s.end).view(self.buffers.params[index].shape)

    # ------------------------------------------------------------------ actions
    def start_iteration(self) -> None:
        """Begin an iteration (the first micro-batch's forward does): an empty gradient buffer,
        nothing recorded, no results, no parameter gather waited for yet."""
        self.param_gather_ms: float | None = 0.0
        self._waited.clear()  # the parameter gathers this iteration's forward pre-hooks waited for
        self.buffers.start_step()
        self.recorder.reset()
        self.results = {}

    def _bucket_ready(self, b: int) -> None:
        for comm in self._hooks[b]:
            self._issue(comm)

    def _issue(self, a) -> None:
        if a.tag in self.pending:
            raise RuntimeError(f"action {a.tag!r} issued twice before its wait")
        buf = self.buffers
        self.pending[a.tag] = self.comm.issue(
            a, buf.param_buf, buf.grad_buf, self.results, buf.grad_view, buf.param_view, self.tp_dims
        )

    def _do(self, a, timer) -> None:
        run = self._RUN.get(type(a))
        if run is None:
            raise TypeError(f"the runtime cannot run {type(a).__name__}")
        run(self, a, timer)

    def _forward(self, a: Forward, timer) -> None:
        if a.micro == 0:
            self.start_iteration()
        tokens, labels = self._batches[a.micro]
        with timer.phase(a.phase):
            self.loss = self.model(tokens, labels)
        self._losses.append(self.loss)

    def _backward(self, a: Backward, timer) -> None:
        self.buffers.arm(a.last)
        with timer.phase(a.phase):
            # the mean over micro-batches, as Megatron scales each micro-batch's loss
            (self.loss / self._micro if self._micro > 1 else self.loss).backward()
        if a.last:
            self.buffers.check_complete()

    def _issue_action(self, a: Comm, timer) -> None:
        with timer.phase(a.phase, a.tag):
            self._issue(a)

    def _wait_action(self, a: Wait, timer) -> None:
        with timer.phase(a.phase, a.label or None):
            for tag in a.tags:
                pend = self.pending.pop(tag)
                self.results[tag] = pend.wait()
                if a.phase == "param_sync":
                    self._gather_done(pend)

    def _mark(self, a: Mark, timer) -> None:
        if a.name == "step_start":
            self.steps += 1
        timer.mark(a.name)

    @torch.no_grad()
    def _compute(self, a: Compute, timer) -> None:
        buf = self.buffers
        with timer.phase(a.phase, a.tag):
            gathered = self.results.get(a.source, {}) if a.source else {}
            fulls = [gathered[i] if i in gathered else buf.grad_view(i) for i in a.items]
            self.results[a.tag] = dict(zip(a.items, self.matrices.directions(list(a.items), fulls, self.steps)))
            self.computed.update(a.items)

    @torch.no_grad()
    def _gram_compute(self, a: GramCompute, timer) -> None:
        """This rank's shards of ``a.items`` orthogonalised with the sums over TP made inside the
        maths (`MatrixUpdates.shard_directions`, handed a blocking all-reduce recorded under the
        action's tag); the action's `Wait` hands the shards' updates on."""
        if a.tag in self.pending:
            raise RuntimeError(f"action {a.tag!r} issued twice before its wait")
        buf = self.buffers
        with timer.phase(a.phase, a.tag):
            items = list(a.items)
            dirs = self.matrices.shard_directions(items, [buf.grad_view(i) for i in items], self.steps, a.tp,
                                                  self.comm.group_rank(a.axis), self.comm.summing(a.tag, a.axis))
            updates = dict(zip(items, dirs))
            self.pending[a.tag] = Pending([], lambda: updates)
            self.computed.update(items)

    @torch.no_grad()
    def _apply(self, a: Apply, timer) -> None:
        with timer.phase(a.phase, a.tag):
            updates = self.results.get(a.source, {})
            cut = set(a.slice_tp)
            for i in a.items:
                u = updates[i]
                if i in cut:
                    u = u.chunk(self.plan.tp, dim=self.tp_dims[i])[self.program.tp_rank]
                self.matrices.apply(self.main_view(i), u)

    @torch.no_grad()
    def _elementwise(self, a: Elementwise, timer) -> None:
        buf = self.buffers
        with timer.phase(a.phase, a.tag):
            keys = list(a.ranges)
            self.elementwise.step(keys, [self.main_slice(s, e) for s, e in keys],
                                  [buf.grad_buf[s:e] for s, e in keys], self.steps)

    @torch.no_grad()
    def _grad_norm(self, a: GradNorm, timer) -> None:
        buf = self.buffers
        with timer.phase(a.phase, a.tag):
            # A rank that counts no elements (it owns nothing) still takes part in the norm's
            # all-reduce: with a zero on its device (sum_of_squares of nothing is a CPU zero).
            self.results[a.tag] = (sum_of_squares((buf.grad_buf[s:e] for s, e in a.ranges), a.dtype) if a.ranges
                                   else buf.grad_buf.new_zeros((), dtype=getattr(torch, a.dtype)))

    @torch.no_grad()
    def _clip_scale(self, a: ClipScale, timer) -> None:
        with timer.phase(a.phase, a.tag):
            coef = clip_coefficient(float(self.results[a.norm]), a.max_norm)
            if coef is not None:
                for s, e in a.ranges:
                    self.buffers.grad_buf[s:e].mul_(coef)
            self.results[a.tag] = coef

    @torch.no_grad()
    def _copy_to_model(self, a: CopyToModel, timer) -> None:
        with timer.phase(a.phase, a.tag):
            for (s, e), main in zip(self.program.main_ranges, self._main):
                self.buffers.param_buf[s:e].copy_(main)

    # How the runtime runs each action type (`_do`)
    _RUN = dispatch_table({
        Forward: _forward, Backward: _backward, TRANSFER_TYPES: _issue_action, Wait: _wait_action, Mark: _mark,
        Compute: _compute, GramCompute: _gram_compute, Apply: _apply, Elementwise: _elementwise, GradNorm: _grad_norm, ClipScale: _clip_scale,
        CopyToModel: _copy_to_model,
    })
