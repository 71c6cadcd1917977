"""Peers as methods (`canzona.peers`): their config checks, the refusals of what the harness
cannot do with someone else's code, and the summary their rows make."""

from __future__ import annotations

import pytest

from canzona.config import id_dict, load_config
from canzona.errors import ConfigError
from canzona.peers import PEERS
from canzona.peers.trial import check_rows, complete_row, peer_summary
from canzona.records import STEP_FIELDS


def test_every_peer_is_a_method_choice_with_no_strategy_pair() -> None:
    for name, peer in PEERS.items():
        cfg = load_config([f"method={name}", "parallel.dp=2", f"optimizer={'muon' if peer.matrix else 'adamw'}"])
        assert cfg.method.peer and cfg.method.label == name
        assert cfg.method.dp is None and cfg.method.tp is None and cfg.method.rung is None


@pytest.mark.parametrize(("args", "says"), [
    (["method=torchtitan_distmuon", "parallel.tp=2"], "parallel.tp=2 is not allowed"),
    (["method=megatron_zero1"], "runs adamw: optimizer.name=muon"),
    (["method=megatron_layerwise", "optimizer=soap"], "runs muon: optimizer.name=soap"),
    (["method=megatron_layerwise", "peer.tp_mode=rowwise"], "peer.tp_mode='rowwise' is not allowed"),
    (["method=megatron_layerwise", "method.dp=ddp"], "method.dp / method.tp are not allowed"),
    (["method=megatron_layerwise", "model=qwen3-30b-a3b"], "is MoE"),
    (["method=megatron_layerwise", "parallel.tp=3"], "parallel.tp=3"),
])
def test_what_a_peer_cannot_run_is_refused_in_one_line(args: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        load_config(args)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_peer_keys_leave_every_earlier_trial_id_unchanged() -> None:
    ids = id_dict(load_config(["method=canzona"]).to_dict())
    assert "peer" not in ids or not ids["peer"]
    moved = id_dict(load_config(["method=megatron_layerwise", "peer.tp_mode=duplicated"]).to_dict())
    assert moved["peer"] == {"tp_mode": "duplicated"}


def test_the_harness_does_not_plan_project_or_dry_run_a_peer() -> None:
    from canzona.plan.from_config import make_plan
    from canzona.sim.simulate import project

    cfg = load_config(["method=megatron_layerwise", "parallel.dp=2"])
    for call in (lambda: make_plan(cfg, device="cpu"), lambda: project(cfg, "h100")):
        with pytest.raises(ConfigError, match="is a peer that plans inside its own code"):
            call()


def _row(rank: int, step: int, **times: float | None) -> dict:
    return complete_row({"rank": rank, "step": step, "measured": step >= 1, "dp_rank": rank, "tp_rank": 0,
                         "iteration_ms": 10.0 + rank + step, "optimizer_step_ms": 2.0 * (rank + 1), **times})


def test_a_peer_summary_takes_the_max_over_ranks_and_keeps_unexposed_phases_null() -> None:
    cfg = load_config(["method=torchtitan_distmuon", "parallel.dp=2", "train.warmup=1", "train.steps=2"])
    rows = [_row(r, s, loss=1.0 + s) for r in range(2) for s in range(3)]
    check_rows(rows, cfg)
    assert set(STEP_FIELDS) <= set(rows[0])
    s = peer_summary(cfg, rows, {"versions": {"torchtitan": "0.3.0"}, "shim": None})
    assert s["iteration_ms_median"] == pytest.approx((12 + 13) / 2)  # rank 1's, steps 1 and 2
    assert s["optimizer_step_ms_median"] == 4.0
    assert s["param_sync_ms_median"] is None and s["grad_reduce_ms_p90"] is None
    assert s["plan"] is None and s["peer"]["follows"] == PEERS["torchtitan_distmuon"].follows
    assert s["versions"]["peer_torchtitan"] == "0.3.0" and s["final_loss"] == 3.0


def test_a_peer_that_lost_a_rank_step_is_a_failed_trial() -> None:
    cfg = load_config(["method=torchtitan_distmuon", "parallel.dp=2", "train.warmup=0", "train.steps=2"])
    rows = [_row(r, s) for r in range(2) for s in range(2)][:-1]
    with pytest.raises(RuntimeError, match="reported 3 of 4"):
        check_rows(rows, cfg)


@pytest.mark.parametrize("cluster", ["simulate", "dryrun"])
def test_a_sweep_refuses_peers_on_a_cluster_that_cannot_run_them(cluster: str, tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "sweeps" / "run.py"), "sweep=qwen3_scaling", "profile=peers",
                        f"cluster={cluster}", f"results={tmp_path / 'r'}"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "is a peer (its own code)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_peer_is_one_slurm_task_on_one_node() -> None:
    """A peer starts its own ranks: its Slurm job is one task with every rank's CPUs (and a GPU
    per rank), and a world larger than a node is refused in one line (tests/e2e/test_sweep_slurm.py
    runs one on the dev cluster)."""
    from canzona.errors import ConfigError
    from canzona.sweep.jobshape import JobShape, slurm_shape
    from canzona.sweep.settings import SlurmSettings

    cfg = load_config(["method=megatron_layerwise", "parallel.dp=2", "parallel.tp=2"])
    assert slurm_shape(cfg, SlurmSettings(cpus_per_task=3)) == JobShape(1, 1, 0, 12)
    assert slurm_shape(cfg, SlurmSettings(gpus_per_node=8)) == JobShape(1, 1, 4, 4 * SlurmSettings().cpus_per_task)
    with pytest.raises(ConfigError, match="starts its 4 ranks on one node; slurm.gpus_per_node=2 is fewer"):
        slurm_shape(cfg, SlurmSettings(gpus_per_node=2))


@pytest.mark.parametrize("bad", [["method=torchtitan_distmuon", "layout=dp2tp1", "optimizer.ns_dtype=float32"],
                                 ["method=megatron_layerwise", "layout=dp2tp1", "optimizer.ns_coefficients=[3.0,-3.0,1.0]"]])
def test_a_sweep_refuses_what_a_peer_would_refuse_before_anything_runs(bad: list[str], tmp_path) -> None:
    """The peer's own checks run when the sweep expands, not an hour later in its job."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "sweeps" / "run.py"), "sweep=qwen3_scaling", "profile=peers", *bad,
                        f"results={tmp_path / 'r'}"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert bad[-1].split("=")[0] in r.stderr and not (tmp_path / "r").exists()
