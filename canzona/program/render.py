"""One rank's program as readable text (``python -m canzona.plan ... --program RANK``)."""

from __future__ import annotations

from canzona.plan.experts import rank_space
from canzona.program.actions import (
    COMM_TYPES,
    DTYPE_BYTES,
    Apply,
    Backward,
    ClipScale,
    Compute,
    CopyToModel,
    Elementwise,
    Forward,
    GradNorm,
    Mark,
    Program,
    Wait,
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
        if isinstance(a, Forward):
            text = "forward"
            if a.waits:
                text += (f"  (overlapped parameter gather: {len(a.waits)} waits in module pre-hooks, each then "
                         f"issuing the next bucket's gather: {a.waits[0].tag} -> ... -> {a.waits[-1].tag})")
        elif isinstance(a, Backward):
            text = f"backward  ({len(a.tp_partial)} partial-gradient TP all-reduces in hooks)"
            lines.append(f"{k:>4}  {text}")
            for h in a.hooks:
                for c in h.issue:
                    lines.append(f"{'':>4}    when bucket {h.bucket} is full: {_comm(c)}")
            continue
        elif isinstance(a, COMM_TYPES):
            text = _comm(a)
        elif isinstance(a, Wait):
            tags = ", ".join(a.tags) if len(a.tags) <= 3 else f"{a.tags[0]} ... {a.tags[-1]} ({len(a.tags)})"
            text = f"wait   {tags}  ({a.phase})"
        elif isinstance(a, Compute):
            src = f" from {a.source}" if a.source else " from local gradients"
            text = f"compute {a.tag:<21} {len(a.items)} matrices{src}: {_items(params, a.items)}"
        elif isinstance(a, Apply):
            cut = f", {len(a.slice_tp)} cut to this TP shard" if a.slice_tp else ""
            text = f"apply  {a.tag:<22} {len(a.items)} params from {a.source}{cut}"
        elif isinstance(a, Elementwise):
            n = sum(e - s for s, e in a.ranges)
            text = f"adamw  {a.tag:<22} {len(a.ranges)} ranges, {n:,} elements"
        elif isinstance(a, GradNorm):
            text = f"norm   {a.tag:<22} {a.dtype} sum of squares over {sum(e - s for s, e in a.ranges):,} gradient elements"
        elif isinstance(a, ClipScale):
            text = (f"clip   {a.tag:<22} scale {sum(e - s for s, e in a.ranges):,} gradient elements if the norm "
                    f"from {a.norm!r} exceeds {a.max_norm:g}")
        elif isinstance(a, CopyToModel):
            text = f"copy   {a.tag:<22} {sum(e - s for s, e in a.ranges):,} fp32 main elements -> {program.param_dtype} model"
        elif isinstance(a, Mark):
            text = f"-- {a.name} --"
        else:  # pragma: no cover - every action type is listed above
            text = repr(a)
        lines.append(f"{k:>4}  {text}")
    if program.prologue:
        lines.append("before the first iteration: issue " + ", ".join(a.tag for a in program.prologue))
    if program.drain:
        waits = sum(isinstance(a, Wait) for a in program.drain)
        lines.append(f"after the last iteration: the parameter-gather chain ({waits} waits, each followed by the next issue)")
    return "\n".join(lines)
