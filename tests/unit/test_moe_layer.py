"""The MoE layer on one rank (ep=1, no process group): routing as Qwen3 routes, the layer's output
against a token-by-token reference, zero grads for experts without tokens, and balanced routing's
split sizes independent of the data (it runs on fake tensors, which have no values to read)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from canzona.inventory import model_config
from canzona.model.moe import MoELayer, balanced_choice, balanced_counts

CFG = model_config("qwen3-30b-a3b", width_div=32, num_layers=1, num_experts=4, top_k=2)  # hidden 64, ffn 24


def _layer(seed: int = 0, **kw) -> MoELayer:
    layer = MoELayer(CFG, torch.float32, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
    return layer


def _reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's Qwen3-MoE block, token by token: softmax over all experts, top-k of the
    probabilities, renormalised, each chosen expert's gate/up (fc1's even/odd rows) and down."""
    probs = F.softmax(x @ layer.router.weight.T, dim=-1)
    top, idx = probs.topk(CFG.top_k, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for p, e in zip(top[t], idx[t].tolist()):
            fc1 = getattr(layer.experts.linear_fc1, f"weight{e}")
            fc2 = getattr(layer.experts.linear_fc2, f"weight{e}")
            out[t] += p * (F.silu(x[t] @ fc1[0::2].T) * (x[t] @ fc1[1::2].T)) @ fc2.T
    return out


def test_names_follow_the_inventory() -> None:
    names = [n for n, _ in _layer().named_parameters()]
    assert names == ["router.weight", *(f"experts.linear_fc1.weight{e}" for e in range(4)),
                     *(f"experts.linear_fc2.weight{e}" for e in range(4))]


def test_output_equals_token_by_token_reference() -> None:
    layer = _layer()
    x = torch.randn(2, 7, CFG.hidden, generator=torch.Generator().manual_seed(1))
    got = layer(x)
    want = _reference(layer, x.reshape(-1, CFG.hidden)).view_as(x)
    assert got.shape == x.shape
    assert ((got - want).norm() / want.norm()).item() < 1e-6
    probs, chosen = layer.route(x.reshape(-1, CFG.hidden))
    assert torch.allclose(probs.sum(-1), torch.ones(14)) and probs.dtype == torch.float32
    assert chosen.shape == (14, CFG.top_k) and len(set(chosen.flatten().tolist())) == 4


def test_experts_without_tokens_get_zero_grads() -> None:
    layer = _layer()
    with torch.no_grad():  # logits (2a, a, -a, -a) for a = x[:, 0] > 0: experts 0 and 1 only
        layer.router.weight.zero_()
        layer.router.weight[:, 0] = torch.tensor([2.0, 1.0, -1.0, -1.0])
    x = torch.randn(10, CFG.hidden, generator=torch.Generator().manual_seed(2))
    x[:, 0] = x[:, 0].abs() + 0.1
    layer(x).square().sum().backward()
    for n, p in layer.named_parameters():
        assert p.grad is not None, n
        unused = n.endswith(("weight2", "weight3"))
        assert (p.grad.abs().max().item() == 0.0) == unused, n


def test_balanced_routing_split_sizes_do_not_depend_on_data() -> None:
    assert balanced_counts(6, 2, 4) == [3, 3, 3, 3] and balanced_counts(5, 2, 4) == [3, 3, 2, 2]
    chosen = balanced_choice(6, 2, 4, "cpu")
    assert all(len(set(row)) == 2 for row in chosen.tolist())
    assert torch.bincount(chosen.flatten()).tolist() == [3, 3, 3, 3]
    layer = _layer(balanced_routing=True)
    splits = []
    for seed in (3, 4):
        chosen = layer.route(torch.randn(6, CFG.hidden, generator=torch.Generator().manual_seed(seed)))[1]
        splits.append(layer._counts(chosen))
    assert splits[0] == splits[1] == ([3, 3, 3, 3], [3, 3, 3, 3])
    with FakeTensorMode():  # no value is read on the host
        fake = MoELayer(CFG, torch.float32, balanced_routing=True)
        x = torch.empty(2, 3, CFG.hidden, requires_grad=True)
        fake(x).sum().backward()
        assert x.grad.shape == x.shape
        assert all(p.grad is not None for p in fake.parameters())
