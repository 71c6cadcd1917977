"""The overlapped parameter gather (docs/design.md §6): every bucket's gather is waited for
before the forward first uses any of its params, and the chain dispatches the buckets in that
order. Registration order is not forward order (megatron-core registers linear_proj first and
runs it after linear_qkv), and a strategy's own buffer mixes layers in a bucket."""

from __future__ import annotations

import pytest

from canzona.config import load_config
from canzona.plan.from_config import make_plan
from canzona.plan.registry import PRESETS
from canzona.program.actions import BucketGather, Forward
from canzona.program.lower import forward_positions, lower


def test_linear_proj_is_used_after_the_rest_of_its_attention() -> None:
    cfg = load_config(["model.width_div=16", "model.num_layers=2"])
    params = make_plan(cfg, device="cpu").params
    pos = forward_positions(params)
    name = {p.name: pos[i] for i, p in enumerate(params)}
    for layer in range(2):
        a = f"decoder.layers.{layer}.self_attention"
        assert name[f"{a}.linear_qkv.weight"] < name[f"{a}.k_layernorm.weight"] < name[f"{a}.linear_proj.weight"]
        assert name[f"{a}.linear_proj.weight"] < name[f"decoder.layers.{layer}.pre_mlp_layernorm.weight"]
    assert sorted(pos) == list(range(len(params)))


@pytest.mark.parametrize("method", [m for m in PRESETS if m != "sync"])
@pytest.mark.parametrize("layout", [(2, 1), (4, 2)])
def test_each_bucket_is_gathered_before_its_first_use(method: str, layout: tuple[int, int]) -> None:
    dp, tp = layout
    cfg = load_config([f"method={method}", f"parallel.dp={dp}", f"parallel.tp={tp}", "model.width_div=16",
                       "model.num_layers=4", "bucket.size=20000", "planner.cost=numel"])
    plan = make_plan(cfg, device="cpu")
    pos = forward_positions(plan.params)
    for program in lower(plan):
        forward = next(a for a in program.actions if isinstance(a, Forward))
        if not forward.waits:
            continue
        waited = [pos[w.param] for w in forward.waits]
        assert waited == sorted(waited)  # the chain runs in forward order
        gathers = {g.tag: g for g in (*(x.then for x in forward.waits), *program.prologue)
                   if isinstance(g, BucketGather)}
        for w in forward.waits:
            if w.tag not in gathers:  # layerwise: one gather of the owned params, waited for once
                assert len(forward.waits) == 1
                continue
            gather = gathers[w.tag]
            first = min(pos[s.index] for s in plan.layout.buckets[gather.bucket].params)
            assert pos[w.param] == first, (method, w.tag)
