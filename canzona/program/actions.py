"""The vocabulary of a per-rank program: typed actions one rank runs in one training iteration.

A `Program` (see `canzona.program.lower`) is an ordered tuple of these actions. Everything a
method decides -- which collective moves which bytes, which uneven-shard implementation a bucket
uses, the micro-group order and pipeline depth, what waits for what -- is already resolved in
them, so that the three readers of a program cannot disagree:

- the executor (`canzona.executor`) runs each action on real process groups and tensors;
- the simulator (`canzona.sim`) gives each action a duration from a hardware description;
- the metrics (`canzona.program.count`) count its compute, memory and bytes.

Communication actions are *issued* (asynchronously) where they appear and completed by a later
`Wait` naming their tag. Each one lists, through `calls()`, the exact ``torch.distributed`` calls
the executor makes for it, with the element counts of the tensors it hands over; the executor
records what it really passed and a test compares the two.

Element counts, not bytes: ``Call.dtype`` gives the width. Ranges are absolute offsets into the
rank's flat buffers (the planner's `BufferLayout`); ``ranges`` of a DP collective list every
group member's range, in DP-rank order, and ``me`` is this rank's index among them.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from canzona.layout import ExpertLayout

# The process group a call runs on: the dense DP and TP groups, the world, and an MoE model's
# expert-DP and expert-TP groups (`canzona.layout.ExpertLayout`), which reduce and update the experts.
Axis = Literal["dp", "tp", "world", "edp", "etp"]
# How the per-rank pieces of an uneven-shard DP collective travel (see `canzona.program.lower`):
#   even       Megatron's equal shards in rank order: one reduce_scatter / all_gather
#   padded     every shard padded to the widest: one even collective over P x widest
#   reduce_loop one rooted reduce / broadcast per non-empty shard, issued one after another
#   coalesced  the same rooted calls issued as one coalesced group (NCCL: one group launch)
#   all_to_all one all_to_all_single with exact split sizes, then a local sum / placement
Impl = Literal["even", "padded", "reduce_loop", "coalesced", "all_to_all"]
Ranges = tuple[tuple[int, int], ...]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}

_T = TypeVar("_T")


def _memo(method: Callable[..., _T]) -> Callable[..., _T]:
    """Remember what a method of a frozen action returns (its fields never change, so neither
    does the value): the interpreters ask for an action's calls and sizes many times per rank.
    Kept in the instance's ``__dict__`` (frozen dataclasses only guard ``__setattr__``), which
    equality, hashing and ``dataclasses.replace`` ignore."""
    key = f"_memo_{method.__name__}"

    @functools.wraps(method)
    def cached(self):
        d = self.__dict__
        try:
            return d[key]
        except KeyError:
            value = d[key] = method(self)
            return value

    return cached


@dataclass(frozen=True)
class Call:
    """One ``torch.distributed`` call as the executor makes it.

    ``in_elems`` / ``out_elems``: elements of the input and output tensors handed to torch (an
    in-place op such as all_reduce, reduce or broadcast hands one tensor: both are its size).
    ``root``: the group-local root of a reduce or broadcast. ``group``: calls sharing a group
    number inside one action are launched as one coalesced group.
    """

    op: str  # all_reduce | reduce_scatter | all_gather | all_to_all | reduce | broadcast
    axis: Axis
    in_elems: int
    out_elems: int
    dtype: str
    root: int | None = None
    coalesced: bool = False
    local_elems: int = 0  # all_to_all: the part of the input this rank sends to itself

    def wire_elems(self, group_size: int) -> tuple[float, float]:
        """(sent, received) elements over this rank's links, ring/chain algorithms: all-reduce
        2(P-1)/P N; reduce-scatter / all-gather (P-1)/P of the large side; reduce / broadcast
        the tensor once each way (pipelined chain); all-to-all everything not kept locally."""
        p = group_size
        if p <= 1:
            return 0.0, 0.0
        if self.op == "all_reduce":
            v = 2.0 * (p - 1) / p * self.in_elems
            return v, v
        if self.op == "reduce_scatter":
            v = (p - 1) / p * self.in_elems
            return v, v
        if self.op == "all_gather":
            v = (p - 1) / p * self.out_elems
            return v, v
        if self.op == "all_to_all":
            return float(self.in_elems - self.local_elems), float(self.out_elems - self.local_elems)
        return float(self.in_elems), float(self.in_elems)  # reduce, broadcast

    @property
    def in_bytes(self) -> int:
        return self.in_elems * DTYPE_BYTES[self.dtype]

    @property
    def out_bytes(self) -> int:
        return self.out_elems * DTYPE_BYTES[self.dtype]


# Calls are values: equal ones made once and shared (a 256-rank program set makes the same few
# calls hundreds of thousands of times). Arguments: op, axis, in_elems, out_elems, dtype[, root,
# coalesced, local_elems], positionally.
_call = functools.lru_cache(maxsize=1 << 16, typed=True)(Call)


def _widths(ranges: Ranges) -> list[int]:
    return [b - a for a, b in ranges]


@functools.lru_cache(maxsize=4096)
def _rooted_calls(op: str, widths: tuple[int, ...], dtype: str, coalesced: bool, axis: str = "dp") -> tuple[Call, ...]:
    """One rooted call per non-empty piece (uneven DP shards): the same on every member of the
    group, so made once per bucket layout rather than once per rank."""
    return tuple(_call(op, axis, x, x, dtype, r, coalesced) for r, x in enumerate(widths) if x > 0)


# ----------------------------------------------------------------------------- communication
@dataclass(frozen=True)
class BucketReduce:
    """DP reduction of one gradient bucket: an all-reduce of the whole bucket, or a
    reduce-scatter that leaves each DP rank the sum over its own range (``ranges``)."""

    tag: str
    bucket: int
    start: int
    end: int
    op: Literal["all_reduce", "reduce_scatter"]
    impl: Impl
    ranges: Ranges | None
    me: int
    dtype: str
    average: bool
    phase: str
    axis: Axis = "dp"  # "edp": an expert bucket, over its expert-DP group
    # The average divides the sum by this many ranks (0: the group's size). Expert gradients are
    # summed over the expert-DP group and divided by the dense DP size (Megatron's expert
    # gradient scaling), since every rank's tokens reached the experts through the dispatch.
    average_over: int = 0

    @_memo
    def calls(self) -> tuple[Call, ...]:
        n, ax = self.end - self.start, self.axis
        if self.op == "all_reduce":
            return (_call("all_reduce", ax, n, n, self.dtype),)
        assert self.ranges is not None
        w = _widths(self.ranges)
        p, mine = len(w), w[self.me]
        if self.impl == "even":
            return (_call("reduce_scatter", ax, n, mine, self.dtype),)
        if self.impl == "padded":
            return (_call("reduce_scatter", ax, p * max(w), max(w), self.dtype),)
        if self.impl in ("reduce_loop", "coalesced"):
            return _rooted_calls("reduce", tuple(w), self.dtype, self.impl == "coalesced", ax)
        if self.impl == "all_to_all":
            return (_call("all_to_all", ax, sum(w), p * mine, self.dtype, None, False, mine),)
        raise ValueError(f"unknown impl {self.impl!r}")

    @property
    @_memo
    def pack_elems(self) -> int:
        """Elements the executor copies into a send buffer before issuing."""
        if self.op == "reduce_scatter" and self.ranges is not None and self.impl in ("padded", "all_to_all"):
            return self.end - self.start
        return 0

    @property
    @_memo
    def finish_elems(self) -> int:
        """Elements copied or scaled after the wait (copy-out, averaging, the a2a sum)."""
        if self.op == "all_reduce":
            return (self.end - self.start) if self.average else 0
        assert self.ranges is not None
        w = _widths(self.ranges)
        mine = w[self.me]
        if self.impl == "all_to_all":
            return (len(w) + 1) * mine
        if self.impl in ("reduce_loop", "coalesced"):
            return mine if self.average else 0
        return 2 * mine


@dataclass(frozen=True)
class BucketGather:
    """DP all-gather of one bucket's shards, in place in ``buffer`` (the updated parameters
    after the step, or the reduced gradients for sync's ``zero1_gather`` variant)."""

    tag: str
    bucket: int
    buffer: Literal["param", "grad"]
    impl: Impl
    ranges: Ranges
    me: int
    dtype: str
    phase: str
    axis: Axis = "dp"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        w = _widths(self.ranges)
        p, mine, n, ax = len(w), w[self.me], sum(w), self.axis
        if self.impl == "even":
            return (_call("all_gather", ax, mine, n, self.dtype),)
        if self.impl == "padded":
            return (_call("all_gather", ax, max(w), p * max(w), self.dtype),)
        if self.impl in ("reduce_loop", "coalesced"):
            return _rooted_calls("broadcast", tuple(w), self.dtype, self.impl == "coalesced", ax)
        if self.impl == "all_to_all":
            return (_call("all_to_all", ax, p * mine, n, self.dtype, None, False, mine),)
        raise ValueError(f"unknown impl {self.impl!r}")

    @property
    @_memo
    def pack_elems(self) -> int:
        w = _widths(self.ranges)
        if self.impl == "padded":
            return max(w)
        if self.impl == "all_to_all":
            return len(w) * w[self.me]
        return 0

    @property
    @_memo
    def finish_elems(self) -> int:
        w = _widths(self.ranges)
        return 0 if self.impl in ("reduce_loop", "coalesced") else sum(w) - w[self.me]


