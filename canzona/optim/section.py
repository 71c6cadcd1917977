"""The ``optimizer`` section of a trial config, built from the optimizer registry.

The flat ``optimizer.*`` keys are the common ones (name, lr, weight_decay, clip_grad) plus every
registered optimizer's options (`canzona.optim.registry`), so a new optimizer's keys need no
edit anywhere else. It lives here, not in `canzona.config`, so that the cost models, the
hardware descriptions and the optimizer maths can build one without importing the trial config.
"""

from __future__ import annotations

from dataclasses import make_dataclass

from canzona.optim import registry

OptimizerSection = make_dataclass(
    "OptimizerSection",
    registry.section_fields(),
    namespace={"__module__": __name__, "__doc__": "The optimizer section: one field per registered option."},
)
