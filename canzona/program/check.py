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

from canzona.layout import RankLayout
from canzona.program.actions import Call, Program, tagged_calls


def _key(c: Call) -> tuple:
    return (c.op, c.dtype, c.root, c.coalesced)


def _size_problem(cs: list[Call], p: int) -> list[int] | None:
    """The sizes of one call position that do not line up (sorted), or None: ``cs`` holds every
    member's call, or the one call object all ``p`` members make."""
    first = cs[0]
    if first.op in ("all_reduce", "reduce", "broadcast"):
        bad = {c.in_elems for c in cs}
    elif first.op == "reduce_scatter":
        bad = {c.in_elems for c in cs} | {c.out_elems * p for c in cs}
    elif first.op == "all_gather":
        bad = {c.out_elems for c in cs} | {c.in_elems * p for c in cs}
    else:  # all_to_all: as much received in total as sent
        n = p // len(cs)
        bad = {n * sum(c.in_elems for c in cs), n * sum(c.out_elems for c in cs)}
    return sorted(bad) if len(bad) > 1 else None


def _where(axis: str, idx: int, k: int, calls: list[tuple[str, Call]]) -> str:
    return f"{axis} group {idx} call {k} ({'/'.join(sorted({t for t, _ in calls}))})"


def check_matching(programs: Sequence[Program]) -> list[str]:
    """Problems found (empty: every group's calls line up). Rules per call position:
    same op, dtype, root and coalescing; all_reduce / reduce / broadcast the same size;
    reduce_scatter the same input size (outputs of input/P); all_gather the same output size;
    all_to_all as much received in total as sent."""
    if not programs:
        return []
    grid = RankLayout(programs[0].dp, programs[0].tp, programs[0].experts)
    by_rank = {p.rank: p for p in programs}
    by_axis: dict[int, dict[str, list[tuple[str, Call]]]] = {}  # rank -> axis -> its calls, in order
    split_of: dict[int, tuple] = {}  # id(action) -> (action, its calls by axis): actions are shared

    def calls_of(r: int, axis: str) -> list[tuple[str, Call]]:
        if r not in by_axis:
            split: dict[str, list[tuple[str, Call]]] = {axis: [] for axis in grid.axes}
            for a in by_rank[r].actions:  # `Program.calls`, action by action
                hit = split_of.get(id(a))
                if hit is None:
                    parts: dict[str, list[tuple[str, Call]]] = {}
                    for tag, c in tagged_calls(a):
                        parts.setdefault(c.axis, []).append((tag, c))
                    hit = split_of[id(a)] = (a, tuple(parts.items()))
                for ax, pairs in hit[1]:
                    split.setdefault(ax, []).extend(pairs)
            by_axis[r] = split
        return by_axis[r].get(axis, [])

    problems: list[str] = []
    for (axis, idx), members in grid.groups().items():
        if not all(r in by_rank for r in members):
            continue
        seqs = {r: calls_of(r, axis) for r in members}
        lengths = {len(s) for s in seqs.values()}
        if len(lengths) > 1:
            problems.append(f"{axis} group {idx}: members make {sorted(lengths)} calls")
            continue
        p = len(members)
        n = lengths.pop()
        if len({tuple(map(id, [c for _, c in seq])) for seq in seqs.values()}) == 1:
            # every member makes the very same call objects (lowered once): they agree on each;
            # what is left is each call's sizes against the group, once per distinct call
            verdicts: dict[int, list[int] | None] = {}
            for k, (_, c) in enumerate(seqs[members[0]]):
                if id(c) not in verdicts:
                    verdicts[id(c)] = _size_problem([c], p)
                if verdicts[id(c)]:
                    problems.append(f"{_where(axis, idx, k, [seqs[r][k] for r in members])}: {c.op} sizes do not "
                                    f"line up: {verdicts[id(c)]}")
            continue
        for k in range(n):
            calls = [seqs[r][k] for r in members]
            first = calls[0][1]
            if all(c is first for _, c in calls):  # one call object (lowered once): the same values
                cs = [first]
            else:
                cs = [c for _, c in calls]
                if any(_key(c) != _key(first) for c in cs):
                    problems.append(f"{_where(axis, idx, k, calls)}: members disagree on op/dtype/root: "
                                    f"{sorted({_key(c) for c in cs}, key=str)}")
                    continue
            bad = _size_problem(cs, p)
            if bad:
                problems.append(f"{_where(axis, idx, k, calls)}: {first.op} sizes do not line up: {bad}")
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
