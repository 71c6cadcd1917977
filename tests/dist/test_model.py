"""Qwen3 model: inventory alignment, TP-independent init, tp=2 == tp=1, dp=2 == dp=1, fused splits."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from canzona.inventory import build_inventory, model_config
from canzona.model.data import synthetic_batch

SEED = 1234
CONFIGS = {
    "tied": ("qwen3-0.6b", 16, 2),  # hidden 64, ffn 192, 16 heads / 8 kv, head_dim 8, vocab 9496
    "untied": ("qwen3-8b", 16, 2),  # hidden 256, ffn 768, 32 heads / 8 kv, untied output layer
}
SEQ = 16
MICRO = 2  # rows per DP rank in the dp=2 run; the tp runs use 2 * MICRO rows


def _cfg(key):
    name, div, layers = CONFIGS[key]
    return model_config(name, width_div=div, num_layers=layers)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _assert_close_dicts(got: dict, want: dict, rel: float, what: str) -> None:
    assert list(got) == list(want), what
    bad = {n: _rel(got[n], want[n]) for n in want if got[n].shape != want[n].shape or _rel(got[n], want[n]) > rel}
    assert not bad, f"{what}: relative errors above {rel}: {bad}"


# --------------------------------------------------------------------------------------------
# Independent single-device reference: plain torch on the full tensors, splitting the fused
# weights with the inventory's ``split_fused`` row blocks (not with the model's code).


def _rows(w: torch.Tensor, sub) -> torch.Tensor:
    return torch.cat([w[a:b:s] for a, b, s in sub.row_blocks])


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope_ref(x, theta=1e6):  # x [b, h, s, d]
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference_loss(cfg, full: dict, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    specs = {s.name: s for s in build_inventory(cfg, split_fused=True)}
    b, s = tokens.shape
    hd, qpg = cfg.head_dim, cfg.q_per_group
    x = full["embedding.word_embeddings.weight"][tokens]
    for i in range(cfg.num_layers):
        p = f"decoder.layers.{i}"
        qkv = f"{p}.self_attention.linear_qkv.weight"
        wq, wk, wv = (_rows(full[qkv], sub) for sub in specs[qkv].subs)
        h = _rms(x, full[f"{p}.input_layernorm.weight"])
        q = (h @ wq.T).view(b, s, cfg.heads, hd)
        k = (h @ wk.T).view(b, s, cfg.kv_heads, hd)
        v = (h @ wv.T).view(b, s, cfg.kv_heads, hd).transpose(1, 2)
        q = _rope_ref(_rms(q, full[f"{p}.self_attention.q_layernorm.weight"]).transpose(1, 2))
        k = _rope_ref(_rms(k, full[f"{p}.self_attention.k_layernorm.weight"]).transpose(1, 2))
        kv_of_head = torch.arange(cfg.heads) // qpg  # GQA: query head j reads KV head j // qpg
        att = (q @ k[:, kv_of_head].transpose(-1, -2)) / hd**0.5
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        o = (att @ v[:, kv_of_head]).transpose(1, 2).reshape(b, s, cfg.heads * hd)
        x = x + o @ full[f"{p}.self_attention.linear_proj.weight"].T
        fc1 = f"{p}.mlp.linear_fc1.weight"
        wg, wu = (_rows(full[fc1], sub) for sub in specs[fc1].subs)
        h = _rms(x, full[f"{p}.pre_mlp_layernorm.weight"])
        x = x + (F.silu(h @ wg.T) * (h @ wu.T)) @ full[f"{p}.mlp.linear_fc2.weight"].T
    x = _rms(x, full["decoder.final_layernorm.weight"])
    out = full["embedding.word_embeddings.weight" if cfg.tied_embeddings else "output_layer.weight"]
    return F.cross_entropy((x @ out.T).reshape(-1, cfg.vocab), labels.reshape(-1))


def rich_weights(cfg, seed: int) -> dict[str, torch.Tensor]:
    """Full weights far from the init (norm weights != 1, O(1) activations), so every mistake
    in the forward moves the loss by much more than the tolerance."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for s in build_inventory(cfg):
        if len(s.shape) == 1:
            out[s.name] = 1.0 + 0.3 * torch.randn(s.shape, generator=g)
        else:
            std = 0.5 if "embedding" in s.name else s.shape[1] ** -0.5
            out[s.name] = std * torch.randn(s.shape, generator=g)
    return out


