"""Qwen3 built from megatron-core TP layers (``qwen3``), process groups (``parallel``) and
synthetic data (``data``).

Names are resolved lazily: importing megatron-core takes several seconds, so
``canzona.model.data`` (and anything that only needs it) does not pay for it.
"""

from __future__ import annotations

from canzona.lazy import exports

_EXPORTS = {
    "MoELayer": "moe",
    "Qwen3Model": "qwen3",
    "RMSNorm": "qwen3",
    "build_model": "qwen3",
    "full_state_dict": "qwen3",
    "init_shard": "qwen3",
    "ParallelContext": "parallel",
    "init_parallel": "parallel",
    "current_context": "parallel",
    "destroy_parallel": "parallel",
    "synthetic_batch": "data",
}

__all__ = sorted(_EXPORTS)

__getattr__ = exports(__name__, _EXPORTS)
