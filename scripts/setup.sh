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
