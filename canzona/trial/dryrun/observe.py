"""Watching a fake rank: every device allocation and every collective that reaches the backend.

`Observer` is a ``TorchDispatchMode`` entered inside the ``FakeTensorMode``, so it sees each aten
op of the rank (autograd's too: the engine's threads inherit the mode) with fake outputs, and
each ``c10d`` op the process groups issue, Megatron's included.

**Memory** (`Ledger`). A fake tensor has a storage of a definite size that holds nothing; its
Python object lives exactly as long as the storage (torch preserves it), so a ``weakref``
finaliser on it marks the free. The ledger numbers every allocation and free, keeps the live
CUDA bytes and the peak, and remembers for each storage when it lived, the phase that allocated
it and -- once the run says so -- its role. The breakdown at the peak is therefore exact and
categorised after the fact: `label` names the storages of the flat parameter and gradient
buffers, the fp32 main parameters and the optimizer state (`Runtime.tensors_by_role`); storages
the model build allocated are parameters (the model's own, until the flat buffer replaces them);
what the forward pass allocated and is still alive is activations; everything else (bucket and
micro-group communication buffers, gathered matrices, updates, gradients on their way into the
buffer, temporaries) is transient, broken down by the phase that allocated it. What torch's
CUDA caching allocator adds on top (rounding to 512 B blocks, fragmentation), the CUDA context
and NCCL's own buffers are not device tensors and are not counted.

**Collectives** (`CollectiveLog`). Each ``c10d`` op is logged (op, group, elements, dtype) and
checked as NCCL and the group's other members would: every tensor a CUDA tensor, sizes
consistent with the group size (all-gather output = P x input, reduce-scatter input = P x
output, all-to-all splits summing to the tensors and one per member), input and output of one
dtype. A violation raises `CollectiveError` at the call, so the rank fails with the call's
traceback.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

_DEVICE = torch.ops.prim.device.default
_META = torch.device("meta")
CATEGORIES = ("parameters", "gradients", "main_parameters", "optimizer_state", "activations", "transient")
# Phases whose allocations are parameters / activations when nothing labels them otherwise.
_PHASE_CATEGORY = {"build": "parameters", "forward": "activations"}


class CollectiveError(RuntimeError):
    """A collective call NCCL or the other members of its group would not accept."""


@dataclass
class _Block:
    """One storage: its bytes, when it lived (ledger event numbers), who allocated it."""

    nbytes: int
    born: int
    phase: str
    iteration: int
    died: int | None = None
    role: str | None = None

    def category(self) -> str:
        return self.role or _PHASE_CATEGORY.get(self.phase, "transient")


class Ledger:
    """Live bytes of fake tensors on ``device_type`` over time, with the peak and what was
    alive at it."""

    def __init__(self, device_type: str = "cuda") -> None:
        self.device_type = device_type
        self.blocks: list[_Block] = []
        self._live: dict[int, _Block] = {}  # id(storage) -> its block, while the storage lives
        self.event = 0
        self.live = 0
        self.peak = 0
        self.peak_event = 0
        self.peak_where = ("", 0)  # (phase, iteration) of the peak
        self.phase_peaks: dict[tuple[int, str], int] = {}  # (iteration, phase) -> most live bytes in it
        self._phases: list[str] = ["setup"]
        self.iteration = 0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Allocations inside are booked to ``name``."""
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()

    # ------------------------------------------------------------------ events
    def see(self, t: torch.Tensor) -> None:
        """Account for a tensor an op produced (a new storage, or one that grew)."""
        if not isinstance(t, FakeTensor) or t.device.type != self.device_type:
            return
        storage = t.untyped_storage()
        key = id(storage)
        block = self._live.get(key)
        nbytes = storage.nbytes()
        if block is None:
            self.event += 1
            block = _Block(nbytes, self.event, self._phases[-1], self.iteration)
            self.blocks.append(block)
            self._live[key] = block
            weakref.finalize(storage, self._free, key)
            self._grow(nbytes)
        elif nbytes != block.nbytes:  # resized in place
            self.event += 1
            self._grow(nbytes - block.nbytes)
            block.nbytes = nbytes

    def _grow(self, delta: int) -> None:
        self.live += delta
        where = (self.iteration, self._phases[-1])
        if self.live > self.phase_peaks.get(where, 0):
            self.phase_peaks[where] = self.live
        if self.live > self.peak:
            self.peak, self.peak_event = self.live, self.event
            self.peak_where = (self._phases[-1], self.iteration)

    def _free(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.event += 1
        block.died = self.event
        self.live -= block.nbytes

    def label(self, tensors, role: str) -> None:
        """Name the role of the storages of ``tensors`` (live now): it overrides the phase rule."""
        for t in tensors:
            block = self._live.get(id(t.untyped_storage()))
            if block is not None:
                block.role = role

    # ------------------------------------------------------------------ reading
    def alive_at(self, event: int) -> list[_Block]:
        return [b for b in self.blocks if b.born <= event and (b.died is None or b.died > event)]

    def breakdown(self, event: int | None = None) -> dict[str, object]:
        """Bytes per category alive at ``event`` (default: now), and the transient bytes by the
        phase that allocated them."""
        blocks = self.alive_at(self.event if event is None else event)
        out = dict.fromkeys(CATEGORIES, 0)
        by_phase: dict[str, int] = defaultdict(int)
        for b in blocks:
            c = b.category()
            out[c] += b.nbytes
            if c == "transient":
                by_phase[b.phase] += b.nbytes
        return {**out, "total": sum(b.nbytes for b in blocks), "transient_by_phase": dict(by_phase)}


class CollectiveLog:
    """Every c10d op of the rank, checked (module docstring) and tallied per op and group."""

    def __init__(self, groups: dict[str, dist.ProcessGroup]):
        self._axis = {id(g): name for name, g in groups.items()}
        self.tally: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])  # (op, axis, dtype) -> [calls, bytes]

    def check(self, func, args: tuple, kwargs: dict) -> None:
        op = func._opname
        group = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.ScriptObject)), None)
        if group is None:
            return
        pg = dist.ProcessGroup.unbox(group)
        size = pg.size()
        axis = self._axis.get(id(pg), f"group of {size}")
        where = f"c10d.{op} over the {axis} group ({size} ranks)"
        tensors = list(_tensors(args))
        for t in tensors:
            if not isinstance(t, FakeTensor) or t.device.type != "cuda":
                raise CollectiveError(f"{where}: a {t.device} tensor {tuple(t.shape)} reached a CUDA collective")
            if not t.is_contiguous():
                raise CollectiveError(f"{where}: a non-contiguous tensor {tuple(t.shape)} (NCCL needs dense ones)")
        if len({t.dtype for t in tensors}) > 1:
            raise CollectiveError(f"{where}: tensors of different dtypes {sorted({str(t.dtype) for t in tensors})}")
        _check_sizes(op, where, args, size)
        if tensors:
            row = self.tally[(op.rstrip("_").lstrip("_"), axis, str(tensors[0].dtype).removeprefix("torch."))]
            row[0] += 1
            row[1] += max(t.numel() for t in tensors) * tensors[0].element_size()

    def summary(self) -> list[dict[str, object]]:
        return [{"op": op, "axis": axis, "dtype": dtype, "calls": calls, "bytes": nbytes}
                for (op, axis, dtype), (calls, nbytes) in sorted(self.tally.items())]


