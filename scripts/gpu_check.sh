#!/usr/bin/env bash
# The prepared check for a GPU machine (one GPU is enough), in about nine minutes:
#   1. versions and the GPU's clocks;
#   2. one tiny bf16 trial on CUDA -- the gate: if it fails, the sweep is skipped (it would fail
#      the same way) and the CUDA tests below say why;
#   3. the GPU's own calibration (python -m canzona.calibrate device=cuda quick=true model=true:
#      Muon per full-size shape, the model's forward/backward timed; the collectives are the
#      spec-derived file's, as one GPU has nothing to measure between);
#   4. the measured sweep `sweep=qwen3_scaling profile=gpu` (Qwen3-0.6B and Qwen3-8B x 4 layers
#      at full width, every method once) whose report predicts the trials with that calibration;
#      its results come back as gpu_results.tgz, to validate here against the spec-derived file
#      too: python -m canzona.sim.validate RESULTS/qwen3_scaling hardware=h200;
#   (the CUDA/NCCL tests, pytest -m gpu, run before the sweep: they are short, the sweep is last
#   so that a lease running out cuts the least).
# Missing packages travel as wheels in .whl/ (megatron-core, omegaconf, antlr4, submitit; see docs/usage.md).
# Results go to $OUT (default /tmp/gpu_check): log.txt, gpu-calibrated.yaml, gpu_results.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
RESULTS=${RESULTS:-/tmp/gpu_results}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
run() {  # run NAME SECONDS CMD...: log the command's output and its exit code; returns that code
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOG"
  return $rc
}
run versions 60 python3 -c "import torch, omegaconf, submitit, megatron.core; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(), torch.cuda.device_count())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv >>"$LOG" 2>&1
cuda_tests() {
  run pytest-gpu 100 python3 -m pytest -p no:cacheprovider -o addopts= -m gpu -q -rs -x --timeout=90 \
    tests/dist/test_gpu.py tests/unit/test_timing.py
}
if run gate 90 python3 -m canzona.run model=qwen3-0.6b model.width_div=8 model.num_layers=2 method=canzona \
  dist.device=cuda train.steps=3 train.warmup=1 train.seq_len=256 out=/tmp/gpu_gate; then
  HW="$OUT/gpu-calibrated.yaml"
  run calibrate 150 python3 -m canzona.calibrate "out=$HW" device=cuda quick=true model=true budget_s=25 \
    width_divs=1 optimizers=muon \
    || HW=h200
  cuda_tests
  # one run per trial: a run costs 35-45 s on an H200 in a gVisor sandbox (torch, CUDA and NCCL
  # start in each), so the profile's two repetitions would not fit a 15-minute device lease
  run sweep 380 python3 sweeps/run.py sweep=qwen3_scaling profile=gpu repeats=1 "results=$RESULTS" "sim.hardware=$HW"
  tar -czf "$OUT/gpu_results.tgz" -C "$RESULTS" . 2>>"$LOG"
else
  cuda_tests
fi
tail -n 40 "$LOG"
