"""The harness's buffer layout and baseline owners against megatron-core 0.16.1's own code.

Why: every method plans on `canzona.plan.buckets.build_layout`, a re-derivation of Megatron's
``_ParamAndGradBuffer``, and two baselines are named after Megatron's optimizers (`zero1_atomic`:
the distributed optimizer with whole-tensor ownership; `layerwise`: 0.16's
``LayerWiseDistributedOptimizer``). Nothing but Megatron's code can say the re-derivations are
right, so here Megatron's code computes them and the harness must agree exactly:

- registration order: ``GPTModel(..., get_gpt_layer_local_spec(qk_layernorm=True))``'s
  ``named_parameters()`` equals `build_inventory`'s names (tiny configs, meta device);
- the buffer: ``_ParamAndGradBuffer.__init__`` run on meta-device params of the inventory's
  TP-local shapes (so the 32B model costs nothing): bucket boundaries, per-param offsets and
  bucket (``param_index_map``), order and padding equal `build_layout`'s, for every dense Qwen3
  size, DP 8..256, TP 1 (and 8 for the two largest), Megatron's default bucket size (read back
  from its own ``DistributedDataParallel``) and 4e8;
- the DP shards: ``DistributedOptimizer._build_model_gbuf_range`` for every DP rank and bucket
  gives each rank's piece of each param; it must equal the harness's equal shards cut by the
  harness's slots, and `zero1_atomic`'s owners must be the rank holding each param's first element;
- `layerwise`: ``LayerWiseDistributedOptimizer.shard_params`` on the param groups Megatron's
  Muon path builds (``_get_param_groups``) deals the same owners as the harness.

Megatron reads only ``size()`` / ``rank()`` of its process groups here, so a stand-in replaces
them; its CUDA allocation is sent to the meta device and its bucket log is skipped. The authors'
fork (liangyuwang/Megatron-Canzona, megatron-core 0.12/0.13 era) keeps the matrix-optimizer
params in a buffer of their own, which ``zero1_atomic`` follows (`test_atomic_owners_are_the_authors`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from canzona.config import load_config
from canzona.cost import NumelCost
from canzona.inventory import QWEN3, ModelConfig, ParamSpec, build_inventory
from canzona.plan.buckets import BufferLayout
from canzona.plan.dp import atomic_cuts, equal_cuts, owners_from_ranges, ranges_from_cuts
from canzona.plan.from_config import plan_inputs
from canzona.plan.strategies import layerwise as layerwise_strategy
from canzona.plan.strategies import zero1_atomic
from canzona.plan.types import PlanInputs

pytest.importorskip("megatron.core")

from megatron.core.distributed import param_and_grad_buffer as pgb  # noqa: E402
from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import _get_param_groups  # noqa: E402
from megatron.core.optimizer import layer_wise_optimizer as lwo  # noqa: E402
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range  # noqa: E402
from megatron.core.optimizer.optimizer_config import OptimizerConfig  # noqa: E402

DENSE = list(QWEN3)
DPS = (8, 16, 32, 64, 128, 256)
BIG = 400_000_000
CASES = [(m, dp, 1) for m in DENSE for dp in DPS] + [(m, dp, 8) for m in DENSE[-2:] for dp in DPS]


class _Group:
    """A process group as far as the code exercised here reads one: its size and this rank."""

    def __init__(self, size: int, rank: int = 0) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def _config(model: str, dp: int, tp: int, bucket: int | None, method: str = "atomic"):
    over = [f"model={model}", f"parallel.dp={dp}", f"parallel.tp={tp}", f"method={method}"]
    return load_config(over + ([f"bucket.size={bucket}"] if bucket else []))


@functools.cache
def _inputs(model: str, dp: int, tp: int, bucket: int | None, method: str = "atomic") -> PlanInputs:
    """The planners' inputs exactly as `canzona.plan.from_config` builds them (None: the harness's default
    bucket size, `TrialConfig.bucket_size`)."""
    return plan_inputs(_config(model, dp, tp, bucket, method), NumelCost())


def _meta_params(params: tuple[ParamSpec, ...], tp: int) -> list[torch.nn.Parameter]:
    """One meta-device parameter per inventory entry, of its TP-local shape, with the attributes
    Megatron reads (``allreduce``: dense; ``is_embedding_or_output_parameter``, set by
    ``LanguageModule.setup_embeddings_and_output_layer``). No ``shared_embedding``: with one
    pipeline stage a tied model's output layer has no weight of its own and the flag stays unset."""
    out = []
    for spec in params:
        p = torch.nn.Parameter(torch.empty(spec.local_shape(tp), device="meta", dtype=torch.bfloat16))
        p.allreduce = True
        if spec.name.startswith(("embedding.", "output_layer.")):
            p.is_embedding_or_output_parameter = True
        out.append(p)
    return out


