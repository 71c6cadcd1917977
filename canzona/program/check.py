"""Checks over lowered programs (pure).

- `check_matching`: every group's members make the same collective calls in the same order
  with consistent sizes -- what would otherwise be a hang or a shape error at 256 ranks is
  found on a laptop (in the spirit of ``torch.distributed.pipelining``'s schedule checks).
- `expected_bytes` / `compare_recorded`: what one rank's executor handed to
  ``torch.distributed`` per action (``steps.jsonl``'s ``comm_bytes``) against the program.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from canzona.program.actions import Call, Program


def _groups(dp: int, tp: int) -> dict[tuple[str, int], list[int]]:
    out: dict[tuple[str, int], list[int]] = {}
    for t in range(tp):
        out[("dp", t)] = [d * tp + t for d in range(dp)]
    for d in range(dp):
        out[("tp", d)] = [d * tp + t for t in range(tp)]
    out[("world", 0)] = list(range(dp * tp))
    return out


def _key(c: Call) -> tuple:
    return (c.op, c.dtype, c.root, c.coalesced)


def check_matching(programs: Sequence[Program]) -> list[str]:
    """Problems found (empty: every group's calls line up). Rules per call position:
    same op, dtype, root and coalescing; all_reduce / reduce / broadcast the same size;
    reduce_scatter the same input size (outputs of input/P); all_gather the same output size;
    all_to_all as much received in total as sent."""
    if not programs:
        return []
    dp, tp = programs[0].dp, programs[0].tp
    by_rank = {p.rank: p for p in programs}
    problems: list[str] = []
    for (axis, idx), members in _groups(dp, tp).items():
        if not all(r in by_rank for r in members):
            continue
        seqs = {r: [(tag, c) for tag, c in by_rank[r].calls() if c.axis == axis] for r in members}
        lengths = {len(s) for s in seqs.values()}
        if len(lengths) > 1:
            problems.append(f"{axis} group {idx}: members make {sorted(lengths)} calls")
            continue
        p = len(members)
        for k in range(lengths.pop()):
            calls = [seqs[r][k] for r in members]
            tags = {t for t, _ in calls}
            first = calls[0][1]
            where = f"{axis} group {idx} call {k} ({'/'.join(sorted(tags))})"
            if any(_key(c) != _key(first) for _, c in calls):
                problems.append(f"{where}: members disagree on op/dtype/root: {sorted({_key(c) for _, c in calls}, key=str)}")
                continue
            if first.op in ("all_reduce", "reduce", "broadcast"):
                bad = {c.in_elems for _, c in calls}
            elif first.op == "reduce_scatter":
                bad = {c.in_elems for _, c in calls} | {c.out_elems * p for _, c in calls}
            elif first.op == "all_gather":
                bad = {c.out_elems for _, c in calls} | {c.in_elems * p for _, c in calls}
            else:  # all_to_all
                sent, got = sum(c.in_elems for _, c in calls), sum(c.out_elems for _, c in calls)
                bad = {sent, got}
            if len(bad) > 1:
                problems.append(f"{where}: {first.op} sizes do not line up: {sorted(bad)}")
    return problems


def expected_bytes(program: Program, *, with_backward: bool = True) -> dict[str, list[int]]:
    """Per action tag: [input bytes, output bytes, calls] of one iteration."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for tag, c in program.calls():
        if tag == "backward" and not with_backward:
            continue
        row = out[tag]
        row[0] += c.in_bytes
        row[1] += c.out_bytes
        row[2] += 1
    return dict(out)


def compare_recorded(program: Program, recorded: Mapping[str, Sequence[int]], *, with_backward: bool = True) -> list[str]:
    """Differences between the program's bytes per action and what the executor recorded."""
    want = expected_bytes(program, with_backward=with_backward)
    got = {k: list(v) for k, v in recorded.items()}
    problems = []
    for tag in sorted(set(want) | set(got)):
        if want.get(tag) != got.get(tag):
            problems.append(f"rank {program.rank} {tag}: program {want.get(tag)} executor {got.get(tag)}")
    return problems
