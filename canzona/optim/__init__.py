"""Optimizer maths (no ranks, no process groups): update rules and the shared apply step."""

from canzona.optim.adamw import AdamW
from canzona.optim.base import UpdateRule, apply_update, group_by_shape, learning_rate, make_rule
from canzona.optim.muon import Muon, lr_scale
from canzona.optim.newton_schulz import newton_schulz
from canzona.optim.shampoo import Shampoo
from canzona.optim.soap import SOAP

__all__ = [
    "SOAP",
    "AdamW",
    "Muon",
    "Shampoo",
    "UpdateRule",
    "apply_update",
    "group_by_shape",
    "learning_rate",
    "lr_scale",
    "make_rule",
    "newton_schulz",
]