@contextmanager
def _megatron_on_meta() -> Iterator[None]:
    """Megatron's buffer allocates on ``torch.cuda.current_device()`` and logs through its process
    groups: send the allocation to the meta device and skip the log (no arithmetic involved)."""
    with mock.patch.object(torch.cuda, "current_device", lambda: "meta"), \
            mock.patch.object(pgb, "log_on_each_pipeline_stage", lambda *a, **k: None):
        yield


def _megatron_buffer(meta: list[torch.nn.Parameter], names: list[str], dp: int,
                     bucket_size: int) -> pgb._ParamAndGradBuffer:
    """megatron-core's own ``_ParamAndGradBuffer`` over ``meta`` (registration order), as its DDP
    builds it with the distributed optimizer (bf16 params, fp32 grads)."""
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
    with _megatron_on_meta():
        return pgb._ParamAndGradBuffer(
            ddp, torch.bfloat16, torch.float32, meta, _Group(dp), bucket_size, dict(zip(meta, names)),
            1.0 / dp, list(range(len(meta))), False, SimpleNamespace(tp=_Group(1), dp_cp=_Group(dp)))


@functools.cache
def _megatron_default_bucket_size(dp: int) -> int:
    """The bucket size megatron-core's ``DistributedDataParallel`` picks when none is given, read
    back from its config after building it over a one-parameter module."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True)
    module = torch.nn.Linear(128, 1, bias=False, device="meta")
    groups = {k: _Group(dp if "dp" in k else 1) for k in
              ("dp", "dp_cp", "intra_dp_cp", "expt_dp", "intra_expt_dp", "tp", "pp", "ep")}
    with _megatron_on_meta():
        DistributedDataParallel(cfg, ddp, module, pg_collection=ProcessGroupCollection(**groups))
    return ddp.bucket_size


@functools.cache
def _megatron(model: str, dp: int, tp: int, bucket: int | None) -> tuple[PlanInputs, pgb._ParamAndGradBuffer,
                                                                         list[torch.nn.Parameter]]:
    """The harness's inputs, and Megatron's buffer over the same params (memoised)."""
    inputs = _inputs(model, dp, tp, bucket)
    meta = _meta_params(inputs.params, tp)
    size = bucket if bucket is not None else _megatron_default_bucket_size(dp)
    return inputs, _megatron_buffer(meta, [p.name for p in inputs.params], dp, size), meta


def _assert_same_buffer(layout: BufferLayout, buf: pgb._ParamAndGradBuffer, meta: list[torch.nn.Parameter]) -> None:
    assert buf.bucket_indices == [(b.start, b.end) for b in layout.buckets]
    assert buf.numel == layout.numel
    for b, mb in zip(layout.buckets, buf.buckets):
        assert (mb.offset, mb.offset + mb.grad_data.numel()) == (b.start, b.end)
        assert mb.params_list == [meta[s.index] for s in b.params]  # buffer order
        for s in b.params:
            assert buf.param_index_map[meta[s.index]] == (s.start, s.end, b.index)


# ---------------------------------------------------------------- registration order
def _tiny_gpt_names(tied: bool, *, gated: bool = True, norm: str = "RMSNorm", qk_norm: bool = True,
                    position: str = "rope", moe: dict | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a tiny GPTModel's trainable params, Megatron's local spec; an MoE layer's
    experts (``SequentialMLP``: ``experts.local_experts.<e>.linear_fc1.weight``) renamed as the
    grouped-GEMM experts the inventory names (``experts.linear_fc1.weight<e>``) and ordered so
    (every expert's fc1, then every fc2)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer import TransformerConfig

    moe_kw = {} if moe is None else dict(num_moe_experts=moe["experts"], moe_router_topk=2,
                                         moe_ffn_hidden_size=16, moe_shared_expert_intermediate_size=moe["shared"])
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, kv_channels=8,
                            ffn_hidden_size=64, gated_linear_unit=gated, normalization=norm, qk_layernorm=qk_norm,
                            add_bias_linear=False, use_cpu_initialization=True, perform_initialization=False, **moe_kw)
    names = ("tp", "cp", "pp", "embd", "pos_embd", "dp", "dp_cp", "ep", "expt_tp", "expt_dp", "tp_ep", "tp_cp", "tp_dp_cp")
    groups = ProcessGroupCollection(**{k: _Group(1) for k in names})
    spec = get_gpt_layer_local_spec(qk_layernorm=qk_norm, normalization=norm,
                                    num_experts=None if moe is None else moe["experts"], moe_grouped_gemm=False)
    with torch.device("meta"):
        model = GPTModel(cfg, spec, vocab_size=128, max_sequence_length=16, share_embeddings_and_output_weights=tied,
                         position_embedding_type=position, pg_collection=groups)
    out = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    expert = re.compile(r"^(.*\.experts)\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")
    renamed = [(expert.sub(r"\1.\3.weight\2", n), shape, bool(expert.match(n))) for n, shape in out]
    result, pending = [], []
    for name, shape, is_expert in renamed:  # each layer's experts: fc1 of every expert, then fc2
        if is_expert:
            pending.append((name, shape))
            continue
        result += sorted(pending, key=lambda e: ".linear_fc2." in e[0])
        pending = []
        result.append((name, shape))
    return result + sorted(pending, key=lambda e: ".linear_fc2." in e[0])


@pytest.mark.parametrize("tied", [True, False])
def test_registration_order_is_megatrons(tied: bool) -> None:
    cfg = ModelConfig("tiny", 32, 32, 2, 4, 2, 8, 128, tied)
    assert [p.name for p in build_inventory(cfg)] == [n for n, _ in _tiny_gpt_names(tied)]


@pytest.mark.parametrize("arch", ["gelu-layernorm-learned", "moe-shared-expert"])
def test_other_architectures_are_laid_out_as_megatron(arch: str) -> None:
    """A spec beyond Qwen3's architecture (`canzona.model_spec`) has Megatron's names, shapes and
    order: GeLU's single fc1, LayerNorm's biases, a learned position embedding; an MoE layer's
    router, experts, then its shared expert."""
    if arch == "gelu-layernorm-learned":
        cfg = ModelConfig("tiny", 32, 64, 2, 4, 2, 8, 128, True, gated_mlp=False, norm="layernorm", qk_norm=False,
                          position="learned", max_positions=16)
        want = _tiny_gpt_names(True, gated=False, norm="LayerNorm", qk_norm=False, position="learned_absolute")
    else:
        cfg = ModelConfig("tiny", 32, 16, 2, 4, 2, 8, 128, False, num_experts=2, top_k=2, shared_expert_ffn=24)
        want = _tiny_gpt_names(False, moe={"experts": 2, "shared": 24})
    assert [(p.name, p.shape) for p in build_inventory(cfg)] == want


# ---------------------------------------------------------------- the buffer
@pytest.mark.parametrize("dp", DPS)
def test_default_bucket_size_is_megatrons(dp: int) -> None:
    assert _config("qwen3-0.6b", dp, 1, None).bucket_size() == _megatron_default_bucket_size(dp)


@pytest.mark.parametrize("bucket", [None, BIG], ids=["default", "4e8"])
@pytest.mark.parametrize("model,dp,tp", CASES)
def test_buffer_layout_is_megatrons(model: str, dp: int, tp: int, bucket: int | None) -> None:
    inputs, buf, meta = _megatron(model, dp, tp, bucket)
    _assert_same_buffer(inputs.layout, buf, meta)


# ---------------------------------------------------------------- DP shards, zero1_atomic
def _megatron_shards(buf: pgb._ParamAndGradBuffer, dp: int) -> list[dict]:
    """Per bucket, ``{(param, rank): (world start, world end, start in param)}`` from Megatron's code:
    each rank's shard is its view of the bucket from ``shard_buffer`` (what the reduce-scatter
    hands it), and its pieces of the params come from the distributed optimizer's
    ``_build_model_gbuf_param_range_map`` on that range. ``_build_model_gbuf_range`` (which rebuilds
    every rank's range on each call, so DP^2 steps per bucket) must give the first and last rank
    the same pieces. Ranges never leave their bucket, so each call is handed the bucket's params."""
    out = []
    for k, bucket in enumerate(buf.buckets):
        index_map = {p: buf.param_index_map[p] for p in bucket.params_list}
        pieces = {}
        base = buf.grad_data.storage_offset()
        for r, view in enumerate(pgb.shard_buffer(bucket.grad_data, dp)):
            start = view.storage_offset() - base
            shard = Range(start, start + view.numel())
            mine = _pieces(DistributedOptimizer._build_model_gbuf_param_range_map(index_map, shard, bucket.offset), r)
            if r in (0, dp - 1):
                own = SimpleNamespace(data_parallel_group=_Group(dp, r), buckets=buf.buckets, param_index_map=index_map)
                assert _pieces(DistributedOptimizer._build_model_gbuf_range(own, k)["param_map"], r) == mine
            pieces.update(mine)
        out.append(pieces)
    return out


def _pieces(param_map: dict, rank: int) -> dict:
    """Megatron's param range map of one rank as plain ``{(param, rank): (start, end, offset)}``."""
    return {(p, rank): (m["gbuf_world"].start, m["gbuf_world"].end, m["param"].start) for p, m in param_map.items()}


def _harness_shards(layout: BufferLayout, meta: list[torch.nn.Parameter]) -> list[dict]:
    """The same pieces from the harness's equal shards (`canzona.plan.dp.equal_cuts`)."""
    out = []
    for bucket, cuts in zip(layout.buckets, equal_cuts(layout)):
        pieces = {}
        for r in range(layout.dp):
            for s in bucket.params:
                a, b = max(s.start, cuts[r]), min(s.end, cuts[r + 1])
                if b > a:
                    pieces[(meta[s.index], r)] = (a, b, a - s.start)
        out.append(pieces)
    return out


def _first_element_owners(shards: list[dict], meta: list[torch.nn.Parameter]) -> list[int]:
    owner = {p: r for pieces in shards for (p, r), (_, _, offset) in pieces.items() if offset == 0}
    return [owner[p] for p in meta]


def _heavy(model: str, dp: int, tp: int) -> bool:
    """Megatron's shard map walks every param of a bucket for every rank: DP >= 64 (about 20 s in
    all) runs in the slow pass; the fast pass keeps DP 8 to 32 (the layout test covers every DP)."""
    return dp >= 64


SHARD_CASES = [pytest.param(*c, marks=pytest.mark.slow) if _heavy(*c) else c for c in CASES]


@pytest.mark.parametrize("bucket", [None, BIG], ids=["default", "4e8"])
@pytest.mark.parametrize("model,dp,tp", SHARD_CASES)
def test_shards_and_first_element_owners_are_megatrons(model: str, dp: int, tp: int, bucket: int | None) -> None:
    """The shared buffer's equal shards are Megatron's distributed optimizer's, and the atomic
    rule on them (`atomic_cuts`: whole params to the rank whose shard holds their first element)
    gives Megatron's first-element owners; ``zero1_atomic`` applies that rule to the authors'
    buffers (`test_atomic_owners_are_the_authors`)."""
    inputs, buf, meta = _megatron(model, dp, tp, bucket)
    shards = _megatron_shards(buf, dp)
    assert shards == _harness_shards(inputs.layout, meta)
    owners = owners_from_ranges(inputs.layout, ranges_from_cuts(atomic_cuts(inputs.layout)))
    assert [owners[i] for i in range(len(meta))] == _first_element_owners(shards, meta)


def _authors_matrix(spec: ParamSpec) -> bool:
    """Megatron-Canzona's ``is_param_use_matrix_based_optim`` (matrix_based_optimizer/utils.py):
    2-D, and not the embedding, output layer, router or gate weight."""
    return len(spec.shape) == 2 and not any(k in spec.name for k in ("word_embeddings", "output_layer",
                                                                     "router", "gate_weight"))


def _authors_atomic_owners(inputs: PlanInputs, dp: int, tp: int, bucket: int) -> dict[int, int]:
    """The authors' ``zero1_atomic`` owners. Their DDP (megatron/core/distributed/
    distributed_data_parallel.py of liangyuwang/Megatron-Canzona) puts the matrix-optimizer params
    into a buffer of their own (``dense_matrix_based_opt_params``, ``is_matrix_based_opt=True``),
    laid out by the same ``_ParamAndGradBuffer`` code as 0.16.1's (their param_and_grad_buffer.py:
    reverse order, 64-element starts, close at >= bucket_size, pad to lcm(dp, 128)); their
    ``_build_model_gbuf_param_range_map_whole_tensor`` (matrix_based_optimizer/distrib_optimizer.py)
    gives a param to the rank whose equal shard ``[r * size / dp, (r + 1) * size / dp)`` of the
    bucket holds its first element."""
    index = [i for i, p in enumerate(inputs.params) if _authors_matrix(p)]
    meta = _meta_params(tuple(inputs.params[i] for i in index), tp)
    buf = _megatron_buffer(meta, [inputs.params[i].name for i in index], dp, bucket)
    position = {id(p): i for i, p in zip(index, meta)}
    owners = {}
    for bucket_ in buf.buckets:
        shard = bucket_.grad_data.numel() // dp
        for p in bucket_.params_list:
            owners[position[id(p)]] = (buf.param_index_map[p][0] - bucket_.offset) // shard
    return owners


@pytest.mark.parametrize("bucket", [None, BIG], ids=["default", "4e8"])
@pytest.mark.parametrize("model,dp,tp", [("qwen3-0.6b", 8, 1), ("qwen3-0.6b", 32, 1), ("qwen3-1.7b", 8, 1),
                                         ("qwen3-8b", 64, 1), ("qwen3-32b", 32, 8)])
def test_atomic_owners_are_the_authors(model: str, dp: int, tp: int, bucket: int | None) -> None:
    """``zero1_atomic`` follows the authors' fork: its matrices' owners are the first-element
    owners of the authors' matrix buffer, laid out by megatron-core's own buffer code."""
    inputs = _inputs(model, dp, tp, bucket)
    authors = _authors_atomic_owners(inputs, dp, tp, bucket or _megatron_default_bucket_size(dp))
    (candidate,) = zero1_atomic.candidates(inputs, frozenset())
    assert authors and {i: candidate.dp_owner[i] for i in authors} == authors


def test_the_authors_layout_differs_from_megatrons_one_buffer() -> None:
    """Why ``zero1_atomic`` needs a buffer of its own: on megatron-core's one shared buffer the
    first-element owners of the matrices differ from the authors' (the issue's 0.6B DP 32 case)."""
    inputs, buf, meta = _megatron("qwen3-0.6b", 32, 1, BIG)
    shared = _first_element_owners(_megatron_shards(buf, 32), meta)
    authors = _authors_atomic_owners(inputs, 32, 1, BIG)
    assert {i: shared[i] for i in authors} != authors


# ---------------------------------------------------------------- layerwise
def _megatron_layerwise_owners(params: tuple[ParamSpec, ...], tp: int, dp: int) -> list[int]:
    """0.16.1's ``LayerWiseDistributedOptimizer.shard_params`` on the optimizers its Muon path
    builds (``get_megatron_muon_optimizer``, optimizer/muon.py, which needs emerging-optimizers to
    run): the Muon optimizer over the 2-D non-embedding params, then the Adam optimizer over the
    rest, each with ``_get_param_groups``'s groups (the requires_grad switches are muon.py's)."""
    meta = _meta_params(params, tp)
    chunk = SimpleNamespace(named_parameters=lambda: zip([p.name for p in params], meta))
    linear = [p.ndim == 2 and not getattr(p, "is_embedding_or_output_parameter", False) for p in meta]
    config = OptimizerConfig(optimizer="adam", lr=1e-3)

    def groups(select: bool) -> list[dict]:
        for p, is_linear in zip(meta, linear):
            p.requires_grad = is_linear == select
        with mock.patch.object(torch.distributed, "get_world_size", lambda *a: 1), \
                mock.patch.object(torch.distributed, "all_gather_object", lambda out, obj, *a: out.__setitem__(0, obj)):
            return [g for g in _get_param_groups([chunk], config, None) if not g["is_expert_parallel"]]

    optimizers = [SimpleNamespace(param_groups=groups(True)), SimpleNamespace(param_groups=groups(False))]
    fake = SimpleNamespace(pg_collection=SimpleNamespace(dp_cp=_Group(dp), expt_dp=_Group(1)))
    with mock.patch.object(lwo, "get_pg_size", lambda g: g.size()), \
            mock.patch.object(lwo, "get_pg_rank", lambda g: g.rank()):
        lwo.LayerWiseDistributedOptimizer.shard_params(fake, optimizers)
    owner = {id(p): r for r, ps in enumerate(fake.dp_cp_params_list) for p in ps}
    return [owner[id(p)] for p in meta]


@pytest.mark.parametrize("dp", [8, 32])
@pytest.mark.parametrize("model", DENSE)
def test_layerwise_owners_are_megatron_016s(model: str, dp: int) -> None:
    inputs = _inputs(model, dp, 1, None, "layerwise")
    (candidate,) = layerwise_strategy.candidates(inputs, frozenset())
    assert list(candidate.dp_owner) == _megatron_layerwise_owners(inputs.params, 1, dp)
