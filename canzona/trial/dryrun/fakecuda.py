"""A fake CUDA device for CPU-only torch: what lets full-size CUDA ranks run here on fake tensors.

`torch._subclasses.fake_tensor.FakeTensorMode` makes ``device="cuda"`` tensors that hold no
memory, but a CPU-only torch has no CUDA *device guard*: every C++ path that takes one (Python
indexing and ``copy_``, ``Tensor.to``, and autograd, which records the producing stream of every
CUDA gradient) stops with "PyTorch is not linked with support for cuda devices", and the
autograd engine then asks for the current accelerator and finds none. So each dry-run rank
process first loads a tiny C++ library that registers

- c10's own ``FakeGuardImpl<CUDA>`` as the CUDA device guard (device and stream bookkeeping,
  events that do nothing), and
- CUDA hooks that report a built, available CUDA (no allocator, no generator, no kernels: a
  FakeTensorMode never asks for them).

It must be loaded before ``import torch``: torch fetches the CUDA hooks once, during its own
initialisation. `preload` does that in a fresh process; nothing else in a process that loaded it
may use real CUDA. ``torch.cuda.is_available()`` stays False.

The library is compiled once per torch version with the system C++ compiler (``$CXX``, else
``c++``) against torch's headers, into the calibration cache's folder (``$CANZONA_CACHE_DIR``,
else ``~/.cache/canzona``): a few seconds, once. On a torch built with CUDA none of this is needed (torch's own guard and
hooks are present: a dry run there uses them) and `preload` loads nothing.

This module imports no torch at import time: the worker imports it before torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
// Registered at load time (static initialisers); see canzona/trial/dryrun/fakecuda.py.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace at {
namespace {
struct FakeCUDAHooks final : CUDAHooksInterface {
  explicit FakeCUDAHooks(CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
};
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
}  // namespace
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", FakeCUDAHooks);
}  // namespace at

// 1 when torch's CUDA hooks are these (the library was loaded before torch initialised).
extern "C" int canzona_fake_cuda_active() { return at::detail::getCUDAHooks().hasCUDA() ? 1 : 0; }
"""


_loaded: str | None = None  # the library this process loaded


class FakeCudaError(RuntimeError):
    """The fake CUDA device cannot be built or loaded here (one line saying why)."""


def torch_lib_dir() -> Path:
    """torch's shared libraries, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise FakeCudaError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def torch_has_cuda() -> bool:
    """Is the installed torch a CUDA build (it then brings its own guard and hooks)?"""
    return (torch_lib_dir() / "libtorch_cuda.so").exists()


def library_path() -> Path:
    """Where the library for this torch and this source lives: the calibration cache's folder
    (`canzona.calibrate.cache.cache_dir`; imported here, not at module level: it imports torch)."""
    from canzona.calibrate.cache import cache_dir

    key = f"{importlib.metadata.version('torch')}\0{sys.platform}\0{SOURCE}"
    return cache_dir() / f"fakecuda-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def ensure_built() -> Path | None:
    """The library's path, compiled first if needed; None on a CUDA build of torch. Safe to call
    from several processes at once (each compiles into its own file, the rename is atomic)."""
    if torch_has_cuda():
        return None
    path = library_path()
    if path.exists():
        return path
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        raise FakeCudaError(
            f"the dry run compiles a small C++ library (its fake CUDA device) and needs a C++ compiler; "
            f"{compiler!r} is not on PATH (install g++ or set CXX)"
        )
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FakeCudaError(f"cannot create {path.parent} for the fake CUDA device ({e.strerror}); "
                            f"set CANZONA_CACHE_DIR to a writable folder") from None
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src, out = Path(tmp) / "fakecuda.cpp", Path(tmp) / "fakecuda.so"
        src.write_text(SOURCE)
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        cmd = [compiler, "-shared", "-fPIC", "-O1", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
        cmd += [f"-I{p}" for p in include_paths()] + [str(src), "-o", str(out)]
        cmd += [f"-L{p}" for p in library_paths()] + ["-lc10", "-ltorch_cpu"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:300])
            raise FakeCudaError(f"compiling the fake CUDA device failed ({' '.join(cmd[:1])}): {first}")
        os.replace(out, path)
    return path


def preload(path: str | os.PathLike | None) -> None:
    """Load the library into this process before torch (call first thing in a fresh process);
    None (a CUDA build of torch) loads nothing."""
    global _loaded
    if path is None or _loaded == str(path):  # a zygote's child: loaded before the fork
        return
    if "torch" in sys.modules:
        raise FakeCudaError("the fake CUDA device must be loaded before torch is imported")
    lib = torch_lib_dir()
    for name in ("libc10.so", "libtorch_cpu.so"):  # the library's dependencies, by torch's own path
        ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)
    handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    if handle.canzona_fake_cuda_active() != 1:  # torch's hooks were fetched before ours registered
        raise FakeCudaError(f"{path} was loaded but torch does not use its CUDA hooks")
    _loaded = str(path)
