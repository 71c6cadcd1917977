"""A transformer described as data: `ModelConfig`, the built-in specs, spec files and overrides.

A model is a spec (docs/design.md §5): sizes (layers, hidden, attention heads, KV heads, head
dim, FFN, vocabulary), architecture (gated MLP or not, RMSNorm or LayerNorm, q/k-norm, rotary or
learned positions, tied output layer) and, for a mixture of experts, experts, top-k, the
expert FFN, a shared expert and the dense layers before the first MoE layer. Everything below
(inventory, planner, lowering, model builder, dry run, simulator) reads only this.

``model=NAME`` takes a built-in spec: the Qwen3 sizes (in code, as the planner has always seen
them) or a file ``models/NAME.yaml`` of this checkout; ``model=path/to/spec.yaml`` a spec file
of one's own. A spec file holds `SPEC_FIELDS` (the Qwen3 values are the defaults of those it
leaves out) plus ``source`` (where its numbers come from); `resolve_spec` refuses any other key
in one line. ``model.<field>=value`` overrides one field of any spec (`override_spec`), and the
name then says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from canzona import CHECKOUT
from canzona.errors import ConfigError

SPECS_DIR = CHECKOUT / "models"
NORMS = ("rmsnorm", "layernorm")
ATTENTIONS = ("gqa", "mla")
POSITIONS = ("rope", "learned")


@dataclass(frozen=True)
class ModelConfig:
    """One transformer's shapes and architecture; defaults are Qwen3's (a spec file or a
    ``ModelConfig(...)`` leaving a field out gets the Qwen3 value).

    ``ffn`` is the dense MLP's width, or each routed expert's in an MoE model; ``dense_ffn`` the
    width of the ``dense_layers`` leading dense layers of an MoE model (DeepSeek-V3's first three)
    and ``shared_expert_ffn`` that of the shared expert beside the routed ones (0: none)."""

    name: str
    hidden: int
    ffn: int
    num_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    num_experts: int = 0  # routed experts per layer; 0: a dense model (``ffn``: each expert's width)
    top_k: int = 0  # experts each token is routed to
    gated_mlp: bool = True  # SwiGLU: fc1 holds gate and up; False: GeLU on a single fc1
    norm: str = "rmsnorm"  # or "layernorm" (weight and bias)
    norm_eps: float = 1e-6
    qk_norm: bool = True  # RMSNorm (or LayerNorm) of each query and key head
    position: str = "rope"  # or "learned": an absolute position embedding of max_positions rows
    rope_theta: float = 1_000_000.0
    max_positions: int = 0
    shared_expert_ffn: int = 0
    dense_layers: int = 0
    dense_ffn: int = 0
    # multi-head latent attention (DeepSeek-V2/V3, Kimi K2): queries through a rank-q_lora_rank
    # bottleneck (0: none), keys and values through one of kv_lora_rank, plus a shared rotary key
    # of qk_rope_dim; each head's query/key is head_dim (non-rotary) + qk_rope_dim wide, its value v_head_dim
    attention: str = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0

    @property
    def q_per_group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def moe(self) -> bool:
        """Some decoder layers' MLP is a mixture of experts."""
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Layer ``layer``'s MLP is a mixture of experts (every layer after the dense ones)."""
        return self.moe and layer >= self.dense_layers

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.moe else 0

    @property
    def fc1_rows(self) -> int:
        """Rows of a dense fc1 of width ``ffn``: gate and up interleaved (gated) or one block."""
        return 2 * self.ffn if self.gated_mlp else self.ffn

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of ``hidden × ffn`` elements in one MLP (gated: gate, up, down)."""
        return 3 if self.gated_mlp else 2

    @property
    def layer_dense_ffn(self) -> int:
        """The FFN width of a dense layer: ``dense_ffn`` in an MoE model, else ``ffn``."""
        return (self.dense_ffn or self.ffn) if self.moe else self.ffn

    @property
    def mla(self) -> bool:
        return self.attention == "mla"

    @property
    def attention_width(self) -> int:
        """Per-head width of the two attention products summed, over two: ``head_dim`` (QKᵀ and AV
        both ``head_dim`` wide) with GQA; with MLA ``(head_dim + qk_rope_dim + v_head_dim) / 2``,
        so ``4·heads·attention_width·s`` flops a token prices both products either way."""
        if self.mla:
            return (self.head_dim + self.qk_rope_dim + self.v_head_dim) / 2  # type: ignore[return-value]
        return self.head_dim

    @property
    def qwen3_architecture(self) -> bool:
        """SwiGLU, RMSNorm, q/k-norm, RoPE, every layer's MLP alike: what every method and peer runs."""
        return (self.gated_mlp and self.norm == "rmsnorm" and self.qk_norm and self.position == "rope"
                and not self.shared_expert_ffn and not self.dense_layers and not self.mla)


# Public Qwen3 dense configs (head_dim 128, vocab 151936). docs/design.md §5.
QWEN3: dict[str, ModelConfig] = {
    c.name: c
    for c in [
        ModelConfig("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, True),
        ModelConfig("qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, True),
        ModelConfig("qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, True),
        ModelConfig("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, False),
        ModelConfig("qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, False),
        ModelConfig("qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, False),
    ]
}

# Public Qwen3 MoE configs (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json): ``ffn`` is
# moe_intermediate_size; decoder_sparse_step 1 and mlp_only_layers [] (every layer is MoE), no
# shared expert, untied output.
QWEN3_MOE: dict[str, ModelConfig] = {
    c.name: c
    for c in [
        ModelConfig("qwen3-30b-a3b", 2048, 768, 48, 32, 4, 128, 151936, False, num_experts=128, top_k=8),
        ModelConfig("qwen3-235b-a22b", 4096, 1536, 94, 64, 4, 128, 151936, False, num_experts=128, top_k=8),
    ]
}
QWEN3_ALL: dict[str, ModelConfig] = {**QWEN3, **QWEN3_MOE}

# The fields a spec file and ``model.<field>`` give, with their types (``name`` is the spec's).
SPEC_FIELDS: dict[str, type] = {f.name: {"int": int, "bool": bool, "str": str, "float": float}[str(f.type)]
                                for f in fields(ModelConfig) if f.name != "name"}
REQUIRED = ("hidden", "ffn", "num_layers", "heads", "kv_heads", "head_dim", "vocab", "tied_embeddings")
SPEC_EXTRAS = ("source", "notes", "pad_vocab")  # a spec file's keys besides the fields


def spec_files() -> dict[str, Path]:
    """The built-in spec files, ``models/NAME.yaml``, by name."""
    return {p.stem: p for p in sorted(SPECS_DIR.glob("*.yaml"))}


def builtin_names() -> tuple[str, ...]:
    return (*QWEN3_ALL, *spec_files())


def is_spec_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def resolve_spec(name: str) -> ModelConfig:
    """The spec ``model=NAME`` names: a Qwen3 size, a built-in spec file or a spec file's path."""
    if name in QWEN3_ALL:
        return QWEN3_ALL[name]
    if is_spec_path(name):
        return _load_file(str(Path(name).expanduser().resolve()))
    files = spec_files()
    if name in files:
        return _load_file(str(files[name]))
    raise ConfigError(f"unknown model {name!r}; allowed: {', '.join(builtin_names())}, or a spec file "
                      f"path/to/spec.yaml")


@functools.cache
def _load_file(path: str) -> ModelConfig:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"model={path}: cannot read the spec file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"model={path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model={path}: a spec file is a mapping of {', '.join(SPEC_FIELDS)}")
    unknown = sorted(set(data) - set(SPEC_FIELDS) - set(SPEC_EXTRAS) - {"name"})
    if unknown:
        raise ConfigError(f"model={path}: unknown spec key {unknown[0]!r}; allowed: "
                          f"{', '.join((*SPEC_FIELDS, *SPEC_EXTRAS))}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"model={path}: the spec lacks {missing[0]!r} (required: {', '.join(REQUIRED)})")
    name = str(data.get("name") or p.stem)
    values = {k: v for k, v in data.items() if k in SPEC_FIELDS}
    if data.get("pad_vocab"):
        values["vocab"] = _check_value("vocab", values["vocab"], name)
        values["vocab"] = -(-values["vocab"] // 128) * 128  # Megatron's padding at TP 1 (128 × TP)
    return check_spec(_build(name, values), where=f"model={path}")


def _check_value(key: str, value: Any, name: str) -> Any:
    want = SPEC_FIELDS[key]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"model.{key}={value!r} of {name} must be {want.__name__}")
    return value


def _build(name: str, values: dict[str, Any]) -> ModelConfig:
    return ModelConfig(name=name, **{k: _check_value(k, v, name) for k, v in values.items()})


def check_spec(mcfg: ModelConfig, where: str = "") -> ModelConfig:
    """``cfg`` if its fields fit together, else a one-line ConfigError (``where`` prefixes it)."""
    at = f"{where}: " if where else ""
    positive = ("hidden", "ffn", "num_layers", "heads", "kv_heads", "head_dim", "vocab")
    for key in positive:
        if getattr(mcfg, key) < 1:
            raise ConfigError(f"{at}model.{key}={getattr(mcfg, key)} must be a positive integer")
    for key in ("num_experts", "top_k", "max_positions", "shared_expert_ffn", "dense_layers", "dense_ffn"):
        if getattr(mcfg, key) < 0:
            raise ConfigError(f"{at}model.{key}={getattr(mcfg, key)} must be >= 0")
    if mcfg.heads % mcfg.kv_heads:
        raise ConfigError(f"{at}model.kv_heads={mcfg.kv_heads} must divide model.heads={mcfg.heads} (grouped-query "
                          f"attention)")
    if mcfg.norm not in NORMS:
        raise ConfigError(f"{at}model.norm={mcfg.norm!r}; allowed: {', '.join(NORMS)}")
    if mcfg.attention not in ATTENTIONS:
        raise ConfigError(f"{at}model.attention={mcfg.attention!r}; allowed: {', '.join(ATTENTIONS)}")
    mla_keys = ("q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_dim")
    if mcfg.mla:
        for key in mla_keys[1:]:
            if getattr(mcfg, key) < 1:
                raise ConfigError(f"{at}model.attention=mla needs model.{key} >= 1")
        if mcfg.q_lora_rank < 0:
            raise ConfigError(f"{at}model.q_lora_rank={mcfg.q_lora_rank} must be >= 0 (0: no query bottleneck)")
    else:
        for key in mla_keys:
            if getattr(mcfg, key):
                raise ConfigError(f"{at}model.{key}={getattr(mcfg, key)} is for model.attention=mla")
    if mcfg.position not in POSITIONS:
        raise ConfigError(f"{at}model.position={mcfg.position!r}; allowed: {', '.join(POSITIONS)}")
    if mcfg.position == "learned" and mcfg.max_positions < 1:
        raise ConfigError(f"{at}model.position=learned needs model.max_positions (the embedding's rows) >= 1")
    if mcfg.position == "rope" and mcfg.head_dim % 2:
        raise ConfigError(f"{at}model.head_dim={mcfg.head_dim} must be even for rotary positions")
    if not mcfg.norm_eps > 0 or not mcfg.rope_theta > 0:
        raise ConfigError(f"{at}model.norm_eps={mcfg.norm_eps} and model.rope_theta={mcfg.rope_theta} must be positive")
    if mcfg.moe:
        if not 1 <= mcfg.top_k <= mcfg.num_experts:
            raise ConfigError(f"{at}model.top_k={mcfg.top_k} must be in [1, model.num_experts={mcfg.num_experts}]")
        if mcfg.dense_layers >= mcfg.num_layers:
            raise ConfigError(f"{at}model.dense_layers={mcfg.dense_layers} leaves no MoE layer of "
                              f"model.num_layers={mcfg.num_layers}")
    else:
        for key in ("top_k", "shared_expert_ffn", "dense_layers", "dense_ffn"):
            if getattr(mcfg, key):
                raise ConfigError(f"{at}model.{key}={getattr(mcfg, key)} is for MoE models (model.num_experts > 0)")
    return mcfg


def override_spec(mcfg: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """``cfg`` with ``model.<field>`` overrides applied; each changed field shows in the name
    (``/hidden=2048``), so a record's name says which model it ran."""
    changed = {}
    for key, value in overrides.items():
        value = _check_value(key, value, mcfg.name)
        if value != getattr(mcfg, key):
            changed[key] = value
    if not changed:
        return mcfg
    suffix = "".join(f"/{k}={v}" for k, v in changed.items())
    return check_spec(replace(mcfg, name=mcfg.name + suffix, **changed))
