"""Run a sweep: ``python sweeps/run.py sweep=qwen3_scaling [key=value ...]`` (``list`` to see
the sweeps, ``--help`` for the keys). The work is done by `canzona.sweep.cli`."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from canzona.sweep.cli import main  # noqa: E402

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... list | head` ends quietly, as other Unix tools do
    sys.exit(main())
