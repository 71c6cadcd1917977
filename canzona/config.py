"""Trial configuration: one structured schema for the planner CLI, the trial runner and sweeps.

Overrides are Hydra-style ``key=value`` strings (``parallel.dp=8 planner.alpha=0.5``) merged
into a structured omegaconf config, so typos and wrong types become one-line `ConfigError`s
that name the bad key or value and what is allowed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from omegaconf import OmegaConf

from canzona.cost import COSTS
from canzona.errors import ConfigError
from canzona.hardware import DEFAULT_HARDWARE
from canzona.inventory import (
    OVERRIDE_KEYS,
    QWEN3_MOE,
    ModelConfig,
    check_experts,
    check_moe_sequence_parallel,
    check_tp,
    model_config_of,
)
from canzona.layout import ExpertLayout
from canzona.model_spec import ATTENTIONS, NORMS, POSITIONS, builtin_names
from canzona.optim import registry as optimizers
from canzona.optim.section import OptimizerSection
from canzona.overrides import Arguments, Renamed, build, move_keys, parent_mapping, split_argv, upgrade_keys
from canzona.peers import PEERS, TP_MODES
from canzona.plan import registry as methods
from canzona.schema_doc import KeyDoc, check_choices, key_docs, setting

OPTIMIZERS = optimizers.NAMES
GROUPINGS = ("rounds", "global", "slot", "single", "none")
DP_COLLECTIVES = ("auto", "padded", "reduce_loop", "coalesced", "all_to_all")
SYNC_VARIANTS = ("all_reduce", "zero1_gather")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bf16", "fp32")
RECOMPUTE = ("none", "full")
DP_VARIANTS = ("minmax", "snap")


@dataclass
class ModelSection:
    name: str = setting("qwen3-0.6b", "the model: a built-in spec (" + ", ".join(builtin_names()) + ") or a spec "
                                      "file path/to/spec.yaml (canzona.model_spec; shorthand model=NAME)")
    width_div: int = setting(1, "divide hidden, FFN, head_dim and vocab by this (heads kept: aspect ratios and relative costs stay)")
    num_layers: int | None = setting(None, "decoder layers; null keeps the model's")
    vocab: int | None = setting(None, "a tokenizer's vocabulary instead of Qwen3's 151936 (e.g. GPT-2's 50257), "
                                      "padded as Megatron pads it (128 x TP); null keeps the model's")
    tied_embeddings: bool | None = setting(None, "tie the output layer to the embedding; null keeps the model's "
                                                 "(Qwen3: tied up to 4B)")
    split_fused: bool = setting(False, "optimize the fused QKV and gate/up matrices as their logical sub-matrices")
    matrix_embeddings: bool = setting(False, "give the embedding and output layer to the matrix optimizer "
                                             "(default: AdamW)")
    num_experts: int | None = setting(None, "MoE models (" + ", ".join(QWEN3_MOE) + "): routed experts per "
                                            "layer, at most the model's 128 (every expert keeps its shape); "
                                            "null keeps the model's")
    top_k: int | None = setting(None, "MoE models: experts each token is routed to, at most model.num_experts; "
                                      "null keeps the model's 8")
    # Spec fields replaced one by one (canzona.model_spec.override_spec; the model's name says so)
    hidden: int | None = setting(None, "the residual width; null keeps the spec's")
    ffn: int | None = setting(None, "the dense MLP's width (an MoE model's: each routed expert's); null keeps the spec's")
    heads: int | None = setting(None, "attention (query) heads; null keeps the spec's")
    kv_heads: int | None = setting(None, "key/value heads (grouped-query attention); null keeps the spec's")
    head_dim: int | None = setting(None, "each attention head's width; null keeps the spec's")
    gated_mlp: bool | None = setting(None, "true: SwiGLU (fc1 holds gate and up); false: GeLU; null keeps the spec's")
    norm: str | None = setting(None, "the normalisation; null keeps the spec's", choices=NORMS)
    norm_eps: float | None = setting(None, "the norms' epsilon; null keeps the spec's")
    qk_norm: bool | None = setting(None, "normalise each query and key head; null keeps the spec's")
    position: str | None = setting(None, "position encoding: rotary or a learned absolute embedding; null keeps the "
                                         "spec's", choices=POSITIONS)
    rope_theta: float | None = setting(None, "the rotary base; null keeps the spec's")
    max_positions: int | None = setting(None, "rows of a learned position embedding; null keeps the spec's")
    shared_expert_ffn: int | None = setting(None, "MoE: the shared expert's width (0: none); null keeps the spec's")
    dense_layers: int | None = setting(None, "MoE: dense layers before the first MoE layer; null keeps the spec's")
    dense_ffn: int | None = setting(None, "MoE: those dense layers' FFN width; null keeps the spec's")
    attention: str | None = setting(None, "gqa (grouped-query) or mla (multi-head latent attention, planning and "
                                          "projection only); null keeps the spec's", choices=ATTENTIONS)
    q_lora_rank: int | None = setting(None, "MLA: the query bottleneck's rank (0: none); null keeps the spec's")
    kv_lora_rank: int | None = setting(None, "MLA: the key/value bottleneck's rank; null keeps the spec's")
    qk_rope_dim: int | None = setting(None, "MLA: the rotary part of each query/key head; null keeps the spec's")
    v_head_dim: int | None = setting(None, "MLA: each value head's width; null keeps the spec's")


@dataclass
class MethodSection:
    """A method is a DP strategy and a TP strategy (`canzona.plan.registry`). ``method=NAME``
    (``method.name``) is a preset that sets both; ``method.dp`` / ``method.tp`` given beside it
    win. A validated config has both filled in, and ``name`` only when the pair is a preset's."""

    name: str | None = setting("canzona", "a preset naming a DP and a TP strategy, or a peer: the field's own "
                                          "code run as a method (canzona.peers; shorthand method=NAME)",
                               choices=(*methods.PRESETS, *PEERS))
    dp: str | None = setting(None, "the DP strategy: who owns which gradient and update over DP; null: the "
                                   "preset's", choices=tuple(methods.DP_STRATEGIES))
    tp: str | None = setting(None, "the TP strategy: who computes each TP-split matrix's update; null: the "
                                   "preset's", choices=tuple(methods.TP_STRATEGIES))

    @property
    def label(self) -> str:
        """What tables and folder names call the method: the preset, else ``<dp>+<tp>``."""
        return self.name or f"{self.dp}+{self.tp}"

    @property
    def rung(self) -> str | None:
        """The authors' ablation-ladder name of the pair (``1_0-0_0``), if it is on the ladder."""
        return None if self.peer else methods.rung(str(self.dp), str(self.tp))

    @property
    def peer(self) -> bool:
        """Is the method a peer (someone else's code, `canzona.peers`), not a DP and a TP strategy?"""
        return self.name in PEERS


