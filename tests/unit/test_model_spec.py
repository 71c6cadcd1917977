"""Any transformer as a spec (`canzona.model_spec`): built-in spec files, spec paths, overrides,
one-line refusals, and the Qwen3 sizes unchanged."""

from __future__ import annotations

import subprocess
import sys

import pytest

from canzona.config import check_runnable, load_config
from canzona.errors import ConfigError
from canzona.inventory import QWEN3_ALL, build_inventory, model_config, total_params
from canzona.model_spec import SPEC_FIELDS, spec_files

# Published total parameter counts (each spec file's source): the inventory must reproduce them
PUBLISHED_TOTALS = {"llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "deepseek-v3": 671.0e9, "kimi-k2": 1.03e12}


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_shipped_specs_have_their_published_sizes(name: str) -> None:
    total = total_params(build_inventory(model_config(name)))
    assert abs(total / PUBLISHED_TOTALS[name] - 1) < 0.005, total


def test_every_shipped_spec_names_its_source_and_loads() -> None:
    import yaml

    assert {"llama3-8b", "llama3-70b", "deepseek-v3", "kimi-k2", "mlm-moe-gpt"} <= set(spec_files())
    for name, path in spec_files().items():
        assert str(yaml.safe_load(path.read_text()).get("source", "")).startswith("https://"), name
        assert model_config(name).name == name


def test_functional_test_gpt_is_megatrons_architecture() -> None:
    cfg = model_config("mlm-moe-gpt")
    assert (cfg.vocab, cfg.gated_mlp, cfg.norm, cfg.position, cfg.qk_norm) == (50304, False, "layernorm", "learned", False)
    names = [p.name for p in build_inventory(cfg)]
    assert names[:2] == ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight"]
    assert "decoder.layers.0.input_layernorm.bias" in names


def test_deepseek_layers_dense_then_moe_with_latent_attention() -> None:
    params = build_inventory(model_config("deepseek-v3", num_layers=4))
    layer = {p.name.split(".", 3)[3] for p in params if p.layer == 0}
    assert "mlp.linear_fc1.weight" in layer and "self_attention.linear_kv_up_proj.weight" in layer
    moe = {p.name.split(".", 3)[3] for p in params if p.layer == 3}
    assert {"mlp.router.weight", "mlp.shared_experts.linear_fc1.weight", "mlp.experts.linear_fc1.weight255"} <= moe


def test_a_spec_file_of_ones_own_and_overrides(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("source: by hand\nhidden: 256\nffn: 512\nnum_layers: 2\nheads: 4\nkv_heads: 2\n"
                    "head_dim: 64\nvocab: 1024\ntied_embeddings: true\nqk_norm: false\n")
    cfg = load_config([f"model={path}", "model.hidden=512", "model.gated_mlp=false"]).model_cfg()
    assert (cfg.hidden, cfg.ffn, cfg.gated_mlp, cfg.qk_norm) == (512, 512, False, False)
    assert cfg.name == "mine/hidden=512/gated_mlp=False"
    fc1 = next(p for p in build_inventory(cfg) if p.name.endswith("linear_fc1.weight"))
    assert fc1.shape == (512, 512)


@pytest.mark.parametrize("text,match", [
    ("hidden: 8\n", "lacks 'ffn'"),
    ("hiden: 8\n", "unknown spec key 'hiden'"),
    ("[1, 2]\n", "is a mapping"),
    ("hidden: 8\nffn: 8\nnum_layers: 1\nheads: 3\nkv_heads: 2\nhead_dim: 8\nvocab: 8\ntied_embeddings: true\n",
     "must divide model.heads=3"),
    ("hidden: 8\nffn: 8\nnum_layers: 1\nheads: 2\nkv_heads: 2\nhead_dim: 8\nvocab: 8\ntied_embeddings: yes-ish\n",
     "must be bool"),
])
def test_bad_spec_files_are_one_line_errors(tmp_path, text: str, match: str) -> None:
    path = tmp_path / f"bad{abs(hash(text))}.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_config([f"model={path}"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args,match", [
    (["model=gpt5"], "unknown model 'gpt5'; allowed: qwen3-0.6b"),
    (["model.width_div=0"], "model.width_div=0 must be a positive integer"),
    (["model.norm=batchnorm"], "model.norm='batchnorm' is not allowed"),
    (["model=llama3-8b", "model.top_k=2"], "model.top_k is for MoE models"),
    (["model=llama3-8b", "model.dense_layers=1"], "is for MoE models"),
    (["model=deepseek-v3", "model.num_layers=3"], "keeps only the 3 dense layers"),
])
def test_bad_model_keys_are_one_line_errors(args: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(args)


def test_real_runs_refuse_what_the_builder_lacks() -> None:
    with pytest.raises(ConfigError, match="multi-head latent attention"):
        check_runnable(load_config(["model=deepseek-v3", "model.width_div=64", "model.num_layers=4"]))
    with pytest.raises(ConfigError, match="train.seq_len=2048 exceeds the 1024 learned positions"):
        check_runnable(load_config(["model=mlm-moe-gpt", "train.seq_len=2048"]))
    with pytest.raises(ConfigError, match="runs the Qwen3 architecture only"):
        load_config(["model=llama3-8b", "method=megatron_layerwise"])


def test_qwen3_sizes_keep_their_defaults_and_trial_ids() -> None:
    from canzona.config import id_dict

    assert all(c.qwen3_architecture for c in QWEN3_ALL.values())
    ids = id_dict(load_config(["model=qwen3-8b"]).to_dict())
    assert set(ids["model"]) == {"name", "width_div", "num_layers", "vocab", "tied_embeddings", "split_fused",
                                 "matrix_embeddings"}
    assert set(SPEC_FIELDS) >= {"gated_mlp", "norm", "position", "shared_expert_ffn", "dense_layers", "attention"}


def test_cli_refuses_a_bad_spec_in_one_line_with_exit_2(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "canzona.plan", f"model={tmp_path}/none.yaml"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "cannot read the spec file" in r.stderr
