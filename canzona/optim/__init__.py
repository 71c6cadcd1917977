"""Optimizer maths (no ranks, no process groups): update rules, their registry, and the shared
apply step. `canzona.optim.registry` lists the optimizers; `canzona.optim.owner` is what an
owner of whole tensors (or flat shards) runs."""

from canzona.optim.adamw import AdamW, fused_adamw_step
from canzona.optim.muon import Muon, lr_scale
from canzona.optim.newton_schulz import newton_schulz
from canzona.optim.registry import NAMES, REGISTERED, get, learning_rate, make_rule
from canzona.optim.rule import OptimizerDef, Option, UpdateRule, apply_update
from canzona.optim.shampoo import Shampoo
from canzona.optim.soap import SOAP

__all__ = [
    "NAMES",
    "REGISTERED",
    "SOAP",
    "AdamW",
    "Muon",
    "Option",
    "OptimizerDef",
    "Shampoo",
    "UpdateRule",
    "apply_update",
    "fused_adamw_step",
    "get",
    "learning_rate",
    "lr_scale",
    "make_rule",
    "newton_schulz",
]