@dataclass(frozen=True)
class OwnedParamsGather:
    """Layer-wise parameter sync: each DP rank packs the params it owns into a shard padded to
    the widest rank's, one all-gather, every rank unpacks the others' params."""

    tag: str
    owned: tuple[tuple[int, ...], ...]  # per DP rank, the params it owns (buffer order)
    sizes: tuple[int, ...]  # per DP rank, elements it owns
    me: int
    dtype: str
    phase: str
    axis: Axis = "dp"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        widest = max(self.sizes)
        return (_call("all_gather", self.axis, widest, len(self.sizes) * widest, self.dtype),)

    @property
    @_memo
    def pack_elems(self) -> int:
        return self.sizes[self.me]

    @property
    @_memo
    def finish_elems(self) -> int:
        return sum(self.sizes) - self.sizes[self.me]


@dataclass(frozen=True)
class TpGather:
    """Micro-group gather: one all_to_all_single sends this rank's shard of every matrix of the
    group to the matrix's owner; the owner receives all TP shards of the matrices it owns."""

    tag: str
    items: tuple[int, ...]  # the group's matrices, group order
    owners: tuple[int, ...]  # TP owner of each
    shard: tuple[int, ...]  # local shard elements of each
    me: int
    tp: int
    dtype: str
    phase: str = "gather"
    axis: Axis = "tp"  # "etp": an expert micro-group, over its expert-TP group

    @_memo
    def calls(self) -> tuple[Call, ...]:
        mine = sum(s for s, o in zip(self.shard, self.owners) if o == self.me)
        return (_call("all_to_all", self.axis, sum(self.shard), self.tp * mine, self.dtype, None, False, mine),)

    @property
    @_memo
    def pack_elems(self) -> int:
        return sum(self.shard)

    @property
    @_memo
    def finish_elems(self) -> int:
        """The owner concatenates the TP shards of each matrix it owns."""
        return self.tp * sum(s for s, o in zip(self.shard, self.owners) if o == self.me)


