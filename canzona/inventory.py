"""Qwen3 model inventory (dense and MoE): the ordered list of parameters as Megatron lays them out.

Everything downstream (cost model, planner, executor, model) speaks in terms of `ParamSpec`s,
so this module is the single source of truth for names, full (unsharded) shapes and how each
parameter is split over tensor-parallel ranks.

Canonical full layouts (independent of the TP size, so TP shards concatenated along
`tp_dim` always give the same full matrix and parities against a single process hold):

- fused QKV ``[(heads + 2*kv_heads) * head_dim, hidden]``: Megatron's per-query-group
  interleave -- for each KV group g, the rows of its ``heads/kv_heads`` query heads, then its
  key head, then its value head. TP must divide ``kv_heads``, so each rank holds whole groups.
- fused gate/up ``[2 * ffn, hidden]``: rows interleaved one by one (row 2i is gate_i, row 2i+1
  is up_i), so any contiguous row block holds matching gate and up rows.

Mixture-of-experts models (Qwen3-30B-A3B, Qwen3-235B-A22B: every layer sparse, no shared
expert) replace each layer's MLP by a router ``[num_experts, hidden]`` (AdamW, like the norms)
and per expert a fused gate/up ``[2 * ffn, hidden]`` (the dense fc1's interleave) and a down
``[hidden, ffn]``, where ``ffn`` is each expert's FFN width (``moe_intermediate_size``). They
are named as megatron-core's ``TEGroupedMLP`` names them (``mlp.experts.linear_fc1.weight<e>``,
all experts' fc1 then all experts' fc2), with the *global* expert index ``e``: EP rank ``r``
holds experts ``r * E/ep .. (r+1) * E/ep - 1`` and calls them ``weight0..`` locally.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from canzona.errors import ConfigError

Kind = Literal["matrix", "adamw"]


@dataclass(frozen=True)
class ModelConfig:
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

    @property
    def q_per_group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def moe(self) -> bool:
        """Every decoder layer's MLP is a mixture of experts."""
        return self.num_experts > 0


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
MODELS: dict[str, ModelConfig] = {**QWEN3, **QWEN3_MOE}


VOCAB_DIVISIBLE_BY = 128  # Megatron's --make-vocab-size-divisible-by default


def padded_vocab(vocab: int, tp: int) -> int:
    """A tokenizer's vocabulary padded as Megatron pads it: up to a multiple of
    ``make_vocab_size_divisible_by`` (128) × TP, so every TP rank holds an equal, aligned shard."""
    multiple = VOCAB_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


def model_config(name: str, width_div: int = 1, num_layers: int | None = None, *, vocab: int | None = None,
                 tied_embeddings: bool | None = None, tp: int = 1, num_experts: int | None = None,
                 top_k: int | None = None) -> ModelConfig:
    """Look up a Qwen3 config, optionally scaled down for small machines or given another tokenizer.

    ``width_div`` divides hidden, ffn, head_dim and vocab by the same factor (head counts kept),
    so every matrix keeps its aspect ratio; ``num_layers`` truncates the stack. ``vocab`` replaces
    Qwen3's vocabulary by a tokenizer's size (GPT-2's 50257, as the paper's authors trained),
    padded for ``tp`` as Megatron pads it (`padded_vocab`) before any ``width_div``;
    ``tied_embeddings`` ties or unties the output layer (Qwen3 ties it up to 4B; Megatron ties it
    unless ``--untie-embeddings-and-output-weights``). Either one changed shows in the name.
    ``num_experts`` / ``top_k`` cut an MoE model's experts per layer and experts per token
    (`_scale_experts`).
    """
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")
    cfg = MODELS[name]
    suffix = ""
    if num_experts is not None or top_k is not None:
        cfg, suffix = _scale_experts(cfg, num_experts, top_k)
    if vocab is not None:
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise ConfigError(f"model.vocab={vocab!r} must be a positive integer (a tokenizer's vocabulary size)")
        if not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"parallel.tp={tp!r} must be a positive integer")
        cfg = replace(cfg, vocab=padded_vocab(vocab, tp))
        suffix += f"/v{vocab}"
    if tied_embeddings is not None:
        if not isinstance(tied_embeddings, bool):
            raise ConfigError(f"model.tied_embeddings={tied_embeddings!r} must be true or false")
        if tied_embeddings != cfg.tied_embeddings:
            suffix += "/tied" if tied_embeddings else "/untied"
        cfg = replace(cfg, tied_embeddings=tied_embeddings)
    if not isinstance(width_div, int) or width_div < 1:
        raise ConfigError(f"model.width_div={width_div!r} must be a positive integer")
    for field in ("hidden", "ffn", "head_dim", "vocab"):
        if getattr(cfg, field) % width_div:
            raise ConfigError(
                f"model.width_div={width_div} does not divide {field}={getattr(cfg, field)} of {name}"
            )
    if num_layers is not None and not (isinstance(num_layers, int) and 1 <= num_layers <= cfg.num_layers):
        raise ConfigError(f"model.num_layers={num_layers!r} must be an integer in [1, {cfg.num_layers}] for {name}")
    scaled = "" if width_div == 1 and num_layers is None else f"/w{width_div}l{num_layers or cfg.num_layers}"
    return replace(
        cfg,
        name=cfg.name + scaled + suffix,
        hidden=cfg.hidden // width_div,
        ffn=cfg.ffn // width_div,
        head_dim=cfg.head_dim // width_div,
        vocab=cfg.vocab // width_div,
        num_layers=num_layers or cfg.num_layers,
    )


