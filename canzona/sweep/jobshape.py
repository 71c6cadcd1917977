"""Where a trial's ranks go: the Slurm job shape of a trial, and the layout checks a sweep
makes before it launches anything (a trial that cannot be placed is a config error, not a
failed job an hour later)."""

from __future__ import annotations

from dataclasses import dataclass

from canzona.config import TrialConfig
from canzona.errors import ConfigError
from canzona.sweep.settings import SlurmSettings, SweepSettings
from canzona.sweep.trials import SweepTrial


@dataclass(frozen=True)
class JobShape:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int


def slurm_shape(cfg: TrialConfig, s: SlurmSettings) -> JobShape:
    """Nodes x tasks per node for one trial: one task per rank, whole nodes only. A peer
    (`canzona.peers`) starts its own ranks: one task on one node, with a GPU and
    ``slurm.cpus_per_task`` CPUs per rank."""
    world = cfg.world_size
    if cfg.method.peer:
        if s.gpus_per_node and world > s.gpus_per_node:
            raise ConfigError(
                f"method={cfg.method.name} is a peer, which starts its {world} ranks on one node; "
                f"slurm.gpus_per_node={s.gpus_per_node} is fewer (choose dp x tp <= {s.gpus_per_node})"
            )
        return JobShape(1, 1, world if s.gpus_per_node else 0, s.cpus_per_task * world)
    tpn = s.tasks_per_node or (s.gpus_per_node if s.gpus_per_node else world)
    tpn = min(tpn, world)
    if s.gpus_per_node and tpn > s.gpus_per_node:
        raise ConfigError(
            f"slurm.tasks_per_node={tpn} exceeds slurm.gpus_per_node={s.gpus_per_node} (one rank per GPU)"
        )
    if world % tpn:
        raise ConfigError(
            f"dp x tp = {cfg.parallel.dp} x {cfg.parallel.tp} = {world} ranks do not fill whole nodes of "
            f"{tpn} tasks; choose dp x tp a multiple of {tpn} or set slurm.tasks_per_node"
        )
    return JobShape(world // tpn, tpn, s.gpus_per_node if s.gpus_per_node else 0, s.cpus_per_task)


def check_layouts(trials: list[SweepTrial], s: SweepSettings) -> None:
    """Every trial fits the cluster: local rank cap, or a valid Slurm job shape; a peer
    (`canzona.peers`) is measured, never projected or dry-run."""
    peer = next((t for t in trials if t.cfg.method.peer), None)
    if peer is not None and s.cluster in ("simulate", "dryrun"):
        why = {"simulate": "projects the harness's programs only",
               "dryrun": "dry-runs the harness's programs only"}[s.cluster]
        raise ConfigError(f"trial {peer.id}: method={peer.cfg.method.name} is a peer (its own code) and "
                          f"cluster={s.cluster} {why}; measure the peers (cluster=local or slurm), or leave them out "
                          f"(method=...)")
    if s.cluster in ("simulate", "dryrun"):  # any layout can be projected or dry-run here
        return
    for t in trials:
        if s.cluster in ("local", "debug"):
            if t.world_size > s.local.max_ranks:
                raise ConfigError(
                    f"trial {t.id} needs dp x tp = {t.world_size} ranks; cluster={s.cluster} allows at most "
                    f"local.max_ranks={s.local.max_ranks} (raise it, pick a smaller layout, or use cluster=slurm)"
                )
        else:
            try:
                slurm_shape(t.cfg, s.slurm)
            except ConfigError as e:
                raise ConfigError(f"trial {t.id}: {e}") from None
