"""NCCL's rules, enforced on any backend: so that the CPU (gloo) tests fail where NCCL would.

The CUDA/NCCL path of the harness runs on GPUs only, but almost everything it does with
torch.distributed also runs over gloo on a CPU, where gloo is more forgiving: it accepts a
tensor on any device it can read, bitwise reductions, ``monitored_barrier``, receives from any
source. A change that breaks NCCL would pass every CPU test. With the rules installed, each
collective call is checked first, and a violation raises `NcclRuleError` naming the call, the
argument and the rule:

1. **Tensors on the trial's device.** Every tensor handed to a collective is on the device the
   rank declared (`declare_device`; `canzona.model.parallel.init_parallel` declares the device
   it chose), is dense and contiguous, and has a dtype torch's NCCL backend maps to an NCCL
   type. Stricter than torch on purpose: the world group of a CUDA trial also has a gloo half
   (``cpu:gloo,cuda:nccl``), which would accept a CPU tensor, but a CPU tensor reaching a
   collective of a CUDA trial is a tensor that was meant to be on the device (and would move
   over gloo at CPU speed). Host data goes through the object collectives.
2. **No collective NCCL lacks**: ``monitored_barrier``, ``all_gather_coalesced``, a ``recv``
   from any source, and the bitwise reductions ``BAND``/``BOR``/``BXOR``.
3. **Object collectives only on a group with a CPU backend** (``all_gather_object``,
   ``broadcast_object_list``, ``gather_object``, ``scatter_object_list``, ``send_object_list``,
   ``recv_object_list``): over NCCL they would pickle into CUDA tensors and synchronise the
   device; the trial's groups carry a gloo half for them.

How: `install` replaces the collective functions of ``torch.distributed`` (and of
``torch.distributed.distributed_c10d``, where they are defined) with checking wrappers, and
rebinds every alias already taken in a loaded module (megatron-core keeps
``dist_all_gather_func = torch.distributed.all_gather_into_tensor`` from import time), so calls
through the module attribute and through such aliases are both checked. Only the outermost call
is checked: torch's own nested calls (``all_gather_object`` gathering pickled bytes) are the
implementation, not the caller's choice.

Enabled by `install`, or by ``CANZONA_NCCL_RULES=1`` for `install_from_env`, which every rank
of a trial and of the multi-process tests calls before it runs (``tests/dist`` sets the variable
for all its tests).
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

ENV = "CANZONA_NCCL_RULES"

TENSOR_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_single", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv", "isend",
    "irecv", "batch_isend_irecv", "barrier",
)
OBJECT_COLLECTIVES = (
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list", "send_object_list",
    "recv_object_list",
)
# torch.distributed functions whose NCCL implementation does not exist (ProcessGroupNCCL).
NCCL_LACKS = {
    "monitored_barrier": "NCCL has no monitored_barrier (gloo only); use barrier",
    "all_gather_coalesced": "NCCL does not implement all_gather_coalesced; use all_gather_into_tensor per tensor",
}
# Reductions NCCL has (ProcessGroupNCCL's op table, plus PREMUL_SUM which it builds itself).
NCCL_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM")
# dtypes torch's NCCL backend maps to an NCCL type (ProcessGroupNCCL's ncclDataType table);
# complex tensors are viewed as real by torch.distributed before they reach a backend.
NCCL_DTYPES = frozenset(
    getattr(torch, name) for name in (
        "int8", "uint8", "bool", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64",
        "complex128", "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz",
    ) if hasattr(torch, name)
)


class NcclRuleError(RuntimeError):
    """A torch.distributed call that NCCL would refuse (see the module docstring)."""


_state = threading.local()
_declared: torch.device | None = None
_originals: dict[str, Callable[..., Any]] = {}  # name -> torch's function
_replaced: list[tuple[object, str, Callable[..., Any]]] = []  # (module, attribute, torch's function)


# ---------------------------------------------------------------------------------- switching
def declare_device(device: torch.device | str | None) -> None:
    """The device this rank's collectives must use (call once the rank has chosen it; None
    forgets it)."""
    global _declared
    _declared = None if device is None else torch.device(device)


def installed() -> bool:
    return bool(_originals)


def install_from_env(env: Mapping[str, str] | None = None) -> bool:
    """`install` when ``CANZONA_NCCL_RULES`` is ``1`` (or ``true``); returns whether installed."""
    env = os.environ if env is None else env
    if str(env.get(ENV, "")).strip().lower() in ("1", "true", "yes"):
        install()
    return installed()


def install() -> None:
    """Check every collective from now on (idempotent; `uninstall` undoes it)."""
    if _originals:
        return
    names = [n for n in (*TENSOR_COLLECTIVES, *OBJECT_COLLECTIVES, *NCCL_LACKS) if hasattr(c10d, n)]
    for name in names:
        _originals[name] = getattr(c10d, name)
    wrappers = {name: _wrap(name, fn) for name, fn in _originals.items()}
    by_id = {id(fn): name for name, fn in _originals.items()}
    for module in list(sys.modules.values()):
        if module is None or module is sys.modules[__name__]:
            continue
        try:
            attrs = list(vars(module).items())
        except TypeError:
            continue
        for attr, value in attrs:
            name = by_id.get(id(value))
            if name is not None and value is _originals[name]:
                try:
                    setattr(module, attr, wrappers[name])
                except (AttributeError, TypeError):  # a read-only namespace: nothing calls through it
                    continue
                _replaced.append((module, attr, value))


def uninstall() -> None:
    """Put torch's functions back wherever `install` replaced them."""
    for module, attr, fn in reversed(_replaced):
        setattr(module, attr, fn)
    _replaced.clear()
    _originals.clear()