@dataclass
class PeerSection:
    """Settings of the peers (``method=megatron_layerwise`` and the others in `canzona.peers`);
    other methods ignore them."""

    tp_mode: str = setting("blockwise", "megatron_layerwise: megatron-core's muon_tp_mode (duplicated: every TP "
                                        "rank gathers and computes the full matrix; distributed: Newton-Schulz "
                                        "through Gram products all-reduced over TP; blockwise: each TP shard "
                                        "orthogonalised on its own, a different update, Megatron's default)",
                           choices=TP_MODES)
    ns_matmul_prec: str | None = setting(None, "megatron_layerwise: muon_fp32_matmul_prec (highest: fp32 "
                                               "Newton-Schulz; medium: bf16, Megatron's default); null: from "
                                               "optimizer.ns_dtype (float32 -> highest, bfloat16 -> medium)",
                                         choices=("highest", "high", "medium"))


@dataclass
class ParallelSection:
    dp: int = setting(1, "data-parallel ranks")
    tp: int = setting(1, "tensor-parallel ranks (divides the heads, KV heads and FFN)")
    ep: int = setting(1, "expert-parallel ranks of an MoE model: each holds num_experts/ep experts per layer; "
                         "divides dp*tp/etp (expert-data-parallel size: dp*tp/(etp*ep))")
    etp: int | None = setting(None, "expert tensor-parallel ranks (Megatron's --expert-tensor-parallel-size): 1 "
                                    "or parallel.tp; null: parallel.tp, as Megatron")
    # Megatron's --sequence-parallel; ignored at TP 1, as Megatron ignores it.
    sequence_parallel: bool = setting(False, "Megatron's --sequence-parallel: norms and residuals split along "
                                             "the sequence over TP (all-gather / reduce-scatter for each "
                                             "all-reduce); ignored at TP 1")