def fused_split_mismatch(model, full: dict, x: torch.Tensor, specs) -> dict[str, float]:
    """Relative error between what the model's attention/MLP use as q, k, v, gate, up and
    ``x @ W_sub.T`` for the inventory sub-matrices (this rank's heads / ffn rows only)."""
    tp, r = model.tp, model.tp_rank
    errs = {}
    for i, layer in enumerate(model.decoder.layers):
        attn, mlp = layer.self_attention, layer.mlp
        b, s, _ = x.shape
        q, k, v = attn.split_qkv(attn.linear_qkv(x)[0])
        qkv = f"decoder.layers.{i}.self_attention.linear_qkv.weight"
        for got, sub in zip((q, k, v), specs[qkv].subs):
            w = _rows(full[qkv], sub)
            n = w.shape[0] // tp  # q rows are group-major, so rank r holds a contiguous block
            errs[sub.name] = _rel(got.reshape(b, s, -1), x @ w[r * n : (r + 1) * n].T)
        h = mlp.linear_fc1(x)[0]
        fc1 = f"decoder.layers.{i}.mlp.linear_fc1.weight"
        for got, sub in zip((h[..., 0::2], h[..., 1::2]), specs[fc1].subs):
            w = _rows(full[fc1], sub)
            n = w.shape[0] // tp
            errs[sub.name] = _rel(got, x @ w[r * n : (r + 1) * n].T)
    return errs


def _wrong_specs(cfg):
    """A plausible but wrong reading of the fused layouts: [Q | K | V] and [gate | up] blocks."""
    from dataclasses import replace

    specs = {s.name: s for s in build_inventory(cfg, split_fused=True)}
    hd = cfg.head_dim
    nq, nkv = cfg.heads * hd, cfg.kv_heads * hd
    for n, s in list(specs.items()):
        if n.endswith("linear_qkv.weight"):
            blocks = [((0, nq, 1),), ((nq, nq + nkv, 1),), ((nq + nkv, nq + 2 * nkv, 1),)]
        elif n.endswith("linear_fc1.weight"):
            blocks = [((0, cfg.ffn, 1),), ((cfg.ffn, 2 * cfg.ffn, 1),)]
        else:
            continue
        specs[n] = replace(s, subs=tuple(replace(sub, row_blocks=b) for sub, b in zip(s.subs, blocks)))
    return specs


# --------------------------------------------------------------------------------------------
# Fast, in-process (world of one gloo rank).


@pytest.fixture(scope="module")
def single_rank():
    from canzona.model import destroy_parallel, init_parallel

    # init_parallel exports the launch variables (LOCAL_RANK, MASTER_ADDR, ...) for env://; put the
    # whole environment back, or later tests (a Slurm job inherits it) see a launched process.
    saved = dict(os.environ)
    os.environ.update(RANK="0", WORLD_SIZE="1")
    os.environ.pop("MASTER_PORT", None)
    torch.manual_seed(0)
    init_parallel(1, "gloo", 30.0)
    yield
    destroy_parallel()
    os.environ.clear()
    os.environ.update(saved)


def test_data_dp_split_equals_global_rows():
    cfg = _cfg("tied")
    tok, lab = synthetic_batch(cfg, 2 * MICRO, SEQ, SEED, 3)
    parts = [synthetic_batch(cfg, MICRO, SEQ, SEED, 3, dp_rank=r, dp=2) for r in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), tok)
    assert torch.equal(torch.cat([p[1] for p in parts]), lab)
    assert torch.equal(tok[:, 1:], lab[:, :-1])
    assert tok.dtype == torch.int64 and 0 <= tok.min() and tok.max() < cfg.vocab
    assert not torch.equal(synthetic_batch(cfg, 2, SEQ, SEED, 4)[0], tok[:2])  # steps differ
    again = synthetic_batch(cfg, 2 * MICRO, SEQ, SEED, 3)
    assert torch.equal(again[0], tok)


def test_init_is_tp_independent():
    from full_tensors import init_full_state_dict

    from canzona.model.qwen3 import init_shard

    cfg = _cfg("untied")
    full = init_full_state_dict(cfg, SEED)
    for idx, spec in enumerate(build_inventory(cfg)):
        assert tuple(full[spec.name].shape) == spec.shape
        for tp in (2, 4, 8):
            shards = [init_shard(spec, idx, seed=SEED, num_layers=cfg.num_layers, tp=tp, tp_rank=r) for r in range(tp)]
            assert all(tuple(t.shape) == spec.local_shape(tp) for t in shards)
            cat = shards[0] if spec.tp_dim is None else torch.cat(shards, dim=spec.tp_dim)
            assert torch.equal(cat, full[spec.name]), (spec.name, tp)
    assert not torch.equal(full["output_layer.weight"], init_full_state_dict(cfg, SEED + 1)["output_layer.weight"])


