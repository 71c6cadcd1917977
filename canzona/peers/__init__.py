"""Peers: the field's own implementations run as methods beside the harness's strategies.

A peer is not a DP and a TP strategy: it is someone else's code (megatron-core's optimizers,
torchtitan's DistMuon) that plans, communicates and steps on its own. The harness gives it the
same model shapes, synthetic data, seed, warm-up and measured steps, and times it by the same
definitions (docs/design.md §6); what it cannot expose is recorded as null, never guessed.

Each peer is one module with ``run(cfg, out) -> PeerRun`` (its ranks' rows, one per rank per
step with the keys of `canzona.records.STEP_FIELDS`, and what it was: versions, settings, what
the CPU shim changes). `canzona.peers.trial` turns that into the same records every trial writes.

This module imports nothing but the standard library: the command line checks a peer method
without loading torch, and a peer's worker may run in another interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Peer(NamedTuple):
    module: str  # canzona.peers.<module>: run(cfg, out) -> PeerRun
    follows: str  # the code it runs, with the version
    summary: str
    dp_only: bool  # no Megatron TP: parallel.tp > 1 is refused
    matrix: bool  # runs the matrix optimizer (Muon); False: AdamW


PEERS: dict[str, Peer] = {
    "megatron_layerwise": Peer(
        "megatron", "megatron-core 0.19.2 LayerWiseDistributedOptimizer + TensorParallelMuon (emerging-optimizers 0.3.0)",
        "Megatron's own layer-wise Muon: shard-aligned buffer, reduce-scatter, owned params, all-gather; "
        "TP by peer.tp_mode", dp_only=False, matrix=True),
    "megatron_zero1": Peer(
        "megatron", "megatron-core 0.19.2 DistributedOptimizer (AdamW)",
        "Megatron's own distributed optimizer with AdamW: the yardstick from Megatron itself",
        dp_only=False, matrix=False),
    "torchtitan_distmuon": Peer(
        "torchtitan_distmuon", "torchtitan 0.3.0 DistMuon (FSDP2)",
        "FSDP2 with DistMuon: each matrix owned whole by one rank, all-to-all to the owners", dp_only=True,
        matrix=True),
}

# Megatron's TensorParallelMuon modes (megatron-core 0.19's muon_tp_mode).
TP_MODES = ("duplicated", "distributed", "blockwise")


@dataclass
class PeerRun:
    """What a peer's ranks measured: ``rows`` as steps.jsonl holds them (keys of STEP_FIELDS;
    null where the peer exposes no such phase) and ``meta`` (``versions``, ``settings``,
    ``shim``: what the CPU shim changes or None, ``env``: the interpreter it ran in)."""

    rows: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)


def is_peer(method: str | None) -> bool:
    return method in PEERS
