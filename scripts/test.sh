#!/usr/bin/env bash
# Set up and run the test suite but the `paper` marker: lint, fast unit tests, the
# multi-process (gloo) tests, the Slurm tests against a real local controller and the browser
# test of the report (tests/README.md; measured times: docs/results.md).
# For the fast inner loop use plain `pytest` (slow tests are deselected by default). The paper
# acceptance (`pytest -m paper`: the dry run of every trial of the paper profile and the authors'
# ladder at Qwen3-32B on 256 GPUs, about 28 min on 2 cores) is a CI step of its own (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh
bash scripts/services.sh install
"$PY" -m ruff check .
trap 'bash slurm/dev-cluster.sh down >/dev/null 2>&1 || true' EXIT
"$PY" -m pytest -m "(slow or not slow) and not paper" -p no:cacheprovider "$@"
bash slurm/dev-cluster.sh down
