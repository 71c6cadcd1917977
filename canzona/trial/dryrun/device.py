"""What a fake CUDA device still has to answer: host-side queries and the kernel choices of torch.

With `canzona.trial.dryrun.fakecuda` loaded, fake CUDA tensors compute shapes and autograd runs,
but three things a rank does on a real GPU have no fake counterpart:

- **device queries** (``torch.cuda.current_device``, ``get_device_capability`` -- which
  ``torch.distributed.broadcast`` asks --, ``device_count``, ``set_device``, ``synchronize``)
  go to the CUDA runtime a CPU-only torch lacks: `emulate_queries` answers them for one device
  of compute capability 9.0 (H100 / H200);
- **values read back to the host** (``float(t)``, ``t.item()``): a fake tensor has no values.
  The harness reads one per step, the global gradient norm for clipping; `DeviceFunctions`
  answers every such read of a floating-point fake tensor with `HOST_SCALAR` (1e6: a norm far
  above any ``optimizer.clip_grad``, so clipping takes the branch that scales the gradients);
- **fused kernels chosen at run time**: ``F.scaled_dot_product_attention`` picks its kernel from
  the device, and on a fake tensor torch falls back to the math path, which materialises the
  [batch, heads, seq, seq] score matrix in fp32 (512 MiB a layer for a Qwen3-32B rank at TP 8
  and 4096 tokens, kept for backward). On an
  sm80+ GPU torch runs FlashAttention for these bf16 shapes (memory-efficient attention for
  fp32), which keeps only the output and the log-sum-exp for backward; `DeviceFunctions` calls
  that kernel's op, whose fake implementation and autograd formula torch provides, so the
  activations are those of the GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

HOST_SCALAR = 1.0e6
CAPABILITY = (9, 0)
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def emulate_queries() -> None:
    """Answer the CUDA runtime queries of one device (index 0, capability `CAPABILITY`)."""
    cuda = torch.cuda
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.get_device_capability = lambda device=None: CAPABILITY
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None


class DeviceFunctions(TorchFunctionMode):
    """Host reads and SDPA's kernel choice of fake CUDA tensors, as on the GPU (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention or func is torch._C._nn.scaled_dot_product_attention:
            fused = _fused_attention(*args, **kwargs)
            if fused is not None:
                return fused
        elif func is torch.Tensor.__float__ or func is torch.Tensor.item:
            t = args[0]
            if isinstance(t, FakeTensor) and t.is_floating_point():
                return HOST_SCALAR
        return func(*args, **kwargs)


def _fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """The FlashAttention (or, in fp32, memory-efficient) op torch's CUDA SDPA would run, or None
    for inputs it would not run them on (a mask, dropout, GQA left to SDPA, odd head dims)."""
    if not isinstance(query, FakeTensor) or query.device.type != "cuda":
        return None
    if attn_mask is not None or dropout_p or enable_gqa or query.shape[1] != key.shape[1]:
        return None
    head_dim = query.shape[-1]
    if head_dim % 8 or head_dim > 256:
        return None
    if query.dtype in _FLASH_DTYPES:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, is_causal, False, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, query.requires_grad, 0.0, is_causal, scale=scale)[0]
