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
    """Nodes x tasks per node for one trial: one task per rank, whole nodes only."""
    world = cfg.world_size
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
    (`canzona.peers`) runs on this machine only."""
    peer = next((t for t in trials if t.cfg.method.peer), None)
    if peer is not None and s.cluster not in ("local", "debug"):
        why = {"simulate": "projects the harness's programs only",
               "dryrun": "dry-runs the harness's programs only"}.get(
            s.cluster, "starts each rank as a task of its own, and a peer starts its own ranks")
        raise ConfigError(f"trial {peer.id}: method={peer.cfg.method.name} is a peer (its own code) and "
                          f"cluster={s.cluster} {why}; run the peers with cluster=local, or leave them out "
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
