"""A peer's trial: run the peer's ranks (`canzona.peers.PEERS`) and write the records every trial
writes (`canzona.records`), so that sweeps, resume and the report treat it like any method.

The summary has the keys of a measured trial's (`canzona.trial.summary`) with ``plan`` null (a
peer plans inside its own code) and ``peer``: what ran (the code it follows, its versions and
settings, the interpreter) and what the harness changed to run it on this device (``shim``).
A phase the peer does not expose is null in steps.jsonl and in the summary, never estimated.
"""

from __future__ import annotations

import importlib
import platform
import time
from pathlib import Path
from typing import Any

from canzona.config import TrialConfig
from canzona.errors import ConfigError
from canzona.peers import PEERS, PeerRun
from canzona.records import STEP_FIELDS, write_records
from canzona.trial.summary import SUMMARISED, quantiles, versions


def run_peer_trial(cfg: TrialConfig, out: Path) -> dict[str, Any]:
    """Run the peer ``cfg.method.name`` names, write its records into ``out``; its summary."""
    name = str(cfg.method.name)
    peer = PEERS[name]
    module = importlib.import_module(f"canzona.peers.{peer.module}")
    out.mkdir(parents=True, exist_ok=True)
    result: PeerRun = module.run(cfg, out)
    rows = [complete_row(r) for r in result.rows]
    check_rows(rows, cfg)
    summary = peer_summary(cfg, rows, result.meta)
    write_records(out, cfg.to_dict(), rows, summary)
    return summary


def check_peer(cfg: TrialConfig) -> None:
    """What the peer ``cfg.method.name`` would refuse when its trial starts, as a one-line
    ConfigError now: a sweep checks every trial before it launches any (each peer module's
    ``check``; devices are not looked for, a Slurm login node has none)."""
    peer = PEERS[str(cfg.method.name)]
    importlib.import_module(f"canzona.peers.{peer.module}").check(cfg)


def complete_row(row: dict[str, Any]) -> dict[str, Any]:
    """A peer's row with every key of STEP_FIELDS (null where it exposes no such phase) and its
    own extra keys kept."""
    return {**{k: None for k in STEP_FIELDS}, "events": [], **row}


def check_rows(rows: list[dict[str, Any]], cfg: TrialConfig) -> None:
    """Every rank reported every step, with the two times every method has."""
    want = {(rank, step) for rank in range(cfg.world_size) for step in range(cfg.train.warmup + cfg.train.steps)}
    got = {(r["rank"], r["step"]) for r in rows}
    if got != want:
        missing = sorted(want - got)[:5]
        raise RuntimeError(f"method={cfg.method.name}: the peer's ranks reported {len(got)} of {len(want)} "
                           f"(rank, step) rows; missing e.g. {missing}")
    for r in rows:
        if r["iteration_ms"] is None or r["optimizer_step_ms"] is None:
            raise RuntimeError(f"method={cfg.method.name}: rank {r['rank']} step {r['step']} has no "
                               f"iteration_ms / optimizer_step_ms")


def peer_summary(cfg: TrialConfig, rows: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The summary of a peer's trial: the quantiles of a measured trial's (max over ranks per
    step; a key no rank measured stays null), the world, provenance, and what the peer was."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["measured"]:
            by_step.setdefault(r["step"], []).append(r)
    out: dict[str, Any] = {}
    for key in SUMMARISED:
        per_step = [max(v) for rs in by_step.values() if (v := [r[key] for r in rs if r[key] is not None])]
        med, p10, p90 = quantiles(per_step) if per_step else (None, None, None)
        out.update({f"{key}_median": med, f"{key}_p10": p10, f"{key}_p90": p90})
    last = max(by_step) if by_step else None
    losses = [r["loss"] for r in by_step.get(last, []) if r.get("loss") is not None] if last is not None else []
    peer = PEERS[str(cfg.method.name)]
    out.update({
        "peak_memory_mb": meta.get("peak_memory_mb"),
        "world": {"world_size": cfg.world_size, "dp": cfg.parallel.dp, "tp": cfg.parallel.tp,
                  "backend": meta.get("backend"), "device": meta.get("device")},
        "plan": None,
        "peer": {"name": cfg.method.name, "follows": peer.follows, **meta},
        "final_loss": losses[0] if losses else None,
        "versions": {**versions(), **{f"peer_{k}": v for k, v in (meta.get("versions") or {}).items()}},
        "host": platform.node(),
        "device_name": meta.get("device_name") or platform.processor() or platform.machine(),
        "config": cfg.to_dict(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torch_threads": meta.get("torch_threads"),
    })
    return out


def refuse_external_launch(cfg: TrialConfig) -> None:
    """A peer starts its own ranks (in its own interpreter, for Megatron's): it cannot be one rank
    of a torchrun / srun launch."""
    raise ConfigError(f"method={cfg.method.name} is a peer that starts its own ranks: run it without torchrun/srun "
                      f"(python -m canzona.run ..., or a sweep with cluster=local)")
