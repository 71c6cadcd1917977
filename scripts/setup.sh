#!/usr/bin/env bash
# Install the harness and its test tools into the current Python environment.
# torch is pinned to the CPU wheel first when no torch is present: an unpinned `torch`
# requirement would otherwise pull a multi-GB CUDA build on a CPU-only machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[test]"
# The peer method=torchtitan_distmuon (canzona/peers/torchtitan_distmuon.py) runs torchtitan 0.3.0's
# DistMuon from the package index. --no-deps: torchtitan's own requirements (datasets, wandb,
# tensorboard, ...) serve its trainer, not DistMuon; it imports spmd_types and tyro. Skipped when
# the pinned versions are already there.
if ! "$PY" - <<'PY' 2>/dev/null; then
from importlib.metadata import version
import tyro  # noqa: F401
assert version("torchtitan") == "0.3.0" and version("spmd_types") == "0.2.3"
PY
  "$PY" -m pip install -q --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3"
  "$PY" -m pip install -q tyro
fi
