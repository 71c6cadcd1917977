#!/usr/bin/env bash
# The prepared check for the first GPU machine (see tests/dist/test_gpu.py): the CUDA/NCCL path
# (pytest -m gpu), a quick GPU calibration, one short bf16 trial per method and one of the MoE model,
# in a few minutes.
# Missing packages travel as wheels in .whl/ (megatron-core, omegaconf, antlr4, submitit).
# Results go to $OUT (default /tmp/gpu_check): log.txt, the calibrated hardware file, trials.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
run() {  # run NAME SECONDS CMD...: log the command's output and its exit code, go on either way
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOG"
}
run versions 60 python3 -c "import torch, megatron.core, omegaconf; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(), torch.cuda.device_count())"
run pytest-gpu 240 python3 -m pytest -p no:cacheprovider -o addopts= -m gpu -q -rs --timeout=200 \
  tests/dist/test_gpu.py tests/unit/test_timing.py
run calibrate 150 python3 -m canzona.calibrate "out=$OUT/h200-calibrated.yaml" device=cuda quick=true
for m in canzona sync layerwise adamw; do
  run "trial-$m" 75 python3 -m canzona.run model=qwen3-8b model.width_div=4 model.num_layers=4 method=$m \
    dist.device=cuda train.steps=10 train.warmup=3 train.micro_batch=4 train.seq_len=1024 "out=/tmp/gpu_trials/$m"
done
# the MoE layer on CUDA (one GPU: EP 1, the router and the local experts; the dispatch's NCCL
# all-to-alls need EP > 1, i.e. several GPUs)
run trial-moe 90 python3 -m canzona.run model=qwen3-30b-a3b model.width_div=8 model.num_layers=2 model.num_experts=16 \
  model.top_k=4 method=canzona dist.device=cuda train.steps=5 train.warmup=2 train.micro_batch=4 train.seq_len=1024 \
  "out=/tmp/gpu_trials/moe"
python3 - "$OUT/trials.json" <<'PY' >>"$LOG" 2>&1
import json, sys, pathlib
out = {}
for d in sorted(pathlib.Path("/tmp/gpu_trials").glob("*")):
    f = d / "summary.json"
    out[d.name] = json.loads(f.read_text()) if f.exists() else None
pathlib.Path(sys.argv[1]).write_text(json.dumps(out, indent=1, default=str))
print("trials:", {k: (v or {}).get("optimizer_step_ms_median") for k, v in out.items()})
PY
tail -n 60 "$LOG"