def _scale_experts(cfg: ModelConfig, num_experts: int | None, top_k: int | None) -> tuple[ModelConfig, str]:
    """``cfg`` with fewer experts per layer and/or per token, and the name suffix saying so.

    Cutting the experts keeps every expert's shape, so the planner sees the same matrices, only
    fewer of them; the top-k must stay within the experts (an explicit ``top_k`` is needed when
    ``num_experts`` drops below the model's)."""
    if not cfg.moe:
        key = "model.num_experts" if num_experts is not None else "model.top_k"
        raise ConfigError(f"{key} is for MoE models; {cfg.name} is dense (MoE: {', '.join(QWEN3_MOE)})")
    for key, value in (("model.num_experts", num_experts), ("model.top_k", top_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{key}={value!r} must be a positive integer")
    experts = num_experts if num_experts is not None else cfg.num_experts
    k = top_k if top_k is not None else cfg.top_k
    if experts > cfg.num_experts:
        raise ConfigError(f"model.num_experts={experts} exceeds {cfg.name}'s {cfg.num_experts} experts per layer")
    if k > experts:
        raise ConfigError(f"model.top_k={k} exceeds model.num_experts={experts} (a token is routed to at most "
                          f"every expert); give model.top_k<={experts}")
    suffix = (f"/e{experts}" if experts != cfg.num_experts else "") + (f"/k{k}" if k != cfg.top_k else "")
    return replace(cfg, num_experts=experts, top_k=k), suffix


def model_config_of(model: Any, tp: int = 1) -> ModelConfig:
    """`model_config` from a trial's ``model`` section, as an object or a records dict."""
    get = model.get if isinstance(model, dict) else lambda k, d=None: getattr(model, k, d)
    return model_config(get("name", ""), get("width_div") or 1, get("num_layers"), vocab=get("vocab"),
                        tied_embeddings=get("tied_embeddings"), tp=tp, num_experts=get("num_experts"),
                        top_k=get("top_k"))


@dataclass(frozen=True)
class SubMatrix:
    """A logical matrix inside a fused parameter, as row indices of the full canonical layout.

    ``row_blocks`` is a tuple of (start, stop, step) slices whose concatenation, in order,
    gives the sub-matrix's rows.
    """

    name: str
    shape: tuple[int, int]
    row_blocks: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class ParamSpec:
    """One model parameter.

    ``tp_dim`` is the dim along which the full tensor is split over TP ranks (0: column-parallel
    / vocab-parallel, 1: row-parallel, None: replicated). ``kind`` says which optimizer updates
    it. ``subs`` lists the logical sub-matrices a fused matrix is optimized as when
    ``split_fused`` is on (empty otherwise). ``tp_grad_allreduce`` marks replicated params whose
    gradient is only partial on each TP rank (q/k-norm, applied to the rank's own heads).
    ``expert`` is the global expert index of an MoE expert's matrix (None for every other
    param): experts live in the expert buffer, are split over the expert-parallel group and
    reduced over the expert-data-parallel group (`canzona.layout.ExpertLayout`), and ``tp_dim``
    then splits them over the expert-TP ranks.
    """

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    kind: Kind
    layer: int | None = None
    subs: tuple[SubMatrix, ...] = ()
    tp_grad_allreduce: bool = False
    expert: int | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def local_shape(self, tp: int) -> tuple[int, ...]:
        if self.tp_dim is None:
            return self.shape
        shape = list(self.shape)
        shape[self.tp_dim] //= tp
        return tuple(shape)

    def local_numel(self, tp: int) -> int:
        return self.numel // tp if self.tp_dim is not None else self.numel

    @property
    def matrices(self) -> tuple[tuple[str, tuple[int, int]], ...]:
        """The (name, shape) of each matrix the optimizer sees for this param."""
        if self.subs:
            return tuple((s.name, s.shape) for s in self.subs)
        return ((self.name, self.shape),)  # type: ignore[return-value]


def _qkv_subs(cfg: ModelConfig, prefix: str) -> tuple[SubMatrix, ...]:
    hd, qpg, g = cfg.head_dim, cfg.q_per_group, cfg.kv_heads
    stride = (qpg + 2) * hd
    q_blocks = tuple((i * stride, i * stride + qpg * hd, 1) for i in range(g))
    k_blocks = tuple((i * stride + qpg * hd, i * stride + (qpg + 1) * hd, 1) for i in range(g))
    v_blocks = tuple((i * stride + (qpg + 1) * hd, (i + 1) * stride, 1) for i in range(g))
    return (
        SubMatrix(f"{prefix}.q", (cfg.heads * hd, cfg.hidden), q_blocks),
        SubMatrix(f"{prefix}.k", (g * hd, cfg.hidden), k_blocks),
        SubMatrix(f"{prefix}.v", (g * hd, cfg.hidden), v_blocks),
    )


def _fc1_subs(cfg: ModelConfig, prefix: str) -> tuple[SubMatrix, ...]:
    return (
        SubMatrix(f"{prefix}.gate", (cfg.ffn, cfg.hidden), ((0, 2 * cfg.ffn, 2),)),
        SubMatrix(f"{prefix}.up", (cfg.ffn, cfg.hidden), ((1, 2 * cfg.ffn, 2),)),
    )


def build_inventory(
    cfg: ModelConfig, *, split_fused: bool = False, matrix_embeddings: bool = False, sequence_parallel: bool = False
) -> list[ParamSpec]:
    """Parameters in megatron-core's registration order, which its DDP buffer reverses.

    The order is ``GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True), ...)
    .named_parameters()`` of megatron-core 0.16.1 (tests/unit/test_megatron_layout.py checks it):
    the embedding; per layer ``input_layernorm``, ``self_attention.linear_proj`` (built by the
    ``Attention`` base class before ``SelfAttention`` adds the rest), ``linear_qkv``,
    ``q_layernorm``, ``k_layernorm``, ``pre_mlp_layernorm``, then ``mlp.linear_fc1`` /
    ``linear_fc2`` (or an MoE layer's router and experts); the final norm; the output layer.

    Embedding and output layer go to AdamW unless ``matrix_embeddings``; norms always do.
    A tied model has no separate output layer. With ``sequence_parallel`` the hidden-size norms
    (and an MoE router, which Megatron marks ``sequence_parallel`` too) see only their TP rank's
    part of the sequence, so their gradients are partial per TP rank (``tp_grad_allreduce``, as
    the q/k norms' always are). An MoE model's layers have a router and experts
    (`_moe_params`) where a dense one has ``mlp.linear_fc1`` / ``linear_fc2``.
    """
    emb_kind: Kind = "matrix" if matrix_embeddings else "adamw"
    hd = cfg.head_dim
    sp = sequence_parallel
    params = [ParamSpec("embedding.word_embeddings.weight", (cfg.vocab, cfg.hidden), 0, emb_kind)]
    for i in range(cfg.num_layers):
        p = f"decoder.layers.{i}"
        qkv = f"{p}.self_attention.linear_qkv.weight"
        fc1 = f"{p}.mlp.linear_fc1.weight"
        params += [
            ParamSpec(f"{p}.input_layernorm.weight", (cfg.hidden,), None, "adamw", i, tp_grad_allreduce=sp),
            # megatron-core's Attention.__init__ builds linear_proj; SelfAttention.__init__ then adds
            # linear_qkv and the q/k norms, so the output projection is registered first
            ParamSpec(f"{p}.self_attention.linear_proj.weight", (cfg.hidden, cfg.heads * hd), 1, "matrix", i),
            ParamSpec(qkv, ((cfg.heads + 2 * cfg.kv_heads) * hd, cfg.hidden), 0, "matrix", i,
                      _qkv_subs(cfg, qkv) if split_fused else ()),
            ParamSpec(f"{p}.self_attention.q_layernorm.weight", (hd,), None, "adamw", i, tp_grad_allreduce=True),
            ParamSpec(f"{p}.self_attention.k_layernorm.weight", (hd,), None, "adamw", i, tp_grad_allreduce=True),
            ParamSpec(f"{p}.pre_mlp_layernorm.weight", (cfg.hidden,), None, "adamw", i, tp_grad_allreduce=sp),
        ]
        if cfg.moe:
            params += _moe_params(cfg, i, split_fused=split_fused, sequence_parallel=sp)
            continue
        params += [
            ParamSpec(fc1, (2 * cfg.ffn, cfg.hidden), 0, "matrix", i, _fc1_subs(cfg, fc1) if split_fused else ()),
            ParamSpec(f"{p}.mlp.linear_fc2.weight", (cfg.hidden, cfg.ffn), 1, "matrix", i),
        ]
    params.append(ParamSpec("decoder.final_layernorm.weight", (cfg.hidden,), None, "adamw", tp_grad_allreduce=sp))
    if not cfg.tied_embeddings:
        params.append(ParamSpec("output_layer.weight", (cfg.vocab, cfg.hidden), 0, emb_kind))
    return params


def _moe_params(cfg: ModelConfig, layer: int, *, split_fused: bool, sequence_parallel: bool) -> list[ParamSpec]:
    """One MoE layer's router and experts, in megatron-core's registration order (router, then
    ``TEGroupedMLP``'s fc1 of every expert, then fc2 of every expert)."""
    p = f"decoder.layers.{layer}.mlp"
    out = [ParamSpec(f"{p}.router.weight", (cfg.num_experts, cfg.hidden), None, "adamw", layer,
                     tp_grad_allreduce=sequence_parallel)]
    for e in range(cfg.num_experts):
        fc1 = f"{p}.experts.linear_fc1.weight{e}"
        out.append(ParamSpec(fc1, (2 * cfg.ffn, cfg.hidden), 0, "matrix", layer,
                             _fc1_subs(cfg, fc1) if split_fused else (), expert=e))
    out += [ParamSpec(f"{p}.experts.linear_fc2.weight{e}", (cfg.hidden, cfg.ffn), 1, "matrix", layer, expert=e)
            for e in range(cfg.num_experts)]
    return out


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Raise ConfigError unless TP divides every dim it must split."""
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"parallel.tp={tp!r} must be a positive integer")
    for what, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn", cfg.ffn), ("vocab", cfg.vocab)):
        if n % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide {what}={n} of {cfg.name}")


def total_params(params: list[ParamSpec]) -> int:
    return sum(p.numel for p in params)


def check_experts(cfg: ModelConfig, ep: int, etp: int) -> None:
    """Raise ConfigError unless ``ep`` EP ranks can split ``cfg``'s experts and ``etp`` expert-TP
    ranks each expert's FFN (the group arithmetic itself: `canzona.layout.ExpertLayout.check`)."""
    for key, value in (("parallel.ep", ep), ("parallel.etp", etp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a positive integer")
    if not cfg.moe:
        if ep != 1:
            raise ConfigError(f"parallel.ep={ep} splits experts, and {cfg.name} is dense; use parallel.ep=1 "
                              f"or an MoE model ({', '.join(QWEN3_MOE)})")
        return
    if cfg.num_experts % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide the {cfg.num_experts} experts per layer of {cfg.name}")
    if cfg.ffn % etp:
        raise ConfigError(f"parallel.etp={etp} does not divide the expert FFN width {cfg.ffn} of {cfg.name}")
