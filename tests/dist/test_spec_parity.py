"""A transformer beyond Qwen3's architecture (`canzona.model_spec`) trains as the single process.

The Megatron functional-test GPT-MoE spec (GeLU, LayerNorm with biases, learned absolute
positions, tied output layer), given a leading dense layer and a shared expert by overrides
(DeepSeek-V3's layer plan), runs three Muon steps through the real trial runner at DP 2 × TP 2
× EP 2 with sequence parallelism (where the position embedding's and the norms' gradients are
partial per TP rank and summed by the executor) and stays within the training-parity bound of
the dense models (1e-5 relative L2; docs/design.md §3.3) of the single-process run, each matrix
computed by one rank, the executor's calls its program's.
"""

from __future__ import annotations

import pytest
import torch
from util import global_rel

pytestmark = pytest.mark.slow

TRAIN = ["model=mlm-moe-gpt", "model.width_div=4", "model.num_layers=2", "model.dense_layers=1",
         "model.dense_ffn=1024", "model.shared_expert_ffn=1024", "train.seq_len=64", "train.seed=7",
         "train.dtype=fp32", "optimizer.clip_norm_dtype=float64", "train.steps=3", "train.warmup=0", "optimizer=muon"]


def test_gpt_moe_spec_with_dense_layer_and_shared_expert_trains_as_single_process(tmp_path) -> None:
    from full_tensors import init_full_state_dict

    from canzona import host_memory
    from canzona.config import load_config
    from canzona.inventory import build_inventory
    from canzona.run import run_trial

    layouts = {"single": ["train.micro_batch=4"],
               "dp2tp2ep2": ["train.micro_batch=2", "parallel.dp=2", "parallel.tp=2", "parallel.ep=2",
                             "parallel.etp=1", "parallel.sequence_parallel=true", "method=canzona"]}
    got, summaries = {}, {}
    for name, layout in layouts.items():
        out = tmp_path / name
        summaries[name] = run_trial(load_config([*TRAIN, *layout, f"save_params={out}/p.pt"]), out)
        got[name] = torch.load(out / "p.pt")
    mcfg = load_config(TRAIN).model_cfg()
    names = [p.name for p in build_inventory(mcfg)]
    assert "embedding.position_embeddings.weight" in names and "decoder.layers.0.mlp.linear_fc1.weight" in names
    assert "decoder.layers.1.mlp.shared_experts.linear_fc1.weight" in names
    assert "decoder.layers.1.input_layernorm.bias" in names and not any("q_layernorm" in n for n in names)
    init = init_full_state_dict(mcfg, 7)
    assert list(got["dp2tp2ep2"]) == list(init)
    err = global_rel(got["dp2tp2ep2"], got["single"])
    assert err <= 1e-5, f"relative L2 difference {err:.2e}"
    assert global_rel(init, got["single"]) > 100 * max(err, 1e-12), "training did not move the parameters enough"
    s = summaries["dp2tp2ep2"]
    assert s["program_check"]["ok"] and s["matrix_owner_counts"] == {"min": 1, "max": 1}
    assert s["speed_probe_flops_per_s"] > 1e8  # the machine's speed then, for validation (canzona.calibrate.probe)
    assert s["host_allocator"] == host_memory.POLICY  # a CPU rank keeps what it frees (canzona.host_memory)
    assert s["speed_probe_all_cores_flops_per_s"] > 1e8  # every rank's matmul rate at once, per core