# ---------------------------------------------------------------------------------- checking
def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(fn)

    def checked(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_state, "depth", 0)
        if depth == 0 and _originals:  # inert once uninstalled (an alias taken meanwhile keeps the wrapper)
            check_call(name, signature.bind(*args, **kwargs).arguments)
        _state.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _state.depth = depth

    checked.__name__ = checked.__qualname__ = name
    checked.__doc__ = fn.__doc__
    checked.__wrapped__ = fn  # type: ignore[attr-defined]
    return checked


def check_call(name: str, arguments: Mapping[str, Any]) -> None:
    """Raise `NcclRuleError` if the call ``name(**arguments)`` breaks one of NCCL's rules."""
    where = f"torch.distributed.{name}"
    if name in NCCL_LACKS:
        raise NcclRuleError(f"{where}: {NCCL_LACKS[name]}")
    if name in ("recv", "irecv") and arguments.get("src") is None and arguments.get("group_src") is None:
        raise NcclRuleError(f"{where}: NCCL cannot receive from any source; pass src")
    op = arguments.get("op")
    if op is not None and _op_name(op) not in NCCL_OPS:
        raise NcclRuleError(f"{where}: NCCL has no reduction {_op_name(op)}; allowed: {', '.join(NCCL_OPS)}")
    group = arguments.get("group")
    if name in OBJECT_COLLECTIVES:
        devices = group_devices(group)
        if "cpu" not in devices:
            raise NcclRuleError(
                f"{where}: object collectives need a group with a CPU backend (e.g. cpu:gloo,cuda:nccl); "
                f"this group has backends for {', '.join(sorted(devices)) or 'no device'} only"
            )
        return
    device = collective_device()
    for label, tensor in _tensors(arguments):
        if tensor.device != device:
            raise NcclRuleError(
                f"{where}: {label} is on {tensor.device} but this rank's collectives run on {device}"
            )
        if tensor.layout != torch.strided or not _contiguous(tensor):
            raise NcclRuleError(f"{where}: {label} must be dense and contiguous for NCCL")
        if tensor.dtype not in NCCL_DTYPES:
            raise NcclRuleError(f"{where}: {label} has dtype {tensor.dtype}, which NCCL has no type for")


def collective_device() -> torch.device:
    """The device this rank's collectives must use: the declared one, else the default group's."""
    return _declared if _declared is not None else default_group_device()


def default_group_device() -> torch.device:
    """The device of the default group's tensor collectives: this process's current CUDA device
    when the group has an NCCL half, else the CPU (also before any group is up)."""
    if dist.is_initialized() and "nccl" in dist.get_backend_config():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_devices(group: Any = None) -> set[str]:
    """The device types ``group`` (None: the default group) has a backend for."""
    config = dist.get_backend_config(group)  # "cpu:gloo,cuda:nccl"; "gloo": "cpu:gloo,cuda:gloo"
    return {part.split(":", 1)[0].strip() for part in config.split(",") if ":" in part}


def _contiguous(t: torch.Tensor) -> bool:
    """Contiguous in its own memory format (ProcessGroupNCCL's check), channels-last included."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    return t.is_contiguous() or (t.dim() in formats and t.is_contiguous(memory_format=formats[t.dim()]))


def _op_name(op: Any) -> str:
    """``ReduceOp.SUM`` (a RedOpType) or ``ReduceOp(...)`` (an instance holding one) -> "SUM"."""
    op = getattr(op, "op", op)
    return str(getattr(op, "name", op)).rsplit(".", 1)[-1]


def _tensors(arguments: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in the call's arguments (lists of tensors and P2P ops included)."""
    for key, value in arguments.items():
        yield from _walk(key, value)


def _walk(label: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield label, value
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            yield from _walk(f"{label}[{k}]", item)
    elif isinstance(value, dist.P2POp):
        yield f"{label}.tensor", value.tensor
