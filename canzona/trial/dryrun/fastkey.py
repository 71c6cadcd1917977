"""A faster, equal cache key for torch's fake-tensor dispatch cache (a dry-run rank's hot path).

Every op a dry-run rank runs on fake tensors first computes its cache key
(``FakeTensorMode._cache_key``): for each tensor argument, torch builds a ``TensorMetadata``
(shape, strides, dtype, device, memory format, storage size and flags) and flattens it into the
key through generic, reflective code -- about a quarter of a rank's time once the cache is warm
(`canzona.trial.dryrun.fakecache`). `install` replaces ``FakeTensorMode._prep_args_for_hash``
with a version that writes the same values in the same order directly for the arguments a rank
passes (numbers, strings, dtypes, devices, and this mode's strided fake tensors of static
shape) and hands every other argument to torch's own function unchanged.

It is installed only on the torch whose three functions it transcribes have exactly the
source it was written from (`_SOURCES`; any other torch keeps its own, slower path), and it
checks itself: the first `CHECKED` keys of a process, and one in `EVERY` afterwards, are also
computed by torch's code, and any difference (values, or the reason caching is refused)
restores torch's function for the rest of the process, with one line on stderr. A key is
therefore the one torch would compute, and a rank runs the same ops with the same results.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import threading

import torch
from torch._prims_common import suggest_memory_format
from torch._subclasses import fake_tensor as _ft

CHECKED = 2000  # keys checked against torch's at the start of a process
EVERY = 64  # then one in this many
# sha256[:16] of the source of what `_prep` and `_flatten` transcribe (torch 2.13)
_SOURCES = {
    "FakeTensorMode._prep_args_for_hash": "5c9d4a6f14c8ff30",
    "extract_tensor_metadata": "63a9d204a477340d",
    "TensorMetadata._flatten_into": "c7b8b2b3a8c24121",
}
_FIELDS = ("dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset", "storage_bytes",
           "requires_grad", "is_quantized", "is_conj", "is_neg", "is_inference", "is_sparse", "is_coalesced",
           "dense_dim", "sparse_dim")
# Arguments torch's function appends as (their type, themselves): none of its other cases applies
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})
_CONTAINERS = (list, tuple, dict)

_torch_prep = _ft.FakeTensorMode._prep_args_for_hash
_state = threading.local()  # .reference: inside torch's own computation of a checked key
_count = 0
_installed = False


def _flatten(t: _ft.FakeTensor, result: list) -> None:
    """``extract_tensor_metadata(t)._flatten_into(result, ...)`` for a strided fake tensor of
    static shape (shape and strides flattened as `_prep` flattens a tuple of ints)."""
    memory_format = suggest_memory_format(t)
    if not t.is_contiguous(memory_format=memory_format):
        memory_format = None
    append = result.append
    append(t.dtype)
    shape = t.shape
    append(type(shape))
    append(f"length_{len(shape)}")
    for s in shape:
        append(type(s))
        append(s)
    stride = t.stride()
    append(type(stride))
    append(f"length_{len(stride)}")
    for s in stride:
        append(type(s))
        append(s)
    append(t.device)
    append(t.layout)
    append(memory_format)
    append(t.storage_offset())
    append(t.untyped_storage().nbytes())
    append(t.requires_grad)
    append(t.is_quantized)
    append(t.is_conj())
    append(t.is_neg())
    append(t.is_inference())
    append(t.is_sparse)
    append(None)  # is_coalesced, dense_dim, sparse_dim: None for a strided tensor
    append(None)
    append(None)


def _prep(mode, result: list, args, state, id_hashed_objects: list) -> None:
    """``FakeTensorMode._prep_args_for_hash``, the common arguments written directly."""
    if isinstance(args, _CONTAINERS):
        result.append(type(args))
        result.append(f"length_{len(args)}")
    if isinstance(args, dict):
        _prep(mode, result, args.keys(), state, id_hashed_objects)
        _prep(mode, result, args.values(), state, id_hashed_objects)
        return
    for arg in args:
        kind = type(arg)
        if kind in _PLAIN:
            result.append(kind)
            result.append(arg)
        elif (kind is _ft.FakeTensor and arg.fake_mode is mode and arg.constant is None
              and arg.layout is torch.strided and not arg._has_symbolic_sizes_strides):
            _flatten(arg, result)
        elif kind is list or kind is tuple or kind is dict:
            _prep(mode, result, arg, state, id_hashed_objects)
        else:  # anything else exactly as torch does it (an iterator: no container prefix)
            _torch_prep(mode, result, iter((arg,)), state, id_hashed_objects)


def _checked(mode, result: list, args, state, id_hashed_objects: list) -> None:
    """The method installed: `_prep`, checked against torch's function at the rate above."""
    global _count
    if getattr(_state, "reference", False):  # torch's recursion while it computes a reference
        return _torch_prep(mode, result, args, state, id_hashed_objects)
    _count += 1
    if _count > CHECKED and _count % EVERY:
        return _prep(mode, result, args, state, id_hashed_objects)
    want, want_error = [], None
    _state.reference = True
    try:
        _torch_prep(mode, want, args, state, [])
    except _ft._BypassDispatchCache as e:
        want_error = e.reason
    finally:
        _state.reference = False
    start, error = len(result), None
    try:
        _prep(mode, result, args, state, id_hashed_objects)
    except _ft._BypassDispatchCache as e:
        error = e.reason
    if error != want_error or (error is None and result[start:] != want):
        uninstall()
        print("canzona dry run: a fast fake-tensor cache key differed from torch's; torch's own is used from now on",
              file=sys.stderr)
        del result[start:]
        if want_error is not None:
            raise _ft._BypassDispatchCache(want_error)
        result.extend(want)
    elif error is not None:
        raise _ft._BypassDispatchCache(error)


def _source_hash(obj) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def supported() -> bool:
    """Is this torch's key code the code `_prep` transcribes?"""
    try:
        found = {
            "FakeTensorMode._prep_args_for_hash": _source_hash(_torch_prep),
            "extract_tensor_metadata": _source_hash(_ft.extract_tensor_metadata),
            "TensorMetadata._flatten_into": _source_hash(_ft.TensorMetadata._flatten_into),
        }
        import dataclasses

        fields = tuple(f.name for f in dataclasses.fields(_ft.TensorMetadata))
    except (OSError, TypeError, AttributeError):
        return False
    return found == _SOURCES and fields == _FIELDS


def install() -> bool:
    """Use the fast key in this process (where `supported`); whether it is in use."""
    global _installed
    if not _installed and supported():
        _ft.FakeTensorMode._prep_args_for_hash = _checked
        _installed = True
    return _installed


def uninstall() -> None:
    global _installed
    _ft.FakeTensorMode._prep_args_for_hash = _torch_prep
    _installed = False
