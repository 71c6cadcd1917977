"""Canzona harness: distributed matrix-based optimizers under Megatron-style DP x TP."""

from pathlib import Path

#: The checkout this package was imported from. Processes the harness starts elsewhere (a
#: forkserver, a Slurm job) put it first on ``PYTHONPATH`` so they run this code, not another
#: installed copy of ``canzona``.
CHECKOUT = Path(__file__).resolve().parents[1]


def pythonpath_with_checkout(current: str | None) -> str:
    """``PYTHONPATH`` with this checkout first (kept once)."""
    import os

    parts = [p for p in (current or "").split(os.pathsep) if p and p != str(CHECKOUT)]
    return os.pathsep.join([str(CHECKOUT), *parts])
