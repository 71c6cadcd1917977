"""Scale projection: a per-rank timeline model of the executors, validation (on the hardware
descriptions of `canzona.hardware`).

- `canzona.sim.model`     forward / backward flops and the backward walk that fills buckets.
- `canzona.sim.timeline`  the discrete timeline: a host clock per rank, one comm stream per
  rank and process-group kind, collectives that start when every member issued them.
- `canzona.sim.simulate`  one iteration of any method's plan on that timeline, mirroring
  `canzona.executor` (bucketed grad reduction from backward hooks, the TP micro-group pipeline,
  duplicated TP all-gathers, the param all-gather after the step); `project(cfg, hardware)`,
  `write_trial(cfg, hardware, out)` (records like a measured trial), ``PAPER_CLAIMS``.
- `canzona.sim.validate`  predicted vs measured for recorded trials and sweeps.

Pure Python + numpy: no process groups, no tensors; a 256-rank Qwen3-32B projection takes seconds.
"""