@dataclass(frozen=True)
class TpScatter:
    """Micro-group scatter: owners send each TP rank its shard of every update they computed
    (``source``: the `Compute` tag); every rank receives its shard of every matrix of the group."""

    tag: str
    source: str
    items: tuple[int, ...]
    owners: tuple[int, ...]
    shard: tuple[int, ...]
    me: int
    tp: int
    dtype: str
    phase: str = "scatter"
    axis: Axis = "tp"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        mine = sum(s for s, o in zip(self.shard, self.owners) if o == self.me)
        return (_call("all_to_all", self.axis, self.tp * mine, sum(self.shard), self.dtype, None, False, mine),)

    @property
    @_memo
    def pack_elems(self) -> int:
        return self.tp * sum(s for s, o in zip(self.shard, self.owners) if o == self.me)

    @property
    @_memo
    def finish_elems(self) -> int:
        return 0


@dataclass(frozen=True)
class TpAllGather:
    """The baselines' duplicated TP mode: all-gather every listed matrix's gradient in full on
    every TP rank (one call per matrix, issued together)."""

    tag: str
    items: tuple[int, ...]
    shard: tuple[int, ...]
    tp: int
    dtype: str
    phase: str = "gather"
    axis: Axis = "tp"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        return tuple(_call("all_gather", self.axis, s, self.tp * s, self.dtype) for s in self.shard)

    @property
    @_memo
    def pack_elems(self) -> int:
        return 0

    @property
    @_memo
    def finish_elems(self) -> int:
        return self.tp * sum(self.shard)  # concatenating the shards along the TP dim


