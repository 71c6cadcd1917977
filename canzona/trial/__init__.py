"""One trial of the harness, split by job (``python -m canzona.run`` is the command line):

- `env`      where this process sits in a launch (torchrun / Slurm / submitit variables);
- `launch`   starting the trial's ranks locally, or joining an external launch as one rank;
- `verdict`  under an external launch, rank 0's check of ``out`` handed to every rank;
- `rank`     one rank: set up, run the steps, gather the rows;
- `summary`  the trial's aggregates (summary.json);
- `trace`    the Chrome trace of the measured steps (trace.json).

The records the trial writes, and their writer, are `canzona.records`'.

Importing this package imports nothing heavy: torch and megatron-core load in the ranks.
"""
