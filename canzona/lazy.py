"""Package attributes imported on first use (PEP 562): what keeps a light import light.

``canzona.model`` re-exports names of megatron-core modules (seconds to import) and
``canzona.optim`` names of torch modules, while the config schema and the command lines import
only their torch-free parts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.<names[name]>`` when ``name`` is first read."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{names[name]}"), name)

    return __getattr__
