"""Every trial of the ``paper`` profile of sweeps/configs/qwen3_scaling.yaml passes the dry run for
rank 0 and the last rank: its code runs on fake CUDA at full size and scale (up to 256 ranks,
4096-token sequences), and both ranks fit the device memory the trial names
(``dist.dry_run_memory_gb``, default 80 GiB).

One test over all trials (expanding the profile at collection time would slow every pytest run
down): 20-100 s a trial on two cores, about an hour in all; the failure lists every trial that
does not pass, with its ranks' peaks."""

from __future__ import annotations

import pytest

from canzona.sweep.expand import build_plan
from canzona.trial.dryrun import dry_run_trial
from canzona.trial.dryrun.report import GIB

pytestmark = pytest.mark.slow


@pytest.mark.timeout(4 * 3600)
def test_every_paper_trial_passes_the_dry_run() -> None:
    failed = []
    for trial in build_plan(["sweep=qwen3_scaling", "profile=paper"]).trials:
        report = dry_run_trial(trial.cfg, "first,last")
        peaks = ", ".join(f"rank {r['rank']} {r['memory']['peak_bytes'] / GIB:.1f}" for r in report["ranks"])
        print(f"{trial.id}: peak GiB {peaks}; {len(report['errors'])} errors", flush=True)
        failed += [f"{trial.id}: {e}" for e in report["errors"]]
    assert not failed, "\n".join(failed)