@dataclass
class PlannerSection:
    """Settings of the balancing strategies (method.dp=balanced, method.tp=async_balanced) and of
    the cost model every planner uses."""

    alpha: float = setting(1.0, "DP balance: weight of the cost-balanced target against the numel-balanced "
                                "one, in [0, 1]")
    cost: str = setting("auto", "the cost model: auto (measured on this machine's device, else the roofline of "
                                "planner.cost_hardware), measured, roofline, flops, numel", choices=COSTS)
    grouping: str = setting("rounds", "TP micro-group mode (rounds: balanced rounds, at most "
                                            "ceil(1/capacity) of them)", choices=GROUPINGS)
    capacity: float = setting(0.125, "micro-group capacity: the most a group puts on one TP rank, as a fraction "
                                     "of the per-rank ideal load (0.125: about 8 micro-groups a step)")
    dp_variant: str = setting("minmax", "DP partitioner: minmax (exact per-bucket min-max split) or snap "
                                        "(the paper's rule)", choices=DP_VARIANTS)
    pipeline_depth: int = setting(2, "TP micro-groups in flight ahead; 0: one group at a time")
    measured_table: str | None = setting(None, "measured costs from the updates table of this calibrated hardware "
                                               "file (python -m canzona.calibrate out=PATH) instead of the "
                                               "calibration cache")
    cost_hardware: str = setting(DEFAULT_HARDWARE, "hardware file (a name under hardware/ or a YAML path) of CUDA plans "
                                         "made where no GPU is visible, and of planner.cost=roofline")
    cost_cache: str | None = setting(None, "calibration cache folder (default $CANZONA_CACHE_DIR, else "
                                           "$XDG_CACHE_HOME/canzona, else ~/.cache/canzona)")
    elementwise_flops: float = setting(512.0, "flops cost model: matmul-flop equivalents per element of an "
                                              "elementwise update")


@dataclass
class BucketSection:
    size: int | None = setting(None, "gradient bucket size in elements; null: Megatron's max(40M, 1M x dp)")
    expert_size: int | None = setting(None, "MoE: bucket size of the expert gradient buffer (reduced over the "
                                            "expert-data-parallel group), in elements; null: bucket.size's")


@dataclass
class DistSection:
    device: str = setting("auto", "where ranks run: auto (CUDA when visible), cpu (gloo), cuda (NCCL)",
                          choices=DEVICES)
    dp_collective: str = setting("auto", "uneven DP reduce-scatter / all-gather; auto: per bucket, "
                                                "the even collective for equal shards, padded unless padding moves "
                                                "> 1.25x the bucket, else coalesced", choices=DP_COLLECTIVES)
    sync_variant: str = setting("all_reduce", "method.dp=ddp's gradient path: all_reduce, or "
                                                           "reduce-scatter then all-gather (zero1_gather, as "
                                                           "Moonlight)", choices=SYNC_VARIANTS)
    overlap_grad_reduce: bool = setting(True, "reduce each gradient bucket as backward fills it "
                                              "(Megatron's --overlap-grad-reduce)")
    overlap_param_gather: bool = setting(True, "gather updated parameters during the next forward, each bucket "
                                               "awaited by the first module using it (--overlap-param-gather)")
    step_barrier: bool = setting(True, "every rank waits at a barrier before its optimizer step's timer starts, "
                                       "as Megatron's timers do by default (--barrier-with-L1-time): the step "
                                       "leaves out the ranks' skew on arriving, booked as phase barrier; false: "
                                       "each rank's step starts when its own gradients are reduced")
    timeout_s: float = setting(300.0, "process-group timeout, seconds")
    threads_per_rank: int | None = setting(None, "torch threads per rank; null: the cores shared among the ranks")
    dry_run: bool = setting(False, "fake-device dry run: run dist.dry_run_ranks of the job here on fake CUDA "
                                   "tensors at the job's world size and report their peak memory and collectives")
    dry_run_ranks: Any = setting("first,last", "ranks the dry run runs: ranks and first/last, comma-separated "
                                               "(\"0,255\") or a list")
    dry_run_memory_gb: float = setting(80.0, "device memory, GiB: a dry-run rank whose peak exceeds it fails")


