"""Sharing torch's fake-tensor dispatch cache between the dry-run ranks of one zygote.

A fake tensor op costs a rank most of its time the first time it meets an op with inputs of
given shapes, dtypes and strides: torch runs the op's meta kernel, then keeps the output's
metadata in ``FakeTensorMode.cache`` (a process-wide dict keyed by the op and its inputs'
metadata, never by tensor identity), and every later call with the same key reads it back. A
fresh rank process starts with an empty cache, so every rank paid for every op once, although
the trials of a sweep share most shapes (forward and backward depend on the model and its TP
layout, not on the method, the optimizer or the DP size). Here a rank forked from the zygote
(`canzona.trial.dryrun.zygote`) writes the entries it added to a file when it ends (`export`),
and the zygote adds them to its own cache (`merge`), which its later children inherit: a rank
runs exactly the same code and ops, it only finds more of their metadata already computed.

Entries are exported only when every part of their key is a plain value (op overloads by
name, dtypes, devices, layouts, memory formats, numbers, strings, container types): an entry
naming a process group or any other object of one process stays in that process. Anything
unexpected (another torch's cache layout, an entry that does not pickle) leaves the entry, or
the whole file, out: sharing is an optimisation and never an error.

Imports torch (call it in a rank or the zygote, after `canzona.trial.dryrun.fakecuda.preload`).
"""

from __future__ import annotations

import itertools
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses import fake_tensor

_OP = "canzona.fakecache.op"  # the tag of an encoded op (keys hold no tuples of their own)
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_TYPES: dict[type, bool] = {}  # a class in a key (a container's type): does it pickle by name?


class _Skip(Exception):
    """An entry whose key holds something of this process only."""


def _cache() -> dict | None:
    cache = getattr(fake_tensor.FakeTensorMode, "cache", None)
    return cache if isinstance(cache, dict) else None


def size() -> int:
    """Entries in this process's cache (what a rank inherited, before it runs)."""
    cache = _cache()
    return len(cache) if cache is not None else 0


def _plain_type(x: type) -> bool:
    ok = _TYPES.get(x)
    if ok is None:
        try:
            ok = pickle.loads(pickle.dumps(x)) is x
        except Exception:  # noqa: BLE001 - a class of one process (pybind11 types, ...)
            ok = False
        _TYPES[x] = ok
    return ok


def _encode(x: Any) -> Any:
    if type(x) is OpOverload:
        return (_OP, x._schema.name, x._overloadname)
    if isinstance(x, _PLAIN) or (isinstance(x, type) and _plain_type(x)):
        return x
    raise _Skip


def _decode(x: Any) -> Any:
    if isinstance(x, tuple):
        tag, name, overload = x
        if tag != _OP:
            raise _Skip
        namespace, op = name.split("::")
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    return x


def export(path: str | os.PathLike, since: int) -> int:
    """Write the cache entries added after the first ``since`` to ``path``; how many."""
    cache = _cache()
    if cache is None or len(cache) <= since:
        return 0
    entries = []
    for key, value in itertools.islice(list(cache.items()), since, None):
        try:
            if not isinstance(value, (fake_tensor._DispatchCacheValidEntry, fake_tensor._DispatchCacheBypassEntry)):
                raise _Skip
            entries.append((tuple(_encode(x) for x in key.key), value))
        except (_Skip, AttributeError, TypeError):
            continue
    if not entries:
        return 0
    try:
        data = pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - an entry that does not pickle: none is shared
        return 0
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(entries)


def merge(path: str | os.PathLike) -> int:
    """Add the entries of an `export` file to this process's cache (those it lacks) and remove
    the file; how many were added. Any failure adds nothing."""
    path = Path(path)
    cache = _cache()
    try:
        if cache is None or not path.exists():
            return 0
        entries = pickle.loads(path.read_bytes())
        added = 0
        for parts, value in entries:
            try:
                key = fake_tensor._DispatchCacheKey(tuple(_decode(x) for x in parts))
            except (_Skip, AttributeError, TypeError, ValueError):
                continue
            if key not in cache:
                cache[key] = value
                added += 1
        return added
    except Exception:  # noqa: BLE001 - a file from another torch, truncated, ...: ignored
        return 0
    finally:
        path.unlink(missing_ok=True)
