"""One rank's program as readable text (``python -m canzona.plan ... --program RANK``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from canzona.plan.experts import rank_space
from canzona.program.actions import (
    DTYPE_BYTES,
    TRANSFER_TYPES,
    Apply,
    Backward,
    ClipScale,
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


def _mb(elems: int, dtype: str) -> str:
    return f"{elems * DTYPE_BYTES[dtype] / 2**20:.2f} MiB"


def _comm(a) -> str:
    calls = a.calls()
    kinds: dict[str, int] = {}
    for c in calls:
        kinds[c.op] = kinds.get(c.op, 0) + 1
    ops = ", ".join(f"{n}x {op}" if n > 1 else op for op, n in kinds.items())
    impl = f" [{a.impl}]" if getattr(a, "impl", None) and getattr(a, "ranges", None) is not None else ""
    sent = sum(c.in_elems for c in calls)
    got = sum(c.out_elems for c in calls)
    dtype = calls[0].dtype if calls else "float32"
    return (f"issue  {a.tag:<22} {calls[0].axis if calls else '-':<3} {ops}{impl}  in {_mb(sent, dtype)}  "
            f"out {_mb(got, dtype)}  {dtype}  ({a.phase})")


def _items(params, items) -> str:
    names = [params[i].name for i in items]
    shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
    return shown


def _forward(a: Forward, params, program: Program) -> str:
    text = "forward"
    if a.waits:
        text += (f"  (overlapped parameter gather: {len(a.waits)} waits in module pre-hooks, each then "
                 f"issuing the next bucket's gather: {a.waits[0].tag} -> ... -> {a.waits[-1].tag})")
    return text


def _backward(a: Backward, params, program: Program) -> str:
    """The backward and, one line each, what its bucket hooks issue."""
    text = f"backward  ({len(a.tp_partial)} partial-gradient TP all-reduces in hooks)"
    return text + "".join(f"\n{'':>4}    when bucket {h.bucket} is full: {_comm(c)}" for h in a.hooks for c in h.issue)


def _wait(a: Wait, params, program: Program) -> str:
    tags = ", ".join(a.tags) if len(a.tags) <= 3 else f"{a.tags[0]} ... {a.tags[-1]} ({len(a.tags)})"
    return f"wait   {tags}  ({a.phase})"


def _compute(a: Compute, params, program: Program) -> str:
    src = f" from {a.source}" if a.source else " from local gradients"
    return f"compute {a.tag:<21} {len(a.items)} matrices{src}: {_items(params, a.items)}"


def _gram(a: GramCompute, params, program: Program) -> str:
    calls = a.calls()
    grams = sorted({u for sides in a.grams for u in sides})
    return (f"gram   {a.tag:<22} {len(a.items)} matrices, this TP shard's Newton-Schulz: {_items(params, a.items)}; "
            f"{len(calls)}x all_reduce over {a.axis} inside (per matrix the norm, then {a.steps} Gram products "
            f"{'/'.join(f'{u}x{u}' for u in grams)} {a.dtype}: {_mb(sum(c.in_elems for c in calls), a.dtype)})")


def _apply(a: Apply, params, program: Program) -> str:
    cut = f", {len(a.slice_tp)} cut to this TP shard" if a.slice_tp else ""
    return f"apply  {a.tag:<22} {len(a.items)} params from {a.source}{cut}"


def _elementwise(a: Elementwise, params, program: Program) -> str:
    n = sum(e - s for s, e in a.ranges)
    return f"adamw  {a.tag:<22} {len(a.ranges)} ranges, {n:,} elements"


def _grad_norm(a: GradNorm, params, program: Program) -> str:
    return f"norm   {a.tag:<22} {a.dtype} sum of squares over {sum(e - s for s, e in a.ranges):,} gradient elements"


def _clip_scale(a: ClipScale, params, program: Program) -> str:
    return (f"clip   {a.tag:<22} scale {sum(e - s for s, e in a.ranges):,} gradient elements if the norm "
            f"from {a.norm!r} exceeds {a.max_norm:g}")


def _copy_to_model(a: CopyToModel, params, program: Program) -> str:
    return f"copy   {a.tag:<22} {sum(e - s for s, e in a.ranges):,} fp32 main elements -> {program.param_dtype} model"


def _mark(a: Mark, params, program: Program) -> str:
    return f"-- {a.name} --"


# One action's text (a backward's spans lines) from the action, the rank's params and its program
_RENDER: dict[type, Callable[[Any, list, Program], str]] = dispatch_table({
    Forward: _forward, Backward: _backward, TRANSFER_TYPES: lambda a, params, program: _comm(a), Wait: _wait,
    Compute: _compute, GramCompute: _gram, Apply: _apply, Elementwise: _elementwise, GradNorm: _grad_norm, ClipScale: _clip_scale,
    CopyToModel: _copy_to_model, Mark: _mark,
})


def render_program(plan, program: Program) -> str:
    params = rank_space(plan, program.rank).params  # an MoE rank's experts after the dense params
    lines = [
        f"rank {program.rank} (dp {program.dp_rank}, tp {program.tp_rank}) of dp={program.dp} tp={program.tp}  "
        f"method={plan.method}  {len(program.actions)} actions, {len(program.calls())} collective calls per iteration",
        f"parameters {program.param_dtype} ({plan.execution.dtype_reason}); gradients float32; "
        f"fp32 main parameters: {sum(e - s for s, e in program.main_ranges):,} elements" if program.main_ranges else
        f"parameters {program.param_dtype} ({plan.execution.dtype_reason}); gradients float32",
    ]
    for k, a in enumerate(program.actions):
        lines.append(f"{k:>4}  {_RENDER[type(a)](a, params, program)}")
    if program.prologue:
        lines.append("before the first iteration: issue " + ", ".join(a.tag for a in program.prologue))
    if program.drain:
        waits = sum(isinstance(a, Wait) for a in program.drain)
        lines.append(f"after the last iteration: the parameter-gather chain ({waits} waits, each followed by the next issue)")
    return "\n".join(lines)
