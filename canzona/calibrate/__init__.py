"""Calibrate a hardware file on this machine: ``python -m canzona.calibrate out=hardware/NAME.yaml``.

Measures, on ``device`` (auto: the GPU when one is visible, else the CPU), with ``threads``
torch threads per process (default 1, as the local sweep's ranks):

- each matrix optimizer's update (Muon, Shampoo, SOAP via `canzona.optim`) per full matrix
  shape of the Qwen3 family -- the shapes of the local sweep first (read from
  sweeps/configs/qwen3_scaling.yaml), then the family scaled by ``width_divs``, then full-size
  shapes while the time budget lasts -- in the steady state (no preconditioner refresh) at
  batch 1 and, for small shapes, batch 4 (a call over 4 matrices, each still computed alone,
  separates the per-call overhead from the per-matrix time: a call costs
  overhead + count·slope), plus the refresh step where it is affordable (else scaled from the
  measured eigendecomposition rate);
- elementwise AdamW (per element and per tensor), the apply step, buffer copies, matmul rates;
- every collective the executors use (all_reduce, reduce_scatter, all_gather, all_to_all,
  broadcast, reduce) between 2 local processes at a few sizes -- over gloo on a CPU, over NCCL
  between two GPUs -- fitted to latency + volume / bandwidth, and how much async communication
  overlaps compute. With one GPU visible there is nothing to measure between: the collectives
  (and overlap) of the matching spec-derived hardware file are kept (``spec=auto`` matches the
  device's name; ``spec=h100|h200|a100`` names one, ``spec=none`` writes placeholders), and the
  file says so (``source``, ``notes``, ``calibration.collectives_source``);
- forward / backward of the Qwen3 model (`canzona.model`) at a few sizes, fitted to
  fixed + layers·per-layer + flops / rate (skipped with ``quick=true``: estimated from the
  matmul rate instead, marked so in the file).

On a GPU every time is CUDA-event time on the stream (see `canzona.calibrate.clock`).

Keys: ``out=PATH`` (required), ``name=`` (default: the file stem), ``quick=true`` (under a
minute on a 2-core CPU, about a minute on a GPU), ``budget_s=`` (optimizer timing budget, default 30; quick 3),
``threads=1``, ``width_divs=8,16,32``, ``optimizers=muon,shampoo,soap``, ``collectives=true``,
``model=`` (default: not quick), ``precondition_frequency=10``, ``device=auto|cpu|cuda``,
``spec=auto|none|h100|h200|a100``, ``repeats=1`` (calibrate that many times in a row, keep the
median of each number: `repeat`). Unknown keys are refused.
Everything is written to one YAML file in the format of `canzona.hardware`;
`canzona.cost.load_measured` reads its ``updates`` table for ``planner.cost=measured``.

Modules: `settings` (the command line), `shapes` (what to time), `clock` (timing a call on the
device), `compute` (maths), `comm` (collectives), `model_pass` (forward / backward), `workers`
(the processes), `fit` (the fits), `build` (the run and the hardware file), `repeat` (several
runs as one). Apart from that CLI,
`cache` and `kernels` keep the planner's own calibration: the shapes a plan needs, timed on
demand into a per-machine cache outside the repository (``planner.cost=auto``, the default).
"""

from canzona.calibrate.build import calibrate, write_hardware
from canzona.calibrate.fit import fit_link, fit_pass
from canzona.calibrate.settings import Options, parse_args
from canzona.calibrate.shapes import calibration_shapes, local_sweep_models, local_sweep_shapes

__all__ = [
    "Options", "calibrate", "calibration_shapes", "fit_link", "fit_pass", "local_sweep_models",
    "local_sweep_shapes", "parse_args", "write_hardware",
]
