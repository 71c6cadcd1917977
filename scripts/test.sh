#!/usr/bin/env bash
# Set up and run the test suite but the `paper` marker: lint, fast unit tests, the
# multi-process (gloo) tests, the Slurm tests against a real local controller and the browser
# test of the report (tests/README.md; measured times: docs/results.md).
# For the fast inner loop use plain `pytest` (slow tests are deselected by default). The paper
# acceptance (`pytest -m paper`: the dry run of every trial of the paper profile and the authors'
# ladder at Qwen3-32B on 256 GPUs and the paper_projection sweep, about 14 min on 2 cores) is a CI step of
# its own (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh
bash scripts/services.sh install
"$PY" -m ruff check .
trap 'bash slurm/dev-cluster.sh down >/dev/null 2>&1 || true' EXIT
# Every test but `paper` and `peers`, as `pytest -m "(slow or not slow) and not paper and not
# peers"`, on one worker per core, at most 4 (pytest-xdist). The Slurm tests share one worker (one
# session brings the dev cluster up and down), as do the users of the one quick calibration and two-trial sweep
# (tests/e2e/conftest.py: xdist groups, hence --dist loadgroup). The multi-process and end-to-end
# tests start their own ranks beside another worker's test: their timeouts allow for a machine
# loaded twice over (the slow set passed on 2 workers of 2 cores beside 2 other busy processes).
# The `peers` tests (megatron-core 0.19.2 in an environment of its own, made on first use: about
# 1.5 min and 5 GB) run in .ci/run beside `paper`, or alone with `pytest -m peers`.
"$PY" -m pytest -m "(slow or not slow) and not paper and not peers" -n auto --maxprocesses 4 --dist loadgroup \
  -p no:cacheprovider --durations=25 "$@"
bash slurm/dev-cluster.sh down
