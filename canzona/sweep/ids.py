"""Trial ids and run folder names.

A *trial* is one resolved config; its id is a readable prefix plus a hash of that config, so
the same trial gets the same folder whatever sweep, sweep profile or command line produced it,
and a changed value makes a new one (a renamed key does not: it is hashed under its old name).
A *run* is one repetition of a trial (sweep setting ``repeats``): repetition 1 lives in the
folder named by the trial id, repetition k > 1 in ``<trial id>-r<k>``, so raising ``repeats``
later keeps every run already recorded.
"""

from __future__ import annotations

import hashlib
import json

from canzona.config import TrialConfig, id_dict


def trial_id(cfg: TrialConfig) -> str:
    """Readable prefix + 10 hex digits of the sha256 of the resolved config (``out`` excluded;
    renamed keys under their old names, `canzona.config.id_dict`: a rename keeps every id)."""
    d = id_dict(cfg.to_dict())
    d.pop("out", None)
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    h = hashlib.sha256(blob.encode()).hexdigest()[:10]
    model = cfg.model.name.removeprefix("qwen3-")
    ep = f"ep{cfg.parallel.ep}" if cfg.parallel.ep > 1 else ""
    return f"{model}-{cfg.method.label}-{cfg.optimizer.name}-dp{cfg.parallel.dp}tp{cfg.parallel.tp}{ep}-{h}"


def run_id(trial: str, repeat: int) -> str:
    """The folder of repetition ``repeat`` (1-based) of trial ``trial``."""
    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1")
    return trial if repeat == 1 else f"{trial}-r{repeat}"

