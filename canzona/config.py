"""Trial configuration: one structured schema for the planner CLI, the trial runner and sweeps.

Overrides are Hydra-style ``key=value`` strings (``parallel.dp=8 canzona.alpha=0.5``) merged
into a structured omegaconf config, so typos and wrong types become one-line `ConfigError`s
that name the bad key or value and what is allowed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from omegaconf import OmegaConf

from canzona.cost import COSTS
from canzona.errors import ConfigError
from canzona.inventory import ModelConfig, check_tp, model_config_of
from canzona.optim import registry as optimizers
from canzona.optim.section import OptimizerSection
from canzona.overrides import Arguments, build, split_argv
from canzona.plan import registry as methods

OPTIMIZERS = optimizers.NAMES
GROUPINGS = ("rounds", "global", "slot", "single", "none")
DP_COLLECTIVES = ("auto", "padded", "reduce_loop", "coalesced", "all_to_all")
SYNC_VARIANTS = ("all_reduce", "zero1_gather")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bf16", "fp32")
RECOMPUTE = ("none", "full")


@dataclass
class ModelSection:
    name: str = "qwen3-0.6b"
    width_div: int = 1
    num_layers: int | None = None
    # A tokenizer's vocabulary instead of Qwen3's 151936 (e.g. GPT-2's 50257, the paper authors'),
    # padded as Megatron pads it (128 x TP); None keeps the model's.
    vocab: int | None = None
    # Tie or untie the output layer and the embedding; None keeps the model's (Qwen3: tied up to 4B).
    tied_embeddings: bool | None = None
    split_fused: bool = False
    matrix_embeddings: bool = False


@dataclass
class MethodSection:
    """A method is a DP strategy and a TP strategy (`canzona.plan.registry`). ``method=NAME``
    (``method.name``) is a preset that sets both; ``method.dp`` / ``method.tp`` given beside it
    win. A validated config has both filled in, and ``name`` only when the pair is a preset's."""

    name: str | None = "canzona"
    dp: str | None = None  # ddp | zero1_atomic | balanced | layerwise | zero1
    tp: str | None = None  # duplicated | async | async_balanced | local

    @property
    def label(self) -> str:
        """What tables and folder names call the method: the preset, else ``<dp>+<tp>``."""
        return self.name or f"{self.dp}+{self.tp}"

    @property
    def rung(self) -> str | None:
        """The authors' ablation-ladder name of the pair (``1_0-0_0``), if it is on the ladder."""
        return methods.rung(str(self.dp), str(self.tp))


@dataclass
class ParallelSection:
    dp: int = 1
    tp: int = 1
    # Megatron's --sequence-parallel: activations outside the TP regions (norms, residuals) split
    # along the sequence over TP; all-gather / reduce-scatter in place of each TP all-reduce.
    # Ignored at TP 1, as Megatron ignores it.
    sequence_parallel: bool = False


@dataclass
class CanzonaSection:
    alpha: float = 1.0
    # The cost model (`canzona.cost`): auto is measured time on this machine's device (its
    # calibration cache, taken when first needed), or the roofline of `cost_profile` for a
    # device this machine does not have; measured, roofline, flops, numel explicitly.
    cost: str = "auto"
    grouping: str = "rounds"
    # Micro-group capacity: the most a group may put on one TP rank, as a fraction of the
    # per-rank ideal load (the TP group's total / tp). Cost-model independent; 0.125 gives
    # about 8 micro-groups per step.
    capacity: float = 0.125
    # DP partitioner: minmax (exact per-bucket min-max split) or snap (the paper's rule).
    dp_variant: str = "minmax"
    pipeline_depth: int = 2
    # measured from this profile's table (python -m canzona.calibrate) instead of the cache
    measured_profile: str | None = None
    # roofline: the device profile (a name under profiles/ or a YAML path) of CUDA plans made
    # where no GPU is visible, and of canzona.cost=roofline
    cost_profile: str = "h100"
    # where the calibration cache lives (default: $CANZONA_CACHE_DIR, else
    # $XDG_CACHE_HOME/canzona, else ~/.cache/canzona)
    cost_cache: str | None = None
    # flops cost model: matmul-flop equivalents charged per element of an elementwise update
    elementwise_flops: float = 512.0


@dataclass
class BucketSection:
    # Megatron's default is max(40M, 1M * dp) elements; None means that default.
    size: int | None = None


@dataclass
class DistSection:
    device: str = "auto"
    dp_collective: str = "auto"
    sync_variant: str = "all_reduce"
    overlap_grad_reduce: bool = True
    # Parameter all-gather after the step overlapped with the next forward (Megatron's
    # --overlap-param-gather): each bucket waited for in the forward pre-hook of the first
    # module that uses it. Only methods that gather parameters are affected.
    overlap_param_gather: bool = True
    timeout_s: float = 300.0
    threads_per_rank: int | None = None
    # Dry run (`canzona.trial.dryrun`): run the listed ranks of the job on this CPU with fake
    # CUDA tensors and torch's fake process group at the job's world size, and report each
    # rank's peak device memory and its collectives instead of training.
    dry_run: bool = False
    # Ranks to run: ranks and the words first / last, comma-separated ("0,255", "first,last") or
    # a list ([0, 255]).
    dry_run_ranks: Any = "first,last"
    # Memory of the device the job runs on, GiB (2^30 bytes): a rank whose peak exceeds it fails
    # the dry run (the report also shows every rank against 80 and 141 GiB).
    dry_run_memory_gb: float = 80.0