@dataclass(frozen=True)
class NormReduce:
    """Gradient clipping: the sum of squares of the gradient over ``axis`` (one value, in the
    norm's ``dtype``)."""

    tag: str
    axis: Axis
    source: str = "grad norm"  # the `GradNorm` whose local sum is reduced
    phase: str = "clip_grad"
    dtype: str = "float32"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        return (_call("all_reduce", self.axis, 1, 1, self.dtype),)

    pack_elems = 0
    finish_elems = 0


@dataclass(frozen=True)
class StepBarrier:
    """Megatron's timer barrier (``--barrier-with-L1-time``, its default): before the optimizer
    step's timer starts, every rank waits for the others, so the step leaves out their skew on
    arriving. One all-reduce of one element over ``axis``, as NCCL's barrier is (gloo's too, in
    what it costs), issued and at once waited for."""

    tag: str = "step barrier"
    axis: Axis = "world"
    phase: str = "barrier"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        return (_call("all_reduce", self.axis, 1, 1, "float32"),)

    pack_elems = 0
    finish_elems = 0


@dataclass(frozen=True)
class GramCompute:
    """TP mode ``gram`` (Megatron's ``distributed`` Muon): this rank's shard of each of ``items``
    orthogonalised with Newton–Schulz whose sums run over ``axis``: per matrix (per sub-matrix
    of a split fused one) one all-reduce of the shard's sum of squares (float32, one element),
    then per step one of the partial Gram product (``dtype``, u² elements, u the unsharded
    side: ``grams``). The collectives sit inside the compute, each blocking, so the action is
    issued as one and its `Wait` holds the shards' updates. ``grams``: per matrix of ``items``,
    the Gram side of each of its sub-matrices (one entry for a matrix optimised whole); ``tp``:
    the size of the ``axis`` group, over which each matrix is cut (every member runs the same
    action on its own shard)."""

    tag: str
    items: tuple[int, ...]
    grams: tuple[tuple[int, ...], ...]
    steps: int
    tp: int
    dtype: str
    phase: str = "compute"
    axis: Axis = "tp"  # "etp": an expert matrix, over its expert-TP group

    @_memo
    def calls(self) -> tuple[Call, ...]:
        out: list[Call] = []
        for sides in self.grams:
            for u in sides:
                out.append(_call("all_reduce", self.axis, 1, 1, "float32"))
                out.extend([_call("all_reduce", self.axis, u * u, u * u, self.dtype)] * self.steps)
        return tuple(out)

    pack_elems = 0
    finish_elems = 0


# The communication actions that only move data, and every action that makes calls (those and
# `GramCompute`, whose calls sit inside its compute).
TRANSFER_TYPES = (BucketReduce, BucketGather, OwnedParamsGather, TpGather, TpScatter, TpAllGather, NormReduce,
                  StepBarrier)
Comm = (BucketReduce | BucketGather | OwnedParamsGather | TpGather | TpScatter | TpAllGather | NormReduce | StepBarrier
        | GramCompute)
COMM_TYPES = (*TRANSFER_TYPES, GramCompute)
_COMM_KINDS: dict[type, bool] = {}


def is_comm(kind: type) -> bool:
    """``issubclass(kind, COMM_TYPES)``, kept per class (asked once per action of every program)."""
    found = _COMM_KINDS.get(kind)
    if found is None:
        found = _COMM_KINDS[kind] = issubclass(kind, COMM_TYPES)
    return found