def _tensors(args) -> Iterator[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def _check_sizes(op: str, where: str, args: tuple, size: int) -> None:
    if op == "_allgather_base_":
        out, inp = args[0], args[1]
        if out.numel() != size * inp.numel():
            raise CollectiveError(f"{where}: output of {out.numel()} elements for an input of {inp.numel()}")
    elif op == "_reduce_scatter_base_":
        out, inp = args[0], args[1]
        if inp.numel() != size * out.numel():
            raise CollectiveError(f"{where}: input of {inp.numel()} elements for an output of {out.numel()}")
    elif op == "alltoall_base_":
        out, inp, out_splits, in_splits = args[0], args[1], args[3], args[4]
        for name, t, splits in (("output", out, out_splits), ("input", inp, in_splits)):
            rows = t.shape[0] if t.dim() else 0
            if splits and (len(splits) != size or sum(splits) != rows):
                raise CollectiveError(f"{where}: {name} splits {list(splits)} do not cut its {rows} rows into {size}")
            if not splits and rows % size:
                raise CollectiveError(f"{where}: {name} of {rows} rows does not split evenly into {size}")
    elif op == "allgather_":
        outs, inputs = args[0], args[1]
        for o, i in zip(outs, inputs):
            if len(o) != size or any(x.numel() != i.numel() for x in o):
                raise CollectiveError(f"{where}: output list does not hold {size} tensors of {i.numel()} elements")


class Observer(TorchDispatchMode):
    """The dispatch mode that feeds a `Ledger` and a `CollectiveLog` (module docstring)."""

    def __init__(self, groups: dict[str, dist.ProcessGroup], device_type: str = "cuda"):
        super().__init__()
        self.ledger = Ledger(device_type)
        self.collectives = CollectiveLog(groups)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ so that torch.compile does not trace into it;
        # nothing is compiled in a dry run, and the wrapper costs two calls on every op
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor) and not kwargs:
            # About half of a rank's dispatches: C++ asking a fake tensor for its device. It
            # allocates nothing and is no collective; answered as FakeTensor's own handler does,
            # without the fake mode's round trip.
            t = args[0]
            return _META if t.fake_mode.in_kernel_invocation else t.fake_device
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            self.collectives.check(func, args, kwargs)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            self.ledger.see(out)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self.ledger.see(o)
                elif isinstance(o, (tuple, list)):
                    for x in o:
                        if isinstance(x, torch.Tensor):
                            self.ledger.see(x)
        return out