@pytest.mark.parametrize("key", list(CONFIGS))
def test_names_shapes_reference_and_roundtrip(single_rank, key):
    from full_tensors import init_full_state_dict, load_full_state_dict, tp_partial_grad_params

    from canzona.model import build_model, full_state_dict

    cfg = _cfg(key)
    model = build_model(cfg, device="cpu", seed=SEED)
    inv = build_inventory(cfg)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == [(s.name, s.shape) for s in inv]
    assert model.param_specs() == inv
    assert [n for n, _ in tp_partial_grad_params(model)] == [s.name for s in inv if s.tp_grad_allreduce]
    full = full_state_dict(model)
    _assert_close_dicts(full, init_full_state_dict(cfg, SEED), 0.0, "init")

    other = rich_weights(cfg, SEED)
    load_full_state_dict(model, other)
    _assert_close_dicts(full_state_dict(model), other, 0.0, "round trip")

    tok, lab = synthetic_batch(cfg, 2 * MICRO, SEQ, SEED, 0)
    loss = model(tok, lab)
    loss.backward()
    ref_w = {k: v.double().requires_grad_() for k, v in other.items()}
    want = reference_loss(cfg, ref_w, tok, lab)
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-5 * want.item(), (loss.item(), want.item())
    assert abs(want.item() - math.log(cfg.vocab)) > 0.1  # the weights matter
    # one rotary table per model, made once for the sequence length (as megatron-core's cached one)
    tables = {id(layer.self_attention.rotary) for layer in model.decoder.layers}
    assert len(tables) == 1 and len(model.decoder.layers[0].self_attention.rotary._tables) == 1
    grads = {n: p.grad for n, p in model.named_parameters()}
    _assert_close_dicts(grads, {k: v.grad.float() for k, v in ref_w.items()}, 1e-4, "grads vs reference")
    with pytest.raises(KeyError):
        load_full_state_dict(model, {k: v for k, v in other.items() if "final" not in k})


def test_fused_split_check_can_fail(single_rank):
    from canzona.model import build_model, full_state_dict

    cfg = _cfg("untied")
    model = build_model(cfg, device="cpu", seed=SEED)
    full = full_state_dict(model)
    x = torch.randn(2, 5, cfg.hidden)
    right = fused_split_mismatch(model, full, x, {s.name: s for s in build_inventory(cfg, split_fused=True)})
    assert max(right.values()) < 1e-6, right
    wrong = fused_split_mismatch(model, full, x, _wrong_specs(cfg))
    assert len(wrong) == 5 * cfg.num_layers and min(wrong.values()) > 0.1, wrong


# --------------------------------------------------------------------------------------------
# Multi-process: tp=2 vs tp=1 and dp=2 vs dp=1, in one 2-rank run (re-initialising Megatron's
# groups in between), both model configs.