@dataclass
class TrainSection:
    # Model parameters and activations: bf16 (fp32 main parameters and fp32 gradients in the
    # optimizer, as Megatron's --bf16), fp32, or auto: bf16 on CUDA, and on CPUs with native bf16
    # dot products (AVX512-BF16 / AMX), else fp32 (emulated bf16 matmuls would make forward and
    # backward slower than fp32 and distort every ratio against the optimizer step).
    dtype: str = "auto"
    steps: int = 5
    warmup: int = 2
    seed: int = 1234
    micro_batch: int = 2
    # Micro-batches per iteration (Megatron's gradient accumulation: the global batch is
    # dp x grad_accum x micro_batch sequences; gradients are reduced once, after the last one).
    grad_accum: int = 1
    seq_len: int = 64
    # Activation recomputation: "full" keeps only each decoder layer's input and recomputes the
    # layer's forward in backward (Megatron's --recompute-granularity full --recompute-method
    # uniform --recompute-num-layers 1); "none" keeps every activation.
    recompute: str = "none"
    fail_on_rank: int | None = None  # test hook: this rank raises at step `fail_at_step`
    fail_at_step: int = 0


@dataclass
class TrialConfig:
    model: ModelSection = field(default_factory=ModelSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    method: MethodSection = field(default_factory=MethodSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    canzona: CanzonaSection = field(default_factory=CanzonaSection)
    bucket: BucketSection = field(default_factory=BucketSection)
    dist: DistSection = field(default_factory=DistSection)
    train: TrainSection = field(default_factory=TrainSection)
    out: str | None = None
    save_params: str | None = None

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Shorthands accepted on the command line for convenience: `model=qwen3-8b optimizer=soap`.
SHORTHANDS = {"model": "model.name", "optimizer": "optimizer.name", "method": "method.name"}


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def validate(cfg: TrialConfig) -> TrialConfig:
    """Check every value and the layout; raise ConfigError with a one-line message."""
    optimizers.check_settings(cfg.optimizer)  # name, choices and bounds of every optimizer.* key
    m = cfg.method
    m.name, m.dp, m.tp = methods.resolve(m.name, m.dp, m.tp)
    _choice("canzona.cost", cfg.canzona.cost, COSTS)
    _choice("canzona.grouping", cfg.canzona.grouping, GROUPINGS)
    _choice("canzona.dp_variant", cfg.canzona.dp_variant, ("minmax", "snap"))
    _choice("dist.dp_collective", cfg.dist.dp_collective, DP_COLLECTIVES)
    _choice("dist.sync_variant", cfg.dist.sync_variant, SYNC_VARIANTS)
    _choice("dist.device", cfg.dist.device, DEVICES)
    _choice("train.dtype", cfg.train.dtype, DTYPES)
    _choice("train.recompute", cfg.train.recompute, RECOMPUTE)
    if not 0.0 <= cfg.canzona.alpha <= 1.0:
        raise ConfigError(f"canzona.alpha={cfg.canzona.alpha} must be in [0, 1]")
    if not 0.0 < cfg.canzona.capacity <= 1.0:
        raise ConfigError(f"canzona.capacity={cfg.canzona.capacity} must be a fraction in (0, 1]")
    if cfg.canzona.elementwise_flops <= 0:
        raise ConfigError(f"canzona.elementwise_flops={cfg.canzona.elementwise_flops} must be positive")
    if cfg.canzona.pipeline_depth < 0:
        raise ConfigError(f"canzona.pipeline_depth={cfg.canzona.pipeline_depth} must be >= 0")
    if cfg.parallel.dp < 1:
        raise ConfigError(f"parallel.dp={cfg.parallel.dp} must be a positive integer")
    if cfg.bucket.size is not None and cfg.bucket.size < 1:
        raise ConfigError(f"bucket.size={cfg.bucket.size} must be a positive number of elements")
    if cfg.train.grad_accum < 1:
        raise ConfigError(f"train.grad_accum={cfg.train.grad_accum} must be a positive number of micro-batches")
    if cfg.train.steps < 1 or cfg.train.warmup < 0:
        raise ConfigError(f"train.steps={cfg.train.steps} must be >= 1 and train.warmup={cfg.train.warmup} >= 0")
    check_tp(cfg.model_cfg(), cfg.parallel.tp)
    methods.check(m.dp, m.tp, optimizers.get(cfg.optimizer.name).matrix, cfg.parallel.tp)
    if cfg.sequence_parallel and cfg.train.seq_len % cfg.parallel.tp:
        raise ConfigError(f"parallel.sequence_parallel=true splits the sequence over TP: parallel.tp={cfg.parallel.tp} "
                          f"must divide train.seq_len={cfg.train.seq_len}")
    if cfg.dist.dry_run:
        _check_dry_run(cfg)
    return cfg


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
    """Build a validated TrialConfig from an optional base dict and ``key=value`` overrides."""
    args = split_argv(overrides, shorthands=SHORTHANDS)
    obj = build(_schema(), args.overrides, base=base)
    assert isinstance(obj, TrialConfig)
    return validate(obj)


def parse_cli(argv: list[str], flags: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> tuple[TrialConfig, Arguments]:
    """A trial command line: ``key=value`` overrides plus the allowed ``--flags`` / ``--options``."""
    args = split_argv(argv, flags=flags, options=options, shorthands=SHORTHANDS)
    obj = build(_schema(), args.overrides)
    assert isinstance(obj, TrialConfig)
    return validate(obj), args
