"""Qwen3 MoE shapes in the inventory and the MoE config keys.

Shapes checked against the public Hugging Face configs (Qwen/Qwen3-30B-A3B and
Qwen/Qwen3-235B-A22B ``config.json``): every layer sparse (decoder_sparse_step 1,
mlp_only_layers []), no shared expert, 128 experts, top-8, untied output.
"""

from __future__ import annotations

import pytest

from canzona.config import load_config
from canzona.errors import ConfigError
from canzona.inventory import QWEN3, QWEN3_MOE, build_inventory, model_config, total_params


@pytest.mark.parametrize(("name", "layers", "hidden", "heads", "ffn", "billions"), [
    ("qwen3-30b-a3b", 48, 2048, 32, 768, 30.5), ("qwen3-235b-a22b", 94, 4096, 64, 1536, 235.1)])
def test_public_shapes(name: str, layers: int, hidden: int, heads: int, ffn: int, billions: float) -> None:
    cfg = model_config(name)
    assert (cfg.num_layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn) == (layers, hidden, heads, 4, 128, ffn)
    assert (cfg.num_experts, cfg.top_k, cfg.vocab, cfg.tied_embeddings) == (128, 8, 151936, False)
    params = build_inventory(cfg)
    assert round(total_params(params) / 1e9, 1) == billions  # the models' published sizes
    experts = [p for p in params if p.expert is not None]
    assert len(experts) == layers * 128 * 2
    assert not any("linear_fc1" in p.name and p.expert is None for p in params)  # no dense MLP, no shared expert


def test_layer_layout_follows_megatron_grouped_experts() -> None:
    cfg = model_config("qwen3-30b-a3b", num_layers=1, num_experts=4, top_k=2)
    names = [p.name for p in build_inventory(cfg)]
    p = "decoder.layers.0.mlp"
    assert names[names.index(f"{p}.router.weight"):names.index(f"{p}.router.weight") + 9] == [
        f"{p}.router.weight", *(f"{p}.experts.linear_fc1.weight{e}" for e in range(4)),
        *(f"{p}.experts.linear_fc2.weight{e}" for e in range(4))]
    by_name = {s.name: s for s in build_inventory(cfg, split_fused=True)}
    router, fc1, fc2 = by_name[f"{p}.router.weight"], by_name[f"{p}.experts.linear_fc1.weight3"], by_name[f"{p}.experts.linear_fc2.weight3"]
    assert (router.shape, router.kind, router.tp_dim, router.expert) == ((4, 2048), "adamw", None, None)
    assert (fc1.shape, fc1.kind, fc1.tp_dim, fc1.expert) == ((1536, 2048), "matrix", 0, 3)
    assert (fc2.shape, fc2.tp_dim, fc2.expert) == ((2048, 768), 1, 3)
    assert [s.row_blocks for s in fc1.subs] == [((0, 1536, 2),), ((1, 1536, 2),)]  # the dense fc1's interleave


def test_router_gradient_is_partial_under_sequence_parallel() -> None:
    cfg = model_config("qwen3-30b-a3b", num_layers=1, num_experts=2, top_k=1)
    router = {p.name: p for p in build_inventory(cfg, sequence_parallel=True)}["decoder.layers.0.mlp.router.weight"]
    assert router.tp_grad_allreduce


def test_dense_models_are_unchanged() -> None:
    for name in QWEN3:
        params = build_inventory(model_config(name))
        assert all(p.expert is None for p in params) and not model_config(name).moe


def test_scaled_variants_name_and_shape() -> None:
    cfg = load_config(["model=qwen3-235b-a22b", "model.width_div=16", "model.num_layers=2", "model.num_experts=8",
                       "model.top_k=2"]).model_cfg()
    assert cfg.name == "qwen3-235b-a22b/w16l2/e8/k2"
    assert (cfg.hidden, cfg.ffn, cfg.num_experts, cfg.top_k, cfg.num_layers) == (256, 96, 8, 2, 2)
    assert sum(p.expert is not None for p in build_inventory(cfg)) == 2 * 8 * 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["model=qwen3-30b-a3b", "model.num_experts=4"], "model.top_k=8 exceeds model.num_experts=4"),
    (["model=qwen3-30b-a3b", "model.num_experts=256"], "exceeds qwen3-30b-a3b's 128 experts"),
    (["model=qwen3-30b-a3b", "model.num_experts=0"], "model.num_experts=0 must be a positive integer"),
    (["model=qwen3-8b", "model.num_experts=4"], "qwen3-8b is dense"),
    (["model=qwen3-8b", "parallel.dp=2", "parallel.ep=2"], "qwen3-8b is dense"),
    (["model=qwen3-30b-a3b", "parallel.dp=3", "parallel.ep=3"], "parallel.ep=3 does not divide the 128 experts"),
    (["model=qwen3-30b-a3b", "parallel.dp=2", "parallel.ep=4"], "parallel.ep=4 does not divide dp*tp/etp=2*1/1=2"),
    (["model=qwen3-30b-a3b", "parallel.tp=2", "parallel.etp=4"], "parallel.etp=4: expert TP is 1 or parallel.tp=2"),
    (["model=qwen3-30b-a3b", "parallel.ep=0"], "parallel.ep=0 must be a positive integer"),
    (["model=qwen3-30b-a3b", "bucket.expert_size=0"], "bucket.expert_size=0 must be a positive"),
])
def test_bad_moe_settings_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")) as e:
        load_config(overrides)
    assert "\n" not in str(e.value)


def test_expert_settings_default_to_megatron() -> None:
    cfg = load_config(["model=qwen3-30b-a3b", "parallel.dp=4", "parallel.tp=2", "parallel.ep=2"])
    assert cfg.expert_tp == 2 and cfg.expert_layout().edp == 2
    assert cfg.expert_bucket_size() == cfg.bucket_size()
    assert load_config(["model=qwen3-30b-a3b", "bucket.expert_size=1000"]).expert_bucket_size() == 1000
    assert set(QWEN3_MOE) == {"qwen3-30b-a3b", "qwen3-235b-a22b"}
