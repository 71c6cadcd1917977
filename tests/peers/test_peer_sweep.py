"""A sweep with peers, as a user runs `profile=peers`: every peer's trial runs through the local
sweep beside a harness method, writes the records every trial writes, the report sets the peers
beside their mirrors, and a rerun resumes with nothing to redo."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.peers]

REPO = Path(__file__).resolve().parents[2]
SWEEP = """
    description: the peers beside their mirrors, tiny
    fixed:
      model.name: qwen3-0.6b
      model.width_div: 16
      model.num_layers: 2
      parallel.dp: 2
      dist.device: cpu
      dist.threads_per_rank: 1
      train.steps: 3
      train.warmup: 1
      train.micro_batch: 1
      train.seq_len: 16
      train.dtype: bf16
      optimizer.ns_dtype: bfloat16
      peer.tp_mode: duplicated
    grid:
      method: [layerwise_sharded, megatron_layerwise, torchtitan_distmuon]
    sweep:
      cluster: local
"""


def test_a_sweep_runs_the_peers_beside_their_mirrors_and_resumes(tmp_path: Path) -> None:
    from canzona.peers.megatron_env import peer_python

    peer_python()  # the environment first (about 1.5 min when missing), so the trial's timeout is its own
    (tmp_path / "peers.yaml").write_text(textwrap.dedent(SWEEP))
    command = [sys.executable, str(REPO / "sweeps" / "run.py"), f"sweep={tmp_path / 'peers.yaml'}",
               f"results={tmp_path / 'results'}"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    folder = tmp_path / "results" / "peers"
    summaries = {json.loads(p.read_text())["config"]["method"]["name"]: json.loads(p.read_text())
                 for p in folder.glob("*/summary.json")}
    assert set(summaries) == {"layerwise_sharded", "megatron_layerwise", "torchtitan_distmuon"}
    megatron, titan = summaries["megatron_layerwise"], summaries["torchtitan_distmuon"]
    assert megatron["versions"]["peer_megatron-core"] == "0.19.2" and megatron["plan"] is None
    assert megatron["peer"]["settings"]["tp_mode"] == "duplicated" and megatron["peer"]["shim"]
    assert titan["versions"]["peer_torchtitan"] == "0.3.0"
    for s in summaries.values():
        assert s["iteration_ms_median"] > 0 and s["optimizer_step_ms_median"] > 0
    for trial in folder.glob("*-megatron_layerwise-*"):
        rows = [json.loads(line) for line in (trial / "steps.jsonl").read_text().splitlines()]
        assert sorted({(r["rank"], r["step"]) for r in rows}) == [(r, s) for r in range(2) for s in range(4)]
    report = (folder / "report" / "index.html").read_text()
    assert "Peers" in report and "megatron_layerwise" in report and "layerwise_sharded" in report
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert again.returncode == 0 and "0 to run" in again.stdout + again.stderr, again.stdout[-2000:]
