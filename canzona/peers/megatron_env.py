"""The Megatron peers' own Python environment: megatron-core 0.19.2 with emerging-optimizers 0.3.0.

megatron-core 0.19.2 and emerging-optimizers 0.3.0 need Python >= 3.12 and a megatron-core that
the harness's own environment (0.16.1) cannot be, so `megatron_layerwise` and `megatron_zero1`
run their worker (`canzona.peers.megatron_worker`) in a virtual environment of their own, made
from the package index on first use:

- where: ``$CANZONA_PEER_ENV`` if set, else ``<checkout>/.peers/megatron-core-0.19.2/``;
- what: `PINS` (torch 2.13.0: for Python 3.12 the index serves its CUDA build, whose CPU kernels
  are those of the CPU build; about 5 GB and a minute or two);
- once: a file lock beside the folder makes concurrent trials create it once, and a marker
  file written last (``canzona-peer.json``: the pins and the installed versions) tells a whole
  environment from a half-made one, which is removed and made again.

``python -m canzona.peers.megatron_env`` creates it (if needed) and prints its interpreter's
path: the setup and CI step. This module needs only the standard library and filelock.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from canzona.cli import refuse
from canzona.errors import ConfigError

MEGATRON_CORE = "0.19.2"
PINS = (
    f"megatron-core=={MEGATRON_CORE}",
    "emerging-optimizers==0.3.0",
    "torch==2.13.0",
    "numpy",
)
MIN_PYTHON = (3, 12)
MARKER = "canzona-peer.json"
ENV_VAR = "CANZONA_PEER_ENV"
# The import names whose versions the records carry (`peer_versions`).
_VERSIONS_SCRIPT = """
import json, sys
from importlib import metadata
out = {"python": ".".join(map(str, sys.version_info[:3]))}
for dist in ("megatron-core", "emerging-optimizers", "torch", "numpy"):
    try:
        out[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        out[dist] = None
import torch, megatron.core, emerging_optimizers  # noqa: F401  (the environment imports)
out["torch_cuda"] = torch.version.cuda
print(json.dumps(out))
"""


def checkout() -> Path:
    """The harness checkout this module lives in."""
    return Path(__file__).resolve().parents[2]


def env_dir() -> Path:
    """Where the peer environment lives: ``$CANZONA_PEER_ENV``, else ``<checkout>/.peers/megatron-core-0.19.2``."""
    given = os.environ.get(ENV_VAR)
    return Path(given).expanduser().resolve() if given else checkout() / ".peers" / f"megatron-core-{MEGATRON_CORE}"


def _env_python(root: Path) -> Path:
    return root / "bin" / "python"


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_base_python() -> str:
    """A Python >= 3.12 with ``venv`` to make the environment from: ``$CANZONA_PEER_PYTHON``, this
    interpreter, ``python3.12`` / ``python3.13`` on PATH, then pyenv's versions. ConfigError if none."""
    candidates: list[str] = []
    if os.environ.get("CANZONA_PEER_PYTHON"):
        candidates.append(os.environ["CANZONA_PEER_PYTHON"])
    candidates.append(sys.executable)
    for name in ("python3.12", "python3.13"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    # 3.12 first: the version the peers were checked with
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.1[2-9]*", "bin", "python")))
    for python in candidates:
        version = _version_of(python)
        if version is not None and version >= MIN_PYTHON:
            return python
    raise ConfigError(
        "the Megatron peers need Python >= 3.12 (megatron-core 0.19.2 requires it) and none was found: install "
        "python3.12 (e.g. `apt-get install python3.12 python3.12-venv` or `pyenv install 3.12`), or set "
        "CANZONA_PEER_PYTHON to one")


def _read_marker(root: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("pins") != list(PINS) or not _env_python(root).exists():
        return None
    return marker


def _run(cmd: list[str], what: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stdout + out.stderr).strip().splitlines()[-30:]
        raise RuntimeError(f"{what} failed (exit {out.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))
    return out.stdout


def _create(root: Path) -> None:
    base = find_base_python()
    print(f"canzona: creating the Megatron peers' environment {root} (Python >= 3.12 from {base}; pip install "
          f"{' '.join(PINS)} from the package index: about 5 GB, a few minutes, once)", file=sys.stderr, flush=True)
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    _run([base, "-m", "venv", str(root)], "making the peer venv")
    python = str(_env_python(root))
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
         "installing the Megatron peers' packages")
    versions = json.loads(_run([python, "-c", _VERSIONS_SCRIPT], "importing the peer packages").strip().splitlines()[-1])
    tmp = root / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"pins": list(PINS), "versions": versions}, indent=1))
    tmp.replace(root / MARKER)  # last: a folder without it is half-made


def peer_python(create: bool = True) -> Path:
    """The peer environment's interpreter, creating the environment first when it is missing or
    half-made (under a file lock: concurrent callers create it once). With ``create=False`` a
    missing environment is a ConfigError naming the command that makes it."""
    root = env_dir()
    if _read_marker(root) is not None:
        return _env_python(root)
    if not create:
        raise ConfigError(f"the Megatron peers' environment {root} is not made yet: run "
                          f"`python -m canzona.peers.megatron_env`")
    from filelock import FileLock

    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if _read_marker(root) is None:  # another process may have made it while this one waited
            _create(root)
    return _env_python(root)


def peer_versions() -> dict[str, Any]:
    """The versions installed in the peer environment (python, megatron-core, emerging-optimizers,
    torch and its CUDA), as recorded when it was made; {} if it is not made."""
    marker = _read_marker(env_dir())
    return dict(marker["versions"]) if marker else {}


def main() -> int:
    try:
        print(peer_python())
    except ConfigError as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
