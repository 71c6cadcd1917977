"""A preloaded parent of dry-run ranks: ``python -m canzona.trial.dryrun.zygote [LIBRARY]``.

Importing torch and megatron-core takes seconds; a dry run of a sweep runs hundreds of ranks.
The zygote loads the fake CUDA device (`canzona.trial.dryrun.fakecuda`, before torch) and imports
the rank code once, then forks one fresh child per rank: every rank still runs in a process of
its own (nothing of a rank carried to the next but the op metadata of torch's fake-tensor
cache, below), without paying for the imports.

Protocol, one line each way per rank. stdin: ``SPEC RESULT STDERR`` (paths; the child runs
`canzona.trial.dryrun.worker.main` with SPEC and RESULT, its stderr going to STDERR). When the
child ends, the zygote writes ``RESULT.rc`` holding its exit status (a signal N as -N), also
for a child that crashed before writing RESULT. EOF on stdin: wait for the children, exit.
Nothing has run in this process but imports and plain-data bookkeeping when it forks (no
threads, no CUDA, no tensors): fork is safe.

A child also leaves, in the zygote's own folder, the fake-tensor cache entries it computed;
the zygote adds them to its cache, so that later children start with the metadata of the ops
earlier ranks ran (`canzona.trial.dryrun.fakecache`: plain data, no tensors, no threads).
"""

from __future__ import annotations

import gc
import os
import selectors
import shutil
import sys
import tempfile
from pathlib import Path

from canzona.trial.dryrun import fakecuda


def _child(spec: str, result: str, stderr: str, cache: str) -> None:
    code = 1
    try:
        os.setpgid(0, 0)
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        from canzona.trial.dryrun import worker

        code = worker.main([spec, result], cache_out=cache)
    except BaseException:  # noqa: BLE001 - the parent reads the stderr file and the status
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _status(raw: int) -> int:
    return os.waitstatus_to_exitcode(raw)


def serve(library: str | None) -> None:
    fakecuda.preload(library)
    import torch  # noqa: F401 - the point: imported once, before the forks

    from canzona.trial.dryrun import execute, fakecache, fastkey, worker  # noqa: F401

    fastkey.install()  # checked once here (reads torch's source), inherited by every child

    # What is imported now lives as long as every child: kept out of the cyclic garbage
    # collector's scans (a rank's full collection otherwise walks every module's objects).
    gc.collect()
    gc.freeze()
    folder = tempfile.mkdtemp(prefix="canzona-zygote-")  # the children's fake-tensor cache files
    try:
        _serve(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _serve(folder: str) -> None:
    running: dict[int, tuple[str, str]] = {}  # pid -> (RESULT path, its cache file)
    forked = 0
    fd = sys.stdin.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    pending = b""  # raw reads, split into lines here (a buffered readline would hide queued lines from select)
    open_input = True
    while open_input or running:
        if open_input and sel.select(timeout=0.05):
            chunk = os.read(fd, 65536)
            if not chunk:
                open_input = False
                sel.unregister(fd)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    spec, result, stderr = line.decode().split()
                    cache = os.path.join(folder, f"{forked}.cache")
                    forked += 1
                    pid = os.fork()
                    if pid == 0:
                        _child(spec, result, stderr, cache)
                    running[pid] = (result, cache)
        elif not open_input:
            pid, raw = os.wait()  # nothing more to read: block until a child ends
            _done(running.pop(pid, None), raw)
        while running:
            pid, raw = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _done(running.pop(pid, None), raw)


def _done(child: tuple[str, str] | None, raw: int) -> None:
    if child is None:
        return
    result, cache = child
    tmp = Path(result + ".rc.tmp")
    tmp.write_text(str(_status(raw)))
    os.replace(tmp, result + ".rc")
    from canzona.trial.dryrun import fakecache

    if fakecache.merge(cache):  # after the status: the launcher need not wait for it
        gc.freeze()  # the entries, too, live as long as the zygote


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None)