# ----------------------------------------------------------------------------- host work
@dataclass(frozen=True)
class Compute:
    """Full-matrix updates of ``items`` on this rank, one call of the matrix rule. Each full
    gradient comes from ``source`` (a gather's tag) when it holds the item, else from the
    rank's own gradient buffer (the item is whole here)."""

    tag: str
    items: tuple[int, ...]
    source: str | None
    phase: str = "compute"


@dataclass(frozen=True)
class Apply:
    """Apply updates to this rank's parameters: ``source`` is a `Compute` (whole updates; the
    items in ``slice_tp`` are cut to this TP rank's shard first) or a `TpScatter` (shards)."""

    tag: str
    items: tuple[int, ...]
    source: str
    slice_tp: tuple[int, ...] = ()
    phase: str = "apply"


@dataclass(frozen=True)
class Elementwise:
    """AdamW on flat ranges of the rank's buffers (whole local params or ZeRO-1 shard ranges).
    ``ranges`` are (start, end) pairs; optimizer state is kept per range."""

    tag: str
    ranges: Ranges
    phase: str = "compute"


@dataclass(frozen=True)
class GradNorm:
    """Gradient clipping: the sum of squares of the gradient buffer over ``ranges`` (the
    elements this rank counts, so that across ranks every gradient element counts once),
    accumulated in ``dtype`` (`canzona.optim.clip`)."""

    tag: str
    ranges: Ranges
    phase: str = "clip_grad"
    dtype: str = "float32"


@dataclass(frozen=True)
class ClipScale:
    """Gradient clipping: from the global sum of squares (``norm``: a `NormReduce` or, alone, a
    `GradNorm` tag) the coefficient max_norm / (norm + 1e-6); when below 1 the gradient ranges
    this rank reads in its step are scaled by it (Megatron's clip_grad_norm)."""

    tag: str
    norm: str
    max_norm: float
    ranges: Ranges
    phase: str = "clip_grad"


@dataclass(frozen=True)
class CopyToModel:
    """bf16 training: copy the updated fp32 main parameters over ``ranges`` into the bf16 model
    parameters (Megatron's copy of main params to model params at the end of ``step()``)."""

    tag: str
    ranges: Ranges
    phase: str = "apply"


@dataclass(frozen=True)
class Wait:
    """Block until the communication actions named by ``tags`` completed (and finish them:
    copy-out, averaging, unpacking)."""

    tags: tuple[str, ...]
    phase: str
    label: str = ""


@dataclass(frozen=True)
class Mark:
    """A named instant of the iteration (``step_start``, ``step_end``) for the timers."""

    name: str


@dataclass(frozen=True)
class GatherWait:
    """Overlapped parameter gather, Megatron's way (``--overlap-param-gather``): before the
    module owning ``param`` runs, wait for the gather ``tag``, then issue ``then`` (the gather of
    the next bucket the forward needs) -- one bucket in flight, dispatched in forward order."""

    param: int
    tag: str
    then: Comm | None


@dataclass(frozen=True)
class Forward:
    """The model's forward pass (loss on this rank's micro-batch), with the overlapped
    parameter gather's waits in module pre-hooks (``waits``, in forward order)."""

    waits: tuple[GatherWait, ...] = ()
    micro: int = 0  # which micro-batch of the iteration (gradient accumulation)
    phase: str = "forward"

    def issues(self) -> tuple[Comm, ...]:
        return tuple(w.then for w in self.waits if w.then is not None)


@dataclass(frozen=True)
class BucketHook:
    """What backward issues the moment every gradient of ``bucket`` has landed in the buffer."""

    bucket: int
    issue: tuple[Comm, ...]


@dataclass(frozen=True)
class Backward:
    """The backward pass. Gradients land in the flat buffer from post-accumulate hooks;
    ``tp_partial`` params have partial gradients on each TP rank and are all-reduced over TP in
    their hook; ``hooks`` (buckets in index order) issue a bucket's reduction once it is full."""

    hooks: tuple[BucketHook, ...]
    tp_partial: tuple[tuple[int, int], ...]  # (param index, local elements)
    dtype: str
    micro: int = 0
    last: bool = True  # the last micro-batch's backward: its hooks reduce the accumulated gradients
    phase: str = "backward"

    @_memo
    def calls(self) -> tuple[Call, ...]:
        """The hooks' own TP all-reduces (bucket reductions are listed by their actions)."""
        return tuple(_call("all_reduce", "tp", n, n, self.dtype) for _, n in self.tp_partial)


