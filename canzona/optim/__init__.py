"""Optimizer maths (no ranks, no process groups): update rules, their registry, and the shared
apply step. `canzona.optim.registry` lists the optimizers; `canzona.optim.owner` is what an
owner of whole tensors (or flat shards) runs.

The names below are imported on first use (PEP 562), so that importing the registry or the
config schema (`canzona.optim.definitions`, `canzona.optim.spec`) does not import torch.
Newton–Schulz is `canzona.optim.newton_schulz.newton_schulz` (the package attribute of that name
is its module).
"""

from __future__ import annotations

from canzona.lazy import exports

_EXPORTS = {
    "AdamW": "adamw",
    "fused_adamw_step": "adamw",
    "Muon": "muon",
    "lr_scale": "muon",
    "NAMES": "registry",
    "REGISTERED": "registry",
    "get": "registry",
    "learning_rate": "registry",
    "make_rule": "registry",
    "OptimizerDef": "spec",
    "Option": "spec",
    "UpdateRule": "rule",
    "apply_update": "rule",
    "Shampoo": "shampoo",
    "SOAP": "soap",
}

__all__ = sorted(_EXPORTS)

__getattr__ = exports(__name__, _EXPORTS)