@dataclass
class TrainSection:
    dtype: str = setting("auto", "bf16 (fp32 main parameters and gradients in the optimizer, as Megatron's "
                                 "--bf16), fp32, or auto: bf16 on CUDA and on CPUs with native bf16 dot "
                                 "products, else fp32", choices=DTYPES)
    steps: int = setting(5, "measured steps")
    warmup: int = setting(2, "steps run before the measured ones")
    seed: int = setting(1234, "seed of the weights and the synthetic tokens")
    micro_batch: int = setting(2, "sequences per micro-batch per DP rank")
    grad_accum: int = setting(1, "micro-batches per iteration (global batch: dp x grad_accum x micro_batch)")
    seq_len: int = setting(64, "tokens per sequence")
    recompute: str = setting("none", "activation recomputation: full recomputes each decoder layer's forward in "
                                     "backward (Megatron's --recompute-granularity full, uniform, 1 layer)",
                             choices=RECOMPUTE)
    fail_on_rank: int | None = setting(None, "test hook: this rank raises at step train.fail_at_step")
    fail_at_step: int = setting(0, "test hook: the step at which train.fail_on_rank raises")


@dataclass
class TrialConfig:
    model: ModelSection = field(default_factory=ModelSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    method: MethodSection = field(default_factory=MethodSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    planner: PlannerSection = field(default_factory=PlannerSection)
    bucket: BucketSection = field(default_factory=BucketSection)
    dist: DistSection = field(default_factory=DistSection)
    train: TrainSection = field(default_factory=TrainSection)
    peer: PeerSection = field(default_factory=PeerSection)
    out: str | None = setting(None, "the folder the trial writes its records into")
    save_params: str | None = setting(None, "write the final parameters here (a torch file; the parity tests)")

    # ---- derived ----
    def model_cfg(self) -> ModelConfig:
        return model_config_of(self.model, self.parallel.tp)

    @property
    def sequence_parallel(self) -> bool:
        """``parallel.sequence_parallel`` where it applies: with TP (Megatron turns it off at TP 1)."""
        return self.parallel.sequence_parallel and self.parallel.tp > 1

    @property
    def world_size(self) -> int:
        return self.parallel.dp * self.parallel.tp

    def bucket_size(self) -> int:
        return self.bucket.size if self.bucket.size is not None else max(40_000_000, 1_000_000 * self.parallel.dp)

    def expert_bucket_size(self) -> int:
        """The expert buffer's bucket size: ``bucket.expert_size``, else the dense buffer's (Megatron
        sizes both buffers' buckets alike; Megatron-Canzona sets the expert one on its own)."""
        return self.bucket.expert_size if self.bucket.expert_size is not None else self.bucket_size()

    @property
    def expert_tp(self) -> int:
        """``parallel.etp``, null meaning ``parallel.tp`` (Megatron's default)."""
        return self.parallel.etp if self.parallel.etp is not None else self.parallel.tp

    def expert_layout(self) -> ExpertLayout:
        """Megatron's expert grid of this trial (`canzona.layout.ExpertLayout`)."""
        return ExpertLayout(self.parallel.dp, self.parallel.tp, self.parallel.ep, self.expert_tp)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Shorthands accepted on the command line for convenience: `model=qwen3-8b optimizer=soap`.
SHORTHANDS = {"model": "model.name", "optimizer": "optimizer.name", "method": "method.name"}

# Trial keys that were renamed (`canzona.overrides.Renamed`): given the old way -- a command line,
# a sweep file -- they are refused with one line naming the new key; a record written before the
# rename (config.yaml, summary.json's config) is read under the new name (`read_config`), and a
# trial id hashes the value under its old name (`id_dict`), so a rename changes no trial's id.
RENAMED = {
    "canzona.cost_profile": Renamed("planner.cost_hardware", "the hardware file of the roofline: a name under "
                                                             "hardware/ or a YAML path"),
    "canzona.measured_profile": Renamed("planner.measured_table", "the calibrated hardware file whose measured "
                                                                  "updates table the measured cost model reads"),
    # The planner's settings were under canzona.*, which read as if only the Canzona method used
    # them (every method plans with the cost model) and clashed with the package's module paths.
    **{f"canzona.{f.name}": Renamed(f"planner.{f.name}", "the planner's settings are under planner.*")
       for f in fields(PlannerSection)},
}


def read_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A config dict from a trial's records, whenever written, with today's key names and the
    settings it ran with where a default changed since (`RECORDED_BEFORE`)."""
    out = upgrade_keys(raw, RENAMED)  # a copy, sections included
    for dotted, then in RECORDED_BEFORE.items():
        holder = parent_mapping(out, dotted)
        if holder is not None:
            holder.setdefault(dotted.rsplit(".", 1)[-1], then)
    return out


# Keys added with a default that changes what a trial does, each with what trials did before it
# existed: a config recorded without the key (every key is recorded) ran that way.
RECORDED_BEFORE: dict[str, Any] = {"dist.step_barrier": False}


# Keys added after trial ids were first recorded, each with the value that describes a trial
# exactly as it was before the key existed. At that value a key is left out of the id
# (`id_dict`), so that upgrading the harness keeps every results folder resumable; any other
# value makes a new trial. A new key whose default changes what a trial does is here only at its
# value of before (`RECORDED_BEFORE`), so that its default makes new trials.
ID_NEUTRAL: dict[str, Any] = {
    "parallel.ep": 1,
    "parallel.etp": None,
    "model.num_experts": None,
    "model.top_k": None,
    **{f"model.{k}": None for k in OVERRIDE_KEYS},
    "bucket.expert_size": None,
    "optimizer.batch_equal_shapes": False,
    "peer.tp_mode": "blockwise",
    "peer.ns_matmul_prec": None,
    **RECORDED_BEFORE,
}


def id_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The config as trial ids hash it: renamed keys under their names of before the rename, and
    keys added since at their neutral value (`ID_NEUTRAL`) left out."""
    oldest: dict[str, str] = {}  # a key renamed twice is hashed under its first name (RENAMED's order)
    for old, r in RENAMED.items():
        oldest.setdefault(r.new, old)
    out = move_keys(config, oldest)
    for dotted, neutral in ID_NEUTRAL.items():
        holder, leaf = parent_mapping(out, dotted), dotted.rsplit(".", 1)[-1]
        if holder is not None and leaf in holder and holder[leaf] == neutral:
            del holder[leaf]
            section = dotted.rsplit(".", 1)[0]
            if not holder and "." in dotted and "." not in section:  # a section added whole (peer.*)
                del out[section]
    return out


@functools.cache
def trial_key_docs() -> tuple[KeyDoc, ...]:
    """Every trial key with its default, allowed values and meaning (``--help``, the reference)."""
    return tuple(key_docs(TrialConfig))


def validate(cfg: TrialConfig) -> TrialConfig:
    """Check every value and the layout; raise ConfigError with a one-line message."""
    optimizers.check_settings(cfg.optimizer)  # name, choices and bounds of every optimizer.* key
    m = cfg.method
    if m.name is not None and m.name not in methods.PRESETS and not m.peer:
        raise ConfigError(f"method={m.name!r} is not a preset or a peer; choose one of: "
                          f"{', '.join((*methods.PRESETS, *PEERS))} (or give method.dp and method.tp)")
    if not m.peer:  # a peer has no DP/TP strategy to resolve (its own checks: `_check_peer`)
        m.name, m.dp, m.tp = methods.resolve(m.name, m.dp, m.tp)
    check_choices(cfg, trial_key_docs())  # every key with a closed set of values
    if not 0.0 <= cfg.planner.alpha <= 1.0:
        raise ConfigError(f"planner.alpha={cfg.planner.alpha} must be in [0, 1]")
    if not 0.0 < cfg.planner.capacity <= 1.0:
        raise ConfigError(f"planner.capacity={cfg.planner.capacity} must be a fraction in (0, 1]")
    if cfg.planner.elementwise_flops <= 0:
        raise ConfigError(f"planner.elementwise_flops={cfg.planner.elementwise_flops} must be positive")
    if cfg.planner.pipeline_depth < 0:
        raise ConfigError(f"planner.pipeline_depth={cfg.planner.pipeline_depth} must be >= 0")
    if cfg.parallel.dp < 1:
        raise ConfigError(f"parallel.dp={cfg.parallel.dp} must be a positive integer")
    if cfg.bucket.size is not None and cfg.bucket.size < 1:
        raise ConfigError(f"bucket.size={cfg.bucket.size} must be a positive number of elements")
    if cfg.bucket.expert_size is not None and cfg.bucket.expert_size < 1:
        raise ConfigError(f"bucket.expert_size={cfg.bucket.expert_size} must be a positive number of elements")
    if cfg.train.grad_accum < 1:
        raise ConfigError(f"train.grad_accum={cfg.train.grad_accum} must be a positive number of micro-batches")
    if cfg.train.steps < 1 or cfg.train.warmup < 0:
        raise ConfigError(f"train.steps={cfg.train.steps} must be >= 1 and train.warmup={cfg.train.warmup} >= 0")
    check_tp(cfg.model_cfg(), cfg.parallel.tp)
    check_experts(cfg.model_cfg(), cfg.parallel.ep, cfg.expert_tp)
    ExpertLayout.check(cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.ep, cfg.expert_tp)
    if m.peer:
        _check_peer(cfg)
        return cfg
    methods.check(m.dp, m.tp, optimizers.get(cfg.optimizer.name).matrix, cfg.parallel.tp, cfg.optimizer.name)
    if cfg.sequence_parallel and cfg.train.seq_len % cfg.parallel.tp:
        raise ConfigError(f"parallel.sequence_parallel=true splits the sequence over TP: parallel.tp={cfg.parallel.tp} "
                          f"must divide train.seq_len={cfg.train.seq_len}")
    if cfg.dist.dry_run:
        _check_dry_run(cfg)
    return cfg


def _check_peer(cfg: TrialConfig) -> None:
    """A peer runs its own code: no DP/TP strategy, no plan, no dry run; refuse in one line what
    it cannot run (after `validate`'s checks of values and shapes, which every method passes)."""
    m, peer = cfg.method, PEERS[str(cfg.method.name)]
    if m.dp is not None or m.tp is not None:
        raise ConfigError(f"method={m.name} is a peer (its own code, no DP/TP strategy): method.dp / method.tp "
                          f"are not allowed with it")
    if peer.dp_only and cfg.parallel.tp > 1:
        raise ConfigError(f"method={m.name} has no tensor parallelism ({peer.follows}): parallel.tp={cfg.parallel.tp} "
                          f"is not allowed; use parallel.tp=1")
    if cfg.model_cfg().moe:
        raise ConfigError(f"method={m.name} runs the dense Qwen3 models only: model={cfg.model.name} is MoE")
    if not cfg.model_cfg().qwen3_architecture:
        raise ConfigError(f"method={m.name} runs the Qwen3 architecture only (SwiGLU, RMSNorm, q/k-norm, rotary "
                          f"positions): model={cfg.model.name} differs")
    wanted = "muon" if peer.matrix else "adamw"
    if cfg.optimizer.name != wanted:
        raise ConfigError(f"method={m.name} runs {wanted}: optimizer.name={cfg.optimizer.name} is not allowed with it")
    if cfg.dist.dry_run:
        raise ConfigError(f"method={m.name} is a peer: dist.dry_run=true runs the harness's own programs only")


def check_runnable(cfg: TrialConfig) -> None:
    """What building the model needs beyond planning it, as a one-line ConfigError: an MoE model
    at TP > 1 runs with sequence parallelism only (`canzona.inventory.check_moe_sequence_parallel`;
    planning alone takes either). Multi-head latent attention is planned and projected only, and a
    learned position embedding must cover the sequence."""
    mcfg = cfg.model_cfg()
    if mcfg.mla:
        raise ConfigError(f"model={cfg.model.name} has multi-head latent attention (model.attention=mla): the "
                          f"harness plans and projects it (canzona.plan, canzona.sim.simulate) but builds only "
                          f"grouped-query attention for real and dry runs")
    if mcfg.position == "learned" and cfg.train.seq_len > mcfg.max_positions:
        raise ConfigError(f"train.seq_len={cfg.train.seq_len} exceeds the {mcfg.max_positions} learned positions "
                          f"of model={cfg.model.name}; give train.seq_len<={mcfg.max_positions}")
    check_moe_sequence_parallel(mcfg, cfg.parallel.tp, cfg.parallel.sequence_parallel)


def dry_run_ranks(value: Any, world: int) -> list[int]:
    """``dist.dry_run_ranks`` (a comma-separated string or a list) as the sorted distinct ranks
    of a ``world``-rank job; ConfigError if a part is not one of its ranks."""
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    ranks: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if part in ("first", "last"):
            ranks.add(0 if part == "first" else world - 1)
            continue
        try:
            rank = int(part)
        except ValueError:
            raise ConfigError(
                f"dist.dry_run_ranks={text!r}: {part!r} is not a rank; give ranks and first/last separated by commas"
            ) from None
        if not 0 <= rank < world:
            raise ConfigError(f"dist.dry_run_ranks={text!r}: rank {rank} is not in the job's ranks 0..{world - 1}")
        ranks.add(rank)
    return sorted(ranks)


def _check_dry_run(cfg: TrialConfig) -> None:
    if cfg.dist.device == "cpu":
        raise ConfigError("dist.dry_run=true runs the CUDA path on fake devices; dist.device=cpu is not allowed with it")
    if not cfg.dist.dry_run_memory_gb > 0:
        raise ConfigError(f"dist.dry_run_memory_gb={cfg.dist.dry_run_memory_gb} must be a positive number of GiB")
    dry_run_ranks(cfg.dist.dry_run_ranks, cfg.world_size)


@functools.lru_cache(maxsize=1)
def _schema() -> Any:
    """The structured schema (building it costs ~50 ms; merges never modify it)."""
    return OmegaConf.structured(TrialConfig)


def load_config(overrides: list[str] | tuple[str, ...] = (), base: dict[str, Any] | None = None) -> TrialConfig:
    """Build a validated TrialConfig from an optional base dict and ``key=value`` overrides (a
    later override of a key wins: callers layer them; a command line goes through `parse_cli`).
    A renamed key is refused in either: a base read from old records goes through `read_config`."""
    args = split_argv(overrides, shorthands=SHORTHANDS, unique=False)
    obj = build(_schema(), args.overrides, base=base, renamed=RENAMED)
    assert isinstance(obj, TrialConfig)
    return validate(obj)


def parse_cli(argv: list[str], flags: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> tuple[TrialConfig, Arguments]:
    """A trial command line: ``key=value`` overrides plus the allowed ``--flags`` / ``--options``."""
    args = split_argv(argv, flags=flags, options=options, shorthands=SHORTHANDS,
                      keys=[d.key for d in trial_key_docs()])
    obj = build(_schema(), args.overrides, renamed=RENAMED)
    assert isinstance(obj, TrialConfig)
    return validate(obj), args
