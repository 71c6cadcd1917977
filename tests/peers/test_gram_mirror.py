"""The TP strategy ``gram_allreduce`` against the code it mirrors: megatron-core 0.19.2's
``TensorParallelMuon`` with ``muon_tp_mode="distributed"`` (emerging-optimizers 0.3.0's
``newton_schulz_tp``), run in the peer environment by ``megatron_gram.py`` on 2 gloo ranks.

For the matrices of one Qwen3 layer (fused QKV and fc1 column-parallel, proj and fc2
row-parallel; QKV also split into q, k, v per query group, Megatron's ``split_qkv``, which is
the harness's ``model.split_fused`` for QKV -- the harness also splits fc1's gate and up, which
Megatron does not, so fc1 is compared whole), per TP rank:

- the collectives: Megatron's all-reduces (elements, dtype), in order, are those the harness's
  program lists for that matrix (`GramCompute.calls`) and those its executor's maths makes
  (`MatrixUpdates.shard_directions` with a recording sum);
- the update: the harness's maths on the same shard (emulated TP: one thread per rank, a sum
  over the two ranks' tensors, which in fp32 is the same number in either order) equals
  Megatron's bit for bit. It can, because the arithmetic is the same operation for operation:
  the transpose from the partition dim, the sum of squares all-reduced then ``x / sqrt(.)``
  clamped, ``X Xᵀ`` all-reduced, the two ``addmm`` with the "simple" coefficients (the
  harness's), and the shape scale (``shape_scaling`` = ``lr_adjust=original``); momentum 0
  without Nesterov passes the gradient through exactly on both sides (``lerp`` at weight 1).
  A tolerance would be needed at TP > 2 (sums of 3+ terms in another order): then the bound of
  tests/dist/test_gram_parity.py applies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.peers]

TP = 2
MODEL = ["model=qwen3-0.6b", "model.width_div=32", "model.num_layers=1", f"parallel.tp={TP}",
         "method=layerwise_sharded_gram", "optimizer=muon", "optimizer.momentum=0.0", "optimizer.nesterov=false"]


@pytest.fixture(scope="session")
def peer_python() -> Path:
    from canzona.peers.megatron_env import peer_python as make

    return make()


def _lockstep(shards, fn):
    """tests/unit/test_gram_allreduce.py's emulated TP: one thread per shard, sums over them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    try:
        from test_gram_allreduce import lockstep
    finally:
        sys.path.pop(0)
    return lockstep(shards, fn)


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split_qkv"])
def test_mirror_makes_megatrons_all_reduces_and_update(peer_python, tmp_path, split: bool) -> None:
    from canzona.config import load_config
    from canzona.cost import NumelCost
    from canzona.optim.owner import MatrixUpdates
    from canzona.plan.from_config import make_plan
    from canzona.program.actions import GramCompute
    from canzona.program.lower import lower

    cfg = load_config([*MODEL, f"model.split_fused={str(split).lower()}"])
    mcfg = cfg.model_cfg()
    plan = make_plan(cfg, device="cpu", cost_model=NumelCost())
    grams = {a.items[0]: a for prog in lower(plan) for a in prog.actions if isinstance(a, GramCompute)}
    # split: the QKV only (Megatron splits no fc1); whole: every matrix of the layer
    chosen = [i for i in sorted(grams) if not split or plan.params[i].name.endswith("linear_qkv.weight")]
    qkv_split = [mcfg.q_per_group * mcfg.head_dim, mcfg.head_dim, mcfg.head_dim]
    job = {"tp": TP, "ns_steps": cfg.optimizer.ns_steps, "out": str(tmp_path), "matrices": [
        {"name": plan.params[i].name, "shape": list(plan.params[i].shape), "partition_dim": plan.params[i].tp_dim,
         "seed": 11 + i, "qkv_split": qkv_split if plan.params[i].subs else None} for i in chosen]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    script = Path(__file__).with_name("megatron_gram.py")
    done = subprocess.run([str(peer_python), str(script), str(tmp_path / "job.json")], capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    megatron = [torch.load(tmp_path / f"rank{r}.pt") for r in range(TP)]

    for i in chosen:
        spec = plan.params[i]
        program_calls = [(c.in_elems, c.dtype) for c in grams[i].calls()]
        updates = [MatrixUpdates([spec], cfg.optimizer) for _ in range(TP)]  # each rank's own state
        mine_calls: list[list[tuple[int, str]]] = [[] for _ in range(TP)]

        def run(shard, reduce, spec=spec, updates=updates, calls=mine_calls):
            r = next(k for k in range(TP) if torch.equal(shard, megatron[k][spec.name]["shard"]))

            def recording(t):
                calls[r].append((t.numel(), str(t.dtype).removeprefix("torch.")))
                return reduce(t)

            return updates[r].shard_directions([0], [shard.clone()], 1, TP, r, recording)[0]

        shards = [megatron[r][spec.name]["shard"] for r in range(TP)]
        assert torch.equal(torch.cat(shards, dim=spec.tp_dim), megatron[0][spec.name]["full"])
        mine = _lockstep(shards, run)
        for r in range(TP):
            theirs = megatron[r][spec.name]
            assert [tuple(c) for c in theirs["calls"]] == program_calls == mine_calls[r], spec.name
            assert torch.equal(mine[r], theirs["out"]), (
                f"{spec.name} rank {r}: max diff {(mine[r] - theirs['out']).abs().max():.3e}")
