"""Keep freed host memory in the process: a CPU rank's stand-in for PyTorch's caching allocator.

A GPU rank's tensors come from PyTorch's CUDA caching allocator: the blocks an iteration frees
serve the next one, and the device never hands pages back in between. A CPU tensor comes from
the C library's ``malloc``. glibc serves a block above its mmap threshold (128 KiB at start,
raised as such blocks are freed, at most 32 MiB) straight from the kernel and unmaps it on
free, so the next iteration's tensor of that size faults every page in anew, each one zeroed
by the kernel. How much of a timing that is depends on which sizes the process happened to
free before (the threshold moves), not on the method.

Measured on the README's first sweep's 0.6B trial (width/8, 4 layers, dp 2 × tp 1, 2 ranks on
2 cores, docs/results.md): 4300-4750 minor page faults and 10-20 ms of system time in every
backward, and the calibration's own timing of the same model had escaped them (the sizes it
had freed before had raised the threshold), so the projection missed the trial's backward by
that much.

`retain_freed_memory` fixes glibc's policy so that CPU ranks and the calibration both run as a
caching allocator does: ``M_MMAP_THRESHOLD`` = 32 MiB (glibc's largest) serves every block up to
that size from the heap, and ``M_TRIM_THRESHOLD`` = -1 never trims freed heap back to the
kernel; setting them also stops glibc from moving the threshold. With it that backward faults no
page in, and the trial's backward took 34.6 and 44.9 ms against 58.6 and 63.7 without
(interleaved runs of the same trial), its peak resident memory what it was (405-415 MB a rank
either way). Blocks above 32 MiB are still mapped and
unmapped: with them on the heap too (``M_MMAP_MAX`` = 0), a loop that frees and re-allocates one
80 MB tensor held seven copies before it reused one (glibc's aligned allocation does not fit
into the exact block it freed). `ENV` is the same policy for a process that does not import
canzona (the Megatron peer's worker), read by glibc at start.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on a 64-bit machine (HEAP_MAX_SIZE / 2)

POLICY = "glibc malloc: freed memory kept (M_MMAP_THRESHOLD=32 MiB, M_TRIM_THRESHOLD=-1)"
# the same policy through glibc's environment variables, for a process started without canzona
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(2**62)}

_applied: str | None = None


def retain_freed_memory() -> str | None:
    """Set this process's allocator to keep what it frees (idempotent); returns `POLICY`, or
    None where the C library is not glibc (nothing is changed)."""
    global _applied
    if _applied is not None:
        return _applied
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(_M_TRIM_THRESHOLD, -1) != 1:
        raise OSError(f"glibc refused mallopt(M_MMAP_THRESHOLD, {MMAP_THRESHOLD}) / mallopt(M_TRIM_THRESHOLD, -1)")
    _applied = POLICY
    return _applied


__all__ = ["ENV", "POLICY", "retain_freed_memory"]
