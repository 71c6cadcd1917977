"""The model inventory (dense and MoE): the ordered list of parameters as Megatron lays them out.

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

The model is a spec (`canzona.model_spec.ModelConfig`: the Qwen3 sizes built in, any other
transformer from a spec file). Without a gate (GeLU) fc1 is a single ``[ffn, hidden]`` block; a
LayerNorm adds a bias after each norm weight; a learned position embedding follows the word
embedding; multi-head latent attention replaces the fused QKV by its projections (`_mla_params`).

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
from canzona.layout import check_expert_sizes
from canzona.model_spec import (  # noqa: F401  (re-exported: the spec is the inventory's input)
    QWEN3,
    QWEN3_ALL,
    QWEN3_MOE,
    SPEC_FIELDS,
    ModelConfig,
    builtin_names,
    override_spec,
    resolve_spec,
)

Kind = Literal["matrix", "adamw"]

MODELS = QWEN3_ALL  # the built-in Qwen3 sizes (spec files: `canzona.model_spec.spec_files`)


VOCAB_DIVISIBLE_BY = 128  # Megatron's --make-vocab-size-divisible-by default


def padded_vocab(vocab: int, tp: int) -> int:
    """A tokenizer's vocabulary padded as Megatron pads it: up to a multiple of
    ``make_vocab_size_divisible_by`` (128) × TP, so every TP rank holds an equal, aligned shard."""
    multiple = VOCAB_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


# ``model.*`` keys with a meaning of their own (scaling a size, padding a tokenizer's vocabulary,
# capping the experts); every other spec field given as ``model.<field>`` replaces the spec's value
SCALING_KEYS = ("num_layers", "vocab", "tied_embeddings", "num_experts", "top_k")
OVERRIDE_KEYS = tuple(k for k in SPEC_FIELDS if k not in SCALING_KEYS)


def model_config(name: str, width_div: int = 1, num_layers: int | None = None, *, vocab: int | None = None,
                 tied_embeddings: bool | None = None, tp: int = 1, num_experts: int | None = None,
                 top_k: int | None = None, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """Look up a model's spec (`canzona.model_spec.resolve_spec`: a Qwen3 size, a built-in spec
    file or a spec file's path), optionally changed, then scaled down for small machines.

    ``overrides`` replace spec fields (``model.hidden=...``; `override_spec`). ``width_div``
    divides hidden, every FFN width, head_dim and vocab by the same factor (head counts kept),
    so every matrix keeps its aspect ratio; ``num_layers`` truncates the stack. ``vocab``
    replaces the vocabulary by a tokenizer's size (GPT-2's 50257, as the paper's authors
    trained), padded for ``tp`` as Megatron pads it (`padded_vocab`) before any ``width_div``;
    ``tied_embeddings`` ties or unties the output layer (Qwen3 ties it up to 4B; Megatron ties it
    unless ``--untie-embeddings-and-output-weights``). Either one changed shows in the name.
    ``num_experts`` / ``top_k`` cut an MoE model's experts per layer and experts per token
    (`_scale_experts`).
    """
    cfg = override_spec(resolve_spec(name), {k: v for k, v in (overrides or {}).items() if v is not None})
    name = cfg.name
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
    if isinstance(width_div, bool) or not isinstance(width_div, int) or width_div < 1:
        raise ConfigError(f"model.width_div={width_div!r} must be a positive integer")
    widths = ("hidden", "ffn", "head_dim", "vocab", "dense_ffn", "shared_expert_ffn")
    for field in widths:
        if getattr(cfg, field) % width_div:
            raise ConfigError(
                f"model.width_div={width_div} does not divide {field}={getattr(cfg, field)} of {name}"
            )
    if num_layers is not None and not (isinstance(num_layers, int) and 1 <= num_layers <= cfg.num_layers):
        raise ConfigError(f"model.num_layers={num_layers!r} must be an integer in [1, {cfg.num_layers}] for {name}")
    if cfg.moe and num_layers is not None and num_layers <= cfg.dense_layers:
        raise ConfigError(f"model.num_layers={num_layers} keeps only the {cfg.dense_layers} dense layers of {name}; "
                          f"give more layers or model.dense_layers below {num_layers}")
    scaled = "" if width_div == 1 and num_layers is None else f"/w{width_div}l{num_layers or cfg.num_layers}"
    return replace(
        cfg,
        name=name + scaled + suffix,
        num_layers=num_layers or cfg.num_layers,
        **{f: getattr(cfg, f) // width_div for f in widths},
    )


def _scale_experts(mcfg: ModelConfig, num_experts: int | None, top_k: int | None) -> tuple[ModelConfig, str]:
    """``cfg`` with fewer experts per layer and/or per token, and the name suffix saying so.

    Cutting the experts keeps every expert's shape, so the planner sees the same matrices, only
    fewer of them; the top-k must stay within the experts (an explicit ``top_k`` is needed when
    ``num_experts`` drops below the model's)."""
    if not mcfg.moe:
        key = "model.num_experts" if num_experts is not None else "model.top_k"
        raise ConfigError(f"{key} is for MoE models; {mcfg.name} is dense (MoE: {', '.join(QWEN3_MOE)}, or a spec "
                          f"with num_experts)")
    for key, value in (("model.num_experts", num_experts), ("model.top_k", top_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{key}={value!r} must be a positive integer")
    experts = num_experts if num_experts is not None else mcfg.num_experts
    k = top_k if top_k is not None else mcfg.top_k
    if experts > mcfg.num_experts:
        raise ConfigError(f"model.num_experts={experts} exceeds {mcfg.name}'s {mcfg.num_experts} experts per layer")
    if k > experts:
        raise ConfigError(f"model.top_k={k} exceeds model.num_experts={experts} (a token is routed to at most "
                          f"every expert); give model.top_k<={experts}")
    suffix = (f"/e{experts}" if experts != mcfg.num_experts else "") + (f"/k{k}" if k != mcfg.top_k else "")
    return replace(mcfg, num_experts=experts, top_k=k), suffix


def model_config_of(model: Any, tp: int = 1) -> ModelConfig:
    """`model_config` from a trial's ``model`` section, as an object or a records dict."""
    get = model.get if isinstance(model, dict) else lambda k, d=None: getattr(model, k, d)
    width_div = get("width_div")
    return model_config(get("name", ""), 1 if width_div is None else width_div, get("num_layers"),
                        vocab=get("vocab"), tied_embeddings=get("tied_embeddings"), tp=tp,
                        num_experts=get("num_experts"), top_k=get("top_k"),
                        overrides={k: get(k) for k in OVERRIDE_KEYS})


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


def _qkv_subs(mcfg: ModelConfig, prefix: str) -> tuple[SubMatrix, ...]:
    hd, qpg, g = mcfg.head_dim, mcfg.q_per_group, mcfg.kv_heads
    stride = (qpg + 2) * hd
    q_blocks = tuple((i * stride, i * stride + qpg * hd, 1) for i in range(g))
    k_blocks = tuple((i * stride + qpg * hd, i * stride + (qpg + 1) * hd, 1) for i in range(g))
    v_blocks = tuple((i * stride + (qpg + 1) * hd, (i + 1) * stride, 1) for i in range(g))
    return (
        SubMatrix(f"{prefix}.q", (mcfg.heads * hd, mcfg.hidden), q_blocks),
        SubMatrix(f"{prefix}.k", (g * hd, mcfg.hidden), k_blocks),
        SubMatrix(f"{prefix}.v", (g * hd, mcfg.hidden), v_blocks),
    )


def _fc1_subs(ffn: int, hidden: int, prefix: str) -> tuple[SubMatrix, ...]:
    return (
        SubMatrix(f"{prefix}.gate", (ffn, hidden), ((0, 2 * ffn, 2),)),
        SubMatrix(f"{prefix}.up", (ffn, hidden), ((1, 2 * ffn, 2),)),
    )


def _norm(mcfg: ModelConfig, name: str, dim: int, layer: int | None, partial: bool) -> list[ParamSpec]:
    """A norm's weight (and a LayerNorm's bias, registered after it), replicated, AdamW."""
    out = [ParamSpec(f"{name}.weight", (dim,), None, "adamw", layer, tp_grad_allreduce=partial)]
    if mcfg.norm == "layernorm":
        out.append(ParamSpec(f"{name}.bias", (dim,), None, "adamw", layer, tp_grad_allreduce=partial))
    return out


def _mlp(mcfg: ModelConfig, prefix: str, ffn: int, layer: int, split_fused: bool, suffix: str = "",
         expert: int | None = None) -> tuple[ParamSpec, ParamSpec]:
    """An MLP's fc1 (``[2·ffn, hidden]``, gate and up rows interleaved, when gated; else
    ``[ffn, hidden]``) and fc2 ``[hidden, ffn]``; ``suffix``: an expert's ``<e>``."""
    fc1 = f"{prefix}.linear_fc1.weight{suffix}"
    gated = mcfg.gated_mlp
    subs = _fc1_subs(ffn, mcfg.hidden, fc1) if split_fused and gated else ()
    return (ParamSpec(fc1, ((2 if gated else 1) * ffn, mcfg.hidden), 0, "matrix", layer, subs, expert=expert),
            ParamSpec(f"{prefix}.linear_fc2.weight{suffix}", (mcfg.hidden, ffn), 1, "matrix", layer, expert=expert))


def build_inventory(
    mcfg: ModelConfig, *, split_fused: bool = False, matrix_embeddings: bool = False, sequence_parallel: bool = False
) -> list[ParamSpec]:
    """Parameters in megatron-core's registration order, which its DDP buffer reverses.

    The order is ``GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True), ...)
    .named_parameters()`` of megatron-core 0.16.1 (tests/unit/test_megatron_layout.py checks it):
    the embedding (and a learned position embedding after it); per layer ``input_layernorm``,
    ``self_attention.linear_proj`` (built by the ``Attention`` base class before
    ``SelfAttention`` adds the rest), ``linear_qkv``, ``q_layernorm``, ``k_layernorm`` (with
    q/k-norm), ``pre_mlp_layernorm``, then ``mlp.linear_fc1`` / ``linear_fc2`` (or an MoE layer's
    router, experts and shared expert); the final norm; the output layer. A LayerNorm has a bias
    after its weight.

    Embedding and output layer go to AdamW unless ``matrix_embeddings``; norms always do.
    A tied model has no separate output layer. With ``sequence_parallel`` the hidden-size norms
    (an MoE router and a learned position embedding, which see their TP rank's part of the
    sequence too) have gradients partial per TP rank (``tp_grad_allreduce``, as the q/k norms'
    always are). An MoE model's layers after its ``dense_layers`` have a router and experts
    (`_moe_params`) where a dense one has ``mlp.linear_fc1`` / ``linear_fc2``.
    """
    emb_kind: Kind = "matrix" if matrix_embeddings else "adamw"
    hd = mcfg.head_dim
    sp = sequence_parallel
    params = [ParamSpec("embedding.word_embeddings.weight", (mcfg.vocab, mcfg.hidden), 0, emb_kind)]
    if mcfg.position == "learned":
        params.append(ParamSpec("embedding.position_embeddings.weight", (mcfg.max_positions, mcfg.hidden), None,
                                "adamw", tp_grad_allreduce=sp))
    for i in range(mcfg.num_layers):
        p = f"decoder.layers.{i}"
        qkv = f"{p}.self_attention.linear_qkv.weight"
        params += _norm(mcfg, f"{p}.input_layernorm", mcfg.hidden, i, sp)
        if mcfg.mla:
            params += _mla_params(mcfg, i, sp)
        else:
            params += [
                # megatron-core's Attention.__init__ builds linear_proj; SelfAttention.__init__ then adds
                # linear_qkv and the q/k norms, so the output projection is registered first
                ParamSpec(f"{p}.self_attention.linear_proj.weight", (mcfg.hidden, mcfg.heads * hd), 1, "matrix", i),
                ParamSpec(qkv, ((mcfg.heads + 2 * mcfg.kv_heads) * hd, mcfg.hidden), 0, "matrix", i,
                          _qkv_subs(mcfg, qkv) if split_fused else ()),
            ]
            if mcfg.qk_norm:
                params += _norm(mcfg, f"{p}.self_attention.q_layernorm", hd, i, True)
                params += _norm(mcfg, f"{p}.self_attention.k_layernorm", hd, i, True)
        params += _norm(mcfg, f"{p}.pre_mlp_layernorm", mcfg.hidden, i, sp)
        if mcfg.is_moe_layer(i):
            params += _moe_params(mcfg, i, split_fused=split_fused, sequence_parallel=sp)
        else:
            params += _mlp(mcfg, f"{p}.mlp", mcfg.layer_dense_ffn, i, split_fused)
    params += _norm(mcfg, "decoder.final_layernorm", mcfg.hidden, None, sp)
    if not mcfg.tied_embeddings:
        params.append(ParamSpec("output_layer.weight", (mcfg.vocab, mcfg.hidden), 0, emb_kind))
    return params


def _mla_params(mcfg: ModelConfig, layer: int, sp: bool) -> list[ParamSpec]:
    """One layer's multi-head latent attention in megatron-core's ``MLASelfAttention`` order:
    ``linear_proj`` (its base class), the query's down and up projections (or one
    ``linear_q_proj`` without a query bottleneck), the key/value down and up projections, then
    the ``q_layernorm`` / ``kv_layernorm`` of the bottlenecks. The projections are laid out as
    megatron-core's local spec builds them, column-parallel over TP (its Transformer Engine spec
    keeps the two down projections whole on every TP rank instead: not modelled)."""
    a = f"decoder.layers.{layer}.self_attention"
    qk = mcfg.head_dim + mcfg.qk_rope_dim
    out = [ParamSpec(f"{a}.linear_proj.weight", (mcfg.hidden, mcfg.heads * mcfg.v_head_dim), 1, "matrix", layer)]
    if mcfg.q_lora_rank:
        out += [ParamSpec(f"{a}.linear_q_down_proj.weight", (mcfg.q_lora_rank, mcfg.hidden), 0, "matrix", layer),
                ParamSpec(f"{a}.linear_q_up_proj.weight", (mcfg.heads * qk, mcfg.q_lora_rank), 0, "matrix", layer)]
    else:
        out.append(ParamSpec(f"{a}.linear_q_proj.weight", (mcfg.heads * qk, mcfg.hidden), 0, "matrix", layer))
    out += [ParamSpec(f"{a}.linear_kv_down_proj.weight", (mcfg.kv_lora_rank + mcfg.qk_rope_dim, mcfg.hidden), 0,
                      "matrix", layer),
            ParamSpec(f"{a}.linear_kv_up_proj.weight", (mcfg.heads * (mcfg.head_dim + mcfg.v_head_dim),
                                                         mcfg.kv_lora_rank), 0, "matrix", layer)]
    if mcfg.q_lora_rank:
        out += _norm(mcfg, f"{a}.q_layernorm", mcfg.q_lora_rank, layer, sp)
    return out + _norm(mcfg, f"{a}.kv_layernorm", mcfg.kv_lora_rank, layer, sp)


def _moe_params(mcfg: ModelConfig, layer: int, *, split_fused: bool, sequence_parallel: bool) -> list[ParamSpec]:
    """One MoE layer's router, experts and shared expert, in megatron-core's registration order
    (router, then ``TEGroupedMLP``'s fc1 of every expert, then fc2 of every expert, then the
    ``SharedExpertMLP``'s fc1 and fc2: a dense MLP split over TP like any other)."""
    p = f"decoder.layers.{layer}.mlp"
    out = [ParamSpec(f"{p}.router.weight", (mcfg.num_experts, mcfg.hidden), None, "adamw", layer,
                     tp_grad_allreduce=sequence_parallel)]
    experts = [_mlp(mcfg, f"{p}.experts", mcfg.ffn, layer, split_fused, str(e), expert=e)
               for e in range(mcfg.num_experts)]
    out += [fc1 for fc1, _ in experts] + [fc2 for _, fc2 in experts]
    if mcfg.shared_expert_ffn:
        out += _mlp(mcfg, f"{p}.shared_experts", mcfg.shared_expert_ffn, layer, split_fused)
    return out


def check_tp(mcfg: ModelConfig, tp: int) -> None:
    """Raise ConfigError unless TP divides every dim it must split."""
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"parallel.tp={tp!r} must be a positive integer")
    sizes = (("heads", mcfg.heads), ("kv_heads", mcfg.kv_heads), ("ffn", mcfg.ffn), ("vocab", mcfg.vocab),
             ("dense_ffn", mcfg.dense_ffn), ("shared_expert_ffn", mcfg.shared_expert_ffn),
             ("q_lora_rank", mcfg.q_lora_rank), ("kv_lora_rank + qk_rope_dim", mcfg.kv_lora_rank + mcfg.qk_rope_dim))
    for what, n in sizes:
        if n % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide {what}={n} of {mcfg.name}")


def total_params(params: list[ParamSpec]) -> int:
    return sum(p.numel for p in params)


def check_moe_sequence_parallel(mcfg: ModelConfig, tp: int, sequence_parallel: bool) -> None:
    """A one-line ConfigError if ``cfg`` is an MoE model at TP > 1 without sequence parallelism:
    Megatron's MoE requires it (each TP rank then routes its own part of the sequence). Planning
    takes either; a trial checks it before its ranks start (`canzona.config.check_runnable`) and
    the model where it is built (`canzona.model.qwen3.check_moe`)."""
    if mcfg.moe and tp > 1 and not sequence_parallel:
        raise ConfigError(f"parallel.sequence_parallel=false with parallel.tp={tp}: the MoE model {mcfg.name} runs "
                          f"at TP > 1 with parallel.sequence_parallel=true only, as Megatron's MoE does")


def check_experts(mcfg: ModelConfig, ep: int, etp: int) -> None:
    """Raise ConfigError unless ``ep`` EP ranks can split ``cfg``'s experts and ``etp`` expert-TP
    ranks each expert's FFN (the group arithmetic itself: `canzona.layout.ExpertLayout.check`)."""
    check_expert_sizes(ep, etp)
    if not mcfg.moe:
        if ep != 1:
            raise ConfigError(f"parallel.ep={ep} splits experts, and {mcfg.name} is dense; use parallel.ep=1 "
                              f"or an MoE model ({', '.join(QWEN3_MOE)})")
        return
    if mcfg.num_experts % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide the {mcfg.num_experts} experts per layer of {mcfg.name}")
    if mcfg.ffn % etp:
        raise ConfigError(f"parallel.etp={etp} does not divide the expert FFN width {mcfg.ffn} of {mcfg.name}")
