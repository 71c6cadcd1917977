"""``python -m canzona.plan`` on an MoE model: every expert matrix once in ``--json`` with its
owner, the expert buckets and their imbalance in the text; an MoE rank's program with its expert actions; an MoE trial simulated."""

from __future__ import annotations

import json

import pytest

from canzona.plan.__main__ import main

SMALL = ["model=qwen3-30b-a3b", "model.width_div=16", "model.num_layers=2", "model.num_experts=8", "model.top_k=2",
         "parallel.dp=4", "parallel.ep=2", "bucket.expert_size=30000", "planner.cost=flops"]


def test_json_lists_every_expert_matrix_once_with_its_owner(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "method=canzona", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    experts = [p for p in doc["params"] if p.get("expert") is not None]
    names = [p["name"] for p in experts]
    assert len(names) == len(set(names)) == 2 * 8 * 2
    for p in experts:
        assert p["ep_rank"] == p["expert"] // 4 and 0 <= p["dp_owner"] < 2
        assert len(p["ranks"]) == 1 and p["ranks"][0] % 2 == p["ep_rank"]  # global rank = ep_rank + 2·edp_rank
    ex = doc["experts"]
    assert (ex["ep"], ex["edp"], ex["etp"]) == (2, 2, 1) and len(ex["buckets"]) == 2
    assert ex["imbalance"]["compute"] >= 1.0 and ex["step_compute_imbalance"] >= 1.0


def test_text_shows_expert_buckets_and_imbalance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "method=atomic"]) == 0
    out = capsys.readouterr().out
    assert "experts: ep=2 expert-tp=1 expert-dp=2" in out
    assert "expert imbalance over each expert-DP group" in out and "widest shard" in out


def test_program_of_an_moe_rank_shows_its_expert_actions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--program", "1"]) == 0
    out = capsys.readouterr().out
    assert "expert grad_reduce b0" in out and "edp" in out and "mlp.experts.linear_fc1.weight" in out


def test_an_moe_trial_is_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    from canzona.sim.simulate import main as sim_main

    assert sim_main([*SMALL, "hardware=h100"]) == 0
    out = capsys.readouterr().out
    assert "dp=4 tp=1 ep=2 on h100 (projected)" in out and "backward" in out