def _two_rank_worker(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from full_tensors import full_grad_dict, load_full_state_dict, tp_partial_grad_params

    from canzona.model import build_model, destroy_parallel, full_state_dict, init_parallel

    out: dict = {}
    ctx = init_parallel(2, "gloo", 30.0)
    assert (ctx.tp, ctx.tp_rank, ctx.dp) == (2, rank, 1)
    for key in CONFIGS:
        cfg = _cfg(key)
        model = build_model(cfg, device="cpu", seed=SEED)
        specs = build_inventory(cfg)
        local = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        full = full_state_dict(model)
        x = torch.randn(2, 5, cfg.hidden, generator=torch.Generator().manual_seed(7))
        split_err = fused_split_mismatch(model, full, x, {s.name: s for s in build_inventory(cfg, split_fused=True)})
        # round trip: other full weights in, the same full weights out
        other = rich_weights(cfg, SEED)
        load_full_state_dict(model, other)
        roundtrip = max(_rel(v, other[k]) for k, v in full_state_dict(model).items())
        tok, lab = synthetic_batch(cfg, 2 * MICRO, SEQ, SEED, 0)
        loss = model(tok, lab)
        loss.backward()
        grads = full_grad_dict(model)
        partial = {n: p.grad.clone() for n, p in tp_partial_grad_params(model)}
        out[key] = dict(
            local=local, want_local=[(s.name, s.local_shape(2)) for s in specs], full=full, loss=loss.item(),
            grads=grads, partial=partial, split_err=split_err, roundtrip=roundtrip,
        )

    destroy_parallel(process_group=False)
    ctx = init_parallel(1, "gloo", 30.0)
    assert (ctx.tp, ctx.dp, ctx.dp_rank) == (1, 2, rank)
    for key in CONFIGS:
        cfg = _cfg(key)
        model = build_model(cfg, device="cpu", seed=SEED)
        load_full_state_dict(model, rich_weights(cfg, SEED))
        tok, lab = synthetic_batch(cfg, 2 * MICRO, SEQ, SEED, 0)  # tp=1, dp=1 reference: all rows
        loss = model(tok, lab)
        loss.backward()
        ref_grads = full_grad_dict(model)
        ref = dict(loss=loss.item(), grads=ref_grads)
        model.zero_grad(set_to_none=True)
        tok, lab = synthetic_batch(cfg, MICRO, SEQ, SEED, 0, dp_rank=ctx.dp_rank, dp=ctx.dp)
        loss = model(tok, lab)
        loss.backward()
        dp_loss = loss.detach().clone()
        dist.all_reduce(dp_loss, group=ctx.dp_group)
        dp_grads = {}
        for n, p in model.named_parameters():
            g = p.grad.clone()
            dist.all_reduce(g, group=ctx.dp_group)
            dp_grads[n] = g / ctx.dp
        out[key].update(ref=ref, dp_loss=dp_loss.item() / ctx.dp, dp_grads=dp_grads)
    destroy_parallel()
    return out


@pytest.fixture(scope="module")
def two_rank_results():
    from util import run_ranks

    return run_ranks(_two_rank_worker, 2, timeout_s=90)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CONFIGS))
def test_tp2_names_shapes_and_init(two_rank_results, key):
    from full_tensors import init_full_state_dict

    r0, r1 = (r[key] for r in two_rank_results)
    assert r0["local"] == r0["want_local"] == r1["local"]
    _assert_close_dicts(r0["full"], init_full_state_dict(_cfg(key), SEED), 0.0, "tp=2 init")
    _assert_close_dicts(r1["full"], r0["full"], 0.0, "full state dict on both ranks")
    assert r0["roundtrip"] == 0.0 and r1["roundtrip"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CONFIGS))
def test_tp2_loss_and_grads_equal_tp1(two_rank_results, key):
    r0, r1 = (r[key] for r in two_rank_results)
    ref = r0["ref"]
    assert r0["loss"] == r1["loss"]
    assert abs(r0["loss"] - ref["loss"]) <= 1e-5 * abs(ref["loss"])
    _assert_close_dicts(r0["grads"], ref["grads"], 1e-5, "tp=2 vs tp=1 grads")
    _assert_close_dicts(r1["grads"], r0["grads"], 0.0, "tp=2 full grads on both ranks")
    # q/k-norm grads really are partial per TP rank (the executor must sum them)
    for n, g in r0["partial"].items():
        assert _rel(g + r1["partial"][n], ref["grads"][n]) <= 1e-5
        assert _rel(g, ref["grads"][n]) > 1e-3, n


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CONFIGS))
def test_tp2_rank_local_fused_splits(two_rank_results, key):
    for r in two_rank_results:
        assert max(r[key]["split_err"].values()) < 1e-6, r[key]["split_err"]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CONFIGS))
def test_dp2_equals_dp1(two_rank_results, key):
    r0, r1 = (r[key] for r in two_rank_results)
    ref = r0["ref"]
    assert r0["dp_loss"] == r1["dp_loss"]
    assert abs(r0["dp_loss"] - ref["loss"]) <= 1e-5 * abs(ref["loss"])
    _assert_close_dicts(r0["dp_grads"], ref["grads"], 1e-5, "dp=2 vs dp=1 grads")


def _failing_worker(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("boom from rank one")
    return rank


@pytest.mark.slow
def test_run_ranks_reports_child_traceback():
    from util import ChildError, run_ranks

    with pytest.raises(ChildError, match=r"(?s)rank 1:.*_failing_worker.*ValueError: boom from rank one"):
        run_ranks(_failing_worker, 2, timeout_s=30)