Action = Forward | Backward | Wait | Mark | Compute | Apply | Elementwise | GradNorm | ClipScale | CopyToModel | Comm
# Every concrete action type, the keys each interpreter's dispatch table must hold (a unit test
# checks the executor's, the simulator's, the renderer's and the counting pass's).
ACTION_TYPES: tuple[type, ...] = typing.get_args(Action)

_H = TypeVar("_H")


def dispatch_table(handlers: Mapping[type | tuple[type, ...], _H]) -> dict[type, _H]:
    """An interpreter's dispatch table: its handler per action type, looked up as
    ``table[type(action)]`` (one dict lookup: the simulator and the counting pass meet millions
    of actions). A tuple key, such as `COMM_TYPES`, gives its handler to each of its types."""
    table: dict[type, _H] = {}
    for key, handler in handlers.items():
        for kind in key if isinstance(key, tuple) else (key,):
            if kind in table:
                raise ValueError(f"two handlers for {kind.__name__}")
            table[kind] = handler
    return table


@dataclass(frozen=True)
class Program:
    """One rank's iteration: ``actions`` in order; ``prologue`` runs once before the first
    iteration and ``drain`` once after the last (the overlapped parameter gathers an iteration
    leaves in flight for the next forward)."""

    rank: int
    dp_rank: int
    tp_rank: int
    dp: int
    tp: int
    actions: tuple[Action, ...]
    drain: tuple[Action, ...] = ()
    # Issued once before the first iteration, as if a previous step had ended: the first
    # overlapped parameter gather (so every iteration makes the same calls).
    prologue: tuple[Action, ...] = ()
    # The matrices whose full update this rank computes (ownership checks).
    matrix_items: tuple[int, ...] = ()
    # bf16 training: the buffer ranges whose fp32 main parameters this rank holds and updates
    # (empty in fp32: the model's parameters are the main parameters).
    main_ranges: Ranges = ()
    param_dtype: str = "float32"
    notes: dict[str, str] = field(default_factory=dict, compare=False)
    # An MoE model's expert grid (its expert buffer's collectives run on its edp / etp groups)
    experts: ExpertLayout | None = None

    def comms(self) -> list[Comm]:
        """Every communication action, in issue order (backward hooks in place)."""
        return list(self._comms())

    @_memo
    def _comms(self) -> tuple[Comm, ...]:
        out: list[Comm] = []
        for a in (*self.prologue, *self.actions, *self.drain):
            kind = type(a)
            if kind is Forward:
                out.extend(a.issues())
            elif kind is Backward:
                for h in a.hooks:
                    out.extend(h.issue)
            elif is_comm(kind):
                out.append(a)
        return tuple(out)

    def calls(self) -> list[tuple[str, Call]]:
        """Every torch.distributed call of the iteration as ``(action tag, call)``, in order."""
        return list(self._calls())

    @_memo
    def _calls(self) -> tuple[tuple[str, Call], ...]:
        out: list[tuple[str, Call]] = []
        for a in self.actions:
            out.extend(tagged_calls(a))
        return tuple(out)


def tagged_calls(a: Action) -> tuple[tuple[str, Call], ...]:
    """The ``(action tag, call)`` pairs one action of an iteration contributes to
    `Program.calls`: a forward the calls of the gathers its hooks issue, a backward its own
    calls then its bucket hooks', a communication action its calls; kept on the action (the
    lowering shares actions between ranks)."""
    kind = type(a)
    if kind is not Forward and kind is not Backward and not is_comm(kind):
        return ()
    d = a.__dict__
    found = d.get("_memo_tagged_calls")
    if found is None:
        if kind is Forward:
            found = tuple((comm.tag, c) for comm in a.issues() for c in comm.calls())
        elif kind is Backward:
            found = tuple(("backward", c) for c in a.calls()) + tuple(
                (comm.tag, c) for h in a.hooks for comm in h.issue for c in comm.calls())
        else:
            found = tuple((a.tag, c) for c in a.calls())
        d["_memo_tagged_calls"] = found
    return found
